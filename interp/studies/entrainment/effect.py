"""The entrainment effect: how much a token's logit and probability at the last prompt position rise when it
appeared in a distracting context before the question, against the same token with another item's context of
the same kind (:mod:`interp.studies.entrainment.data`), per context kind, with bootstrap intervals over items.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

import steering
from interp.bundle import Result
from interp.evals.bootstrap import mean_interval
from interp.models import Model
from interp.readout import logits as read_logits
from interp.studies.entrainment.data import ContextPairs, EntrainmentSet, first_token, make_pairs

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class KindScores:
    """One kind's per-pair scores ``[m]`` of the tracked token: ``logit`` / ``prob`` with the word ``present`` and
    ``absent``; ``items [m]``: indices into the set."""

    kind: str
    present_logit: torch.Tensor
    absent_logit: torch.Tensor
    present_prob: torch.Tensor
    absent_prob: torch.Tensor
    items: list[int]

    @property
    def logit_gain(self) -> torch.Tensor:
        return self.present_logit - self.absent_logit

    @property
    def prob_gain(self) -> torch.Tensor:
        return self.present_prob - self.absent_prob


def next_token_logits(model: Model, texts: Sequence[str], edits: Sequence[Any] = (), chat: bool = False,
                      batch_size: int = 16) -> torch.Tensor:
    """``[n, vocab]`` next-token logits at the last prompt token, under ``edits`` (``steering.apply``)."""
    with steering.apply(model, *edits):
        return read_logits(model, list(texts), "last", chat=chat, batch_size=batch_size)


def score_pairs(model: Model, pairs: ContextPairs, edits: Sequence[Any] = (), chat: bool = False,
                batch_size: int = 16) -> KindScores:
    """The tracked token's logit and probability on the present and absent prompts of ``pairs``."""
    got = []
    for texts in (pairs.present, pairs.absent):
        lg = next_token_logits(model, texts, edits, chat, batch_size)
        rows = torch.arange(len(lg))
        got += [lg[rows, pairs.token], lg.softmax(-1)[rows, pairs.token]]
    return KindScores(pairs.kind, got[0], got[2], got[1], got[3], list(pairs.items))


def clean_correct(model: Model, data: EntrainmentSet, edits: Sequence[Any] = (), chat: bool = False,
                  batch_size: int = 16) -> torch.Tensor:
    """``[n]`` 1.0 where the question alone (no context) puts the answer's first token on top, else 0.0."""
    lg = next_token_logits(model, data.questions, edits, chat, batch_size)
    answers = torch.tensor([first_token(model, a) for a in data.answers])
    return (lg.argmax(-1) == answers).float()


@dataclass
class EntrainmentEffect(Result):
    """Per kind the :class:`KindScores` of every usable pair; ``correct [n]``: the clean (no context) accuracy per
    item; ``n_boot`` / ``seed`` of the intervals."""

    model_id: str
    kinds: dict[str, KindScores]
    correct: torch.Tensor
    n_boot: int = 2000
    seed: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def gains(self) -> dict[str, dict[str, dict[str, float]]]:
        """``{kind: {"logit": {mean, lo, hi, p}, "prob": {...}}}``: the mean gain with its 95% interval over items
        and the one-sided bootstrap p of no gain."""
        return {k: {"logit": mean_interval(s.logit_gain, self.n_boot, self.seed),
                    "prob": mean_interval(s.prob_gain, self.n_boot, self.seed)} for k, s in self.kinds.items()}

    def counterfactual_vs_factual(self) -> dict[str, Any] | None:
        """Logit gain counterfactual minus factual, paired by item (``None`` unless both kinds were measured)."""
        if not {"counterfactual", "factual"} <= self.kinds.keys():
            return None
        cf, fa = self.kinds["counterfactual"], self.kinds["factual"]
        both = sorted(set(cf.items) & set(fa.items))
        d = torch.stack([cf.logit_gain[cf.items.index(i)] - fa.logit_gain[fa.items.index(i)] for i in both])
        out: dict[str, Any] = {"n": len(both), **mean_interval(d, self.n_boot, self.seed)}
        out["counterfactual_entrains_more"] = bool(out["lo"] > 0)
        return out

    def summary(self) -> dict[str, Any]:
        """The gains per kind, counterfactual vs factual, clean accuracy and the pair counts."""
        return {"model_id": self.model_id, "gains": self.gains(), "counterfactual_vs_factual":
                self.counterfactual_vs_factual(), "clean_accuracy": float(self.correct.mean()),
                "n_items": len(self.correct), "n_pairs": {k: len(s.items) for k, s in self.kinds.items()}}

    def to_frame(self) -> pd.DataFrame:
        """One row per kind and pair: ``kind``, ``item``, logits and probabilities present / absent, gains."""
        import pandas as pd

        return pd.DataFrame([{"kind": k, "item": i, "present_logit": float(s.present_logit[j]),
                              "absent_logit": float(s.absent_logit[j]), "logit_gain": float(s.logit_gain[j]),
                              "present_prob": float(s.present_prob[j]), "absent_prob": float(s.absent_prob[j]),
                              "prob_gain": float(s.prob_gain[j])}
                             for k, s in self.kinds.items() for j, i in enumerate(s.items)])

    def plot(self, what: str = "logit", title: str | None = None) -> Any:
        """Bars of the mean ``logit`` (or ``prob``) gain per kind with 95% bootstrap intervals."""
        from interp.viz.finetune import method_rates

        g = self.gains()
        bars = {k: (v[what]["mean"], v[what]["lo"], v[what]["hi"]) for k, v in g.items()}
        return method_rates(bars, f"{what} gain (present - absent)",
                            title or f"contextual entrainment on {self.model_id}")


def entrainment_effect(model: Model, data: EntrainmentSet, kinds: Sequence[str], chat: bool = False,
                       n_boot: int = 2000, seed: int = 0, batch_size: int = 16) -> EntrainmentEffect:
    """Score every kind's pairs and the clean questions (see the module docstring)."""
    scores = {k: score_pairs(model, make_pairs(model, data, k), (), chat, batch_size) for k in kinds}
    return EntrainmentEffect(model.name, scores, clean_correct(model, data, (), chat, batch_size), n_boot, seed,
                             {"chat": chat})


__all__ = ["EntrainmentEffect", "KindScores", "clean_correct", "entrainment_effect", "next_token_logits",
           "score_pairs"]
