"""The behaviour measure of the value studies: which option a model picks in forced-choice items, read from the
next-token logits of the option letters (never from generations), with or without interventions.

    rates = forced_choice(model, items)                          # no intervention
    rates = forced_choice(model, items, steering.AddVector(...))
    rates.rate()        # {"rate", "k", "n", "ci95"}: how often the pole's option was chosen (Wilson interval)
    rates.p_pole.mean() # the pole's probability renormalised over the letters (a continuous version)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from interp.chat import has_chat_template
from interp.evals.choice import letter_ids, option_logprobs
from interp.evals.rates import rate
from interp.forward import batches, prepare
from interp.models import Model
from interp.studies.directions.values_data import ChoiceItem
from steering.sweep import logits_under


@dataclass
class ChoiceRates:
    """Option log-probabilities ``logp [n, 2]`` (renormalised over the two letters) of ``n`` items whose pole
    option is ``pole_index [n]``."""

    logp: torch.Tensor
    pole_index: torch.Tensor
    item_ids: list[str]

    @property
    def p_pole(self) -> torch.Tensor:
        """Probability of the pole's option, ``[n]``."""
        return self.logp.gather(1, self.pole_index[:, None])[:, 0].exp()

    @property
    def chose_pole(self) -> torch.Tensor:
        """Whether each item's chosen letter (the larger probability) is the pole's, ``[n]`` bool."""
        return self.logp.argmax(-1) == self.pole_index

    def rate(self) -> dict[str, Any]:
        """How often the pole's option was chosen, with its count and Wilson 95% interval."""
        return rate(self.chose_pole.tolist())


def resolve_chat(model: Model, chat: bool | None) -> bool:
    """``chat=None``: use the chat template when the tokenizer has one (Gemma 3 270M has none: plain prompts)."""
    return has_chat_template(model) if chat is None else bool(chat)


def check_items(model: Model, items: Sequence[ChoiceItem], balanced: bool = False) -> list[list[int]]:
    """The letters' token ids for ``items`` (one letter pair shared by all); refuses letters that are not single
    tokens, and (``balanced``) a set that puts the pole under one letter more than half the time plus one."""
    items = list(items)
    if not items or not all(isinstance(i, ChoiceItem) for i in items):
        raise TypeError("items must be a non-empty list of ChoiceItem (see values_data.dilemma_items / statement_items)")
    letters = {i.letters for i in items}
    if len(letters) != 1:
        raise ValueError(f"items use different option letters {sorted(letters)}; build them with one letters= pair")
    if balanced:
        on_first = sum(1 for i in items if i.pole_index == 0)
        if abs(2 * on_first - len(items)) > 1:
            raise ValueError(f"the pole's option is under letter {items[0].letters[0]!r} in {on_first} of "
                             f"{len(items)} items; balance the letters (dilemma_items alternates them) so a shift "
                             f"toward one letter cannot pass for a shift toward the pole")
    return letter_ids(model.tokenizer, items[0].letters)


def forced_choice(model: Model, items: Sequence[ChoiceItem], *interventions: Any, chat: bool | None = None,
                  batch_size: int = 16) -> ChoiceRates:
    """The option chosen in each item from the next-token logits at its last prompt token, with
    ``interventions`` applied (``steering.apply``) to the whole prompt."""
    ids = check_items(model, items)
    logits = choice_logits(model, items, interventions, resolve_chat(model, chat), batch_size)
    return ChoiceRates(option_logprobs(logits, ids), torch.tensor([i.pole_index for i in items]),
                       [i.id for i in items])


def choice_logits(model: Model, items: Sequence[ChoiceItem], interventions: Sequence[Any], chat: bool,
                  batch_size: int) -> torch.Tensor:
    """Next-token logits ``[n, vocab]`` of the items' prompts under ``interventions``."""
    _, encs = prepare(model, [i.prompt(chat) for i in items], chat=chat)
    return logits_under(model, batches(model, encs, batch_size), interventions)


class PoleMetric:
    """A logit metric for ``steering.alpha_sweep(on="logits")``: the pole rate of ``items``; every call's per-item
    :class:`ChoiceRates` is kept in ``calls`` (in the order the sweep ran its conditions)."""

    __name__ = "pole_rate"

    def __init__(self, ids: list[list[int]], items: Sequence[ChoiceItem]):
        self.ids = ids
        self.pole_index = torch.tensor([i.pole_index for i in items])
        self.item_ids = [i.id for i in items]
        self.calls: list[ChoiceRates] = []

    def __call__(self, logits: torch.Tensor) -> float:
        r = ChoiceRates(option_logprobs(logits, self.ids), self.pole_index, self.item_ids)
        self.calls.append(r)
        return float(r.chose_pole.float().mean())


__all__ = ["ChoiceRates", "PoleMetric", "check_items", "choice_logits", "forced_choice", "resolve_chat"]
