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

from interp.evals.choice import letter_ids, option_logprobs
from interp.evals.rates import rate
from interp.forward import batches, prepare
from interp.models import Model
from interp.studies.directions.moved import moved_into
from interp.studies.directions.values_data import ChoiceItem
from interp.values import Runtime, moved_keywords
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


ALPHAS = (-1.0, -0.5, 0.5, 1.0)
LETTERS = ("A", "B")


@dataclass(frozen=True)
class ValueStudyConfig:
    """The value studies' tuning knobs: the capture ``site`` / ``positions``, the split ``fractions`` (fit,
    calibration, test), ``n_folds`` of the held-out fit, the layer rule's ``select_alpha`` / ``top_k``, the steering
    ``alphas`` and ``n_random`` controls, option ``letters``, ``max_items`` (calibration, test; ``None``: all) and
    ``chat`` (the model's chat template; ``False``: plain prompts ending in the item's cue)."""

    site: str = "resid_post"
    positions: str = "last"
    fractions: tuple[float, ...] = (0.5, 0.2, 0.3)
    n_folds: int = 5
    select_alpha: float = 0.5
    top_k: int = 3
    alphas: tuple[float, ...] = ALPHAS
    n_random: int = 3
    letters: tuple[str, str] = LETTERS
    max_items: tuple[int | None, int | None] = (None, None)
    chat: bool = True

    def __post_init__(self) -> None:
        for name in ("fractions", "alphas", "letters", "max_items"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if len(self.fractions) != 3 or any(f < 0 for f in self.fractions) or abs(sum(self.fractions) - 1) > 1e-6:
            raise ValueError(f"fractions must be three non-negative parts (fit, calibration, test) summing to 1, "
                             f"got {self.fractions}")
        if self.n_folds < 2 or self.top_k < 1 or self.n_random < 0 or self.select_alpha <= 0:
            raise ValueError(f"need n_folds >= 2, top_k >= 1, n_random >= 0 and select_alpha > 0, got n_folds="
                             f"{self.n_folds}, top_k={self.top_k}, n_random={self.n_random}, "
                             f"select_alpha={self.select_alpha}")
        if len(self.letters) != 2 or len(self.max_items) != 2 or not self.alphas:
            raise ValueError(f"need two letters, max_items as (calibration, test) and at least one alpha, got "
                             f"letters={self.letters}, max_items={self.max_items}, alphas={self.alphas}")
        if not isinstance(self.chat, bool):
            raise TypeError(f"chat must be True or False, got {self.chat!r}")


VALUE_MOVED = moved_into(ValueStudyConfig)
"""The keywords the value studies took before ``config=`` / ``runtime=``, and where each went."""
CHAT_MOVED = moved_into(ValueStudyConfig, ["chat"])
"""The same for the measures that take only ``chat`` from the config (:func:`forced_choice`, ``select_layers``)."""


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


@moved_keywords(CHAT_MOVED)
def forced_choice(model: Model, items: Sequence[ChoiceItem], *interventions: Any,
                  config: ValueStudyConfig | None = None, runtime: Runtime | None = None) -> ChoiceRates:
    """The option chosen in each item from the next-token logits at its last prompt token, with
    ``interventions`` applied (``steering.apply``) to the whole prompt; ``config.chat``: the chat template."""
    ids = check_items(model, items)
    cfg, run = config or ValueStudyConfig(), Runtime.of(runtime)
    logits = choice_logits(model, items, interventions, cfg.chat, run.batch_size)
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


__all__ = ["CHAT_MOVED", "ChoiceRates", "PoleMetric", "VALUE_MOVED", "ValueStudyConfig", "check_items", "choice_logits", "forced_choice"]
