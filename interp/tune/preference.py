"""Preference optimisation as an :class:`~tune.objective.Objective`: DPO and ORPO on (prompt, chosen, rejected).

Both compare sequence log-likelihoods of the chosen and the rejected response (response tokens only, through the
chat template, as :class:`~tune.objective.SFT` trains), so they run in :func:`tune.loop.train_loop` with its seeds,
masks, checkpoints and resumption.

- **DPO** (Rafailov et al. 2023, the sigmoid loss): ``-log sigmoid(beta * ((c - c_ref) - (r - r_ref)))`` per
  pair, ``c`` / ``r`` the summed log-probs of the chosen / rejected response, the reference being the same model
  with its LoRA adapter disabled (so DPO needs ``method="lora"``); the reference's log-probs never change, so each
  pair's are computed once and kept.
- **ORPO** (Hong et al. 2024): the chosen response's token-mean NLL minus ``beta * mean log sigmoid(log odds
  ratio)``, the odds of a response ``p / (1 - p)`` of its per-token mean log-prob ``log p``; no reference.
  (trl's ORPO takes the NLL over prompt and response; here over the response only, as SFT.)

trl's ``DPOTrainer`` / ``ORPOTrainer`` are ``transformers.Trainer`` loops of their own (their own batching, seeds and
checkpoints, and they need the ``datasets`` package), so the two losses are written here and tested against a hand
computation of the formulas.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from interp.io import content_hash
from interp.models import Model
from interp.tune.config import TuneConfig, make_trainable
from interp.tune.data import MOVED, Row, check_pairs, encode_pairs, fingerprint
from interp.tune.loop import Callback, TuneResult, train_loop
from interp.tune.objective import response_logps
from interp.values import Prompts, moved_keywords

KINDS = ("dpo", "orpo")


def dpo_loss(chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor,
             beta: float) -> torch.Tensor:
    """Per pair ``-log sigmoid(beta * ((chosen - ref_chosen) - (rejected - ref_rejected)))`` ``[B]``, from summed
    sequence log-probs ``[B]``."""
    return -F.logsigmoid(beta * ((chosen - ref_chosen) - (rejected - ref_rejected)))


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x < 0``, stable at both ends."""
    return torch.where(x < -0.6931471805599453, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def orpo_loss(chosen: torch.Tensor, n_chosen: torch.Tensor, rejected: torch.Tensor, n_rejected: torch.Tensor,
              beta: float) -> torch.Tensor:
    """ORPO's scalar loss from summed log-probs ``[B]`` and token counts ``[B]``: the chosen token-mean NLL minus
    ``beta * mean log sigmoid(log odds(chosen) - log odds(rejected))`` on per-token mean log-probs."""
    pc, pr = chosen / n_chosen, rejected / n_rejected
    log_odds = (pc - pr) - (log1mexp(pc) - log1mexp(pr))
    return -chosen.sum() / n_chosen.sum() - beta * F.logsigmoid(log_odds).mean()


@dataclass
class Preference:
    """Pairs ``i`` = (``chosen[i]``, ``rejected[i]``), the same prompt; ``kind`` ``"dpo"`` or ``"orpo"``, ``beta``
    the DPO temperature or ORPO's odds-ratio weight."""

    chosen: list[Row]
    rejected: list[Row]
    kind: str = "dpo"
    beta: float = 0.1
    _ref: dict[int, tuple[float, float]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if not self.beta > 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if len(self.chosen) != len(self.rejected) or not self.chosen:
            raise ValueError(f"{len(self.chosen)} chosen and {len(self.rejected)} rejected rows; give one rejected "
                             f"response per chosen one (at least one pair)")
        same = [i for i, (c, r) in enumerate(zip(self.chosen, self.rejected))
                if c.enc.ids[:c.enc.response_start] != r.enc.ids[:r.enc.response_start]]
        if same:
            raise ValueError(f"pair {same[0]}: the chosen and rejected rows have different prompts; a preference "
                             f"pair shares its prompt")

    @property
    def n(self) -> int:
        return len(self.chosen)

    def reference(self, model: Model, idx: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed log-probs of the chosen and rejected responses under the model with its adapter disabled
        (computed once per pair)."""
        todo = [i for i in dict.fromkeys(idx) if i not in self._ref]
        if todo:
            if not hasattr(model.hf, "disable_adapter"):
                raise ValueError("DPO's reference is the model with its LoRA adapter disabled; train with "
                                 "TuneConfig(method='lora'), or use kind='orpo' (no reference) for a full fine-tune")
            with torch.no_grad(), model.hf.disable_adapter():
                sums, _ = response_logps(model, [self.chosen[i] for i in todo] + [self.rejected[i] for i in todo])
            for k, i in enumerate(todo):
                self._ref[i] = (float(sums[k]), float(sums[len(todo) + k]))
        ref = torch.tensor([self._ref[i] for i in idx], dtype=torch.float32)
        return ref[:, 0], ref[:, 1]

    def loss(self, model: Model, idx: Sequence[int]) -> tuple[torch.Tensor, int]:
        rows = [self.chosen[i] for i in idx] + [self.rejected[i] for i in idx]
        sums, counts = response_logps(model, rows)
        B = len(idx)
        if self.kind == "dpo":
            rc, rr = (t.to(sums.device) for t in self.reference(model, idx))
            loss = dpo_loss(sums[:B], sums[B:], rc, rr, self.beta).mean()
        else:
            loss = orpo_loss(sums[:B], counts[:B], sums[B:], counts[B:], self.beta)
        return loss, sum(len(r.enc.ids) for r in rows)

    def fingerprint(self) -> str:
        return content_hash([self.kind, self.beta, fingerprint(self.chosen), fingerprint(self.rejected)])


@moved_keywords(MOVED)
def preference_rows(model: Model, prompts: Prompts | Sequence[str], chosen: Sequence[str], rejected: Sequence[str],
                    kind: str = "dpo", beta: float = 0.1) -> Preference:
    """The :class:`Preference` objective of (prompt, chosen, rejected) triples, tokenised as :func:`tune.fine_tune`
    does."""
    check_pairs(prompts, rejected)
    return Preference(encode_pairs(model, prompts, chosen), encode_pairs(model, prompts, rejected), kind, beta)


@dataclass(frozen=True)
class PreferenceConfig(TuneConfig):
    """A :class:`~tune.config.TuneConfig` with the preference objective: ``kind`` (``"dpo"`` or ``"orpo"``) and its
    ``beta``. Both are in the objective's data fingerprint, so :meth:`record` (what a resumed run must share)
    leaves them out, as a plain fine-tune's record has them not."""

    kind: str = "dpo"
    beta: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")

    def record(self) -> dict[str, Any]:
        out = super().record()
        out.pop("kind")
        out.pop("beta")
        return out


PREFERENCE_MOVED = {**MOVED, "kind": "config=interp.tune.preference.PreferenceConfig(kind=...)",
                    "beta": "config=interp.tune.preference.PreferenceConfig(beta=...)"}


@moved_keywords(PREFERENCE_MOVED)
def preference_tune(model: Model, prompts: Prompts | Sequence[str], chosen: Sequence[str], rejected: Sequence[str],
                    config: TuneConfig = PreferenceConfig(), out: str | os.PathLike | None = None,
                    resume: str | os.PathLike | None = None, progress: bool = True,
                    callback: Callback | None = None) -> TuneResult:
    """Fine-tune ``model`` by DPO or ORPO (``config``: a :class:`PreferenceConfig`; a plain ``TuneConfig`` gets
    DPO at beta 0.1) on (prompt, chosen, rejected) triples; as :func:`tune.fine_tune` for the rest (LoRA leaves
    ``model``'s weights as they were; DPO's reference is ``model`` itself, adapter disabled)."""
    if not isinstance(config, PreferenceConfig):
        config = PreferenceConfig(**asdict(config))
    kind, beta = config.kind, config.beta
    if kind == "dpo" and config.method != "lora":
        raise ValueError("DPO's reference is the model with its LoRA adapter disabled; use TuneConfig(method='lora') "
                         "or kind='orpo'")
    objective = preference_rows(model, prompts, chosen, rejected, kind, beta)
    trainable = make_trainable(model, config)
    return train_loop(trainable, objective, config, out=out, resume=resume, progress=progress, callback=callback)


__all__ = ["KINDS", "Preference", "PreferenceConfig", "dpo_loss", "log1mexp", "orpo_loss", "preference_rows", "preference_tune"]
