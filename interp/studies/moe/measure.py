"""Refusal removed as a fraction of the baseline, with bootstrap intervals over prompts, and the category subspaces.

The score is the first response token's refusal log-odds (:func:`interp.evals.logits.refusal_score`) at each
harmful test prompt. The fraction removed by a condition is ``(S_base - S_cond) / (S_base - S_harmless)`` with
``S`` the mean score: 0 leaves refusal as it is, 1 brings the harmful prompts down to the harmless prompts' level.
Intervals: percentile bootstrap, the harmful prompts resampled jointly across conditions (paired) and the harmless
ones apart. The joint-only share ``1 - sum(alone) / joint`` is read off the same resamples (the harmless level
cancels in it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from interp.capturing import capture
from interp.chat import Encoded
from interp.evals.bootstrap import percentile_interval, resample_ids
from interp.evals.logits import refusal_score
from interp.models import Model
from interp.studies.kit.scoring import prompt_logits
from interp.values import Runtime


def scores(model: Model, encs: Sequence[Encoded], edits: Sequence[Any], tokens: Sequence[int],
           batch_size: int = 16) -> torch.Tensor:
    """Per-prompt refusal score ``[n]`` of the next token after each prompt, with ``edits`` applied."""
    return refusal_score(prompt_logits(model, list(encs), *edits, batch_size=batch_size), list(tokens)).double()


class Removal:
    """Bootstrap of the fraction of refusal removed, one set of resamples shared by every condition."""

    def __init__(self, base: torch.Tensor, harmless: torch.Tensor, n_boot: int, seed: int) -> None:
        self.base, self.harmless = base.double(), harmless.double()
        self.idx = resample_ids(len(base), n_boot, seed)
        self.idx_h = resample_ids(len(harmless), n_boot, seed + 1)
        gap = float(self.base.mean() - self.harmless.mean())
        if not gap > 0:
            raise ValueError(f"the harmful prompts' mean refusal score ({float(self.base.mean()):.3f}) is not above the "
                             f"harmless prompts' ({float(self.harmless.mean()):.3f}): there is no refusal to remove; "
                             f"check the refusal tokens and that the model refuses the harmful prompts")
        self.gap = gap
        self.boot_gap = self.base[self.idx].mean(1) - self.harmless[self.idx_h].mean(1)

    def drop(self, cond: torch.Tensor) -> tuple[float, torch.Tensor]:
        """Mean score drop and its resamples."""
        c = cond.double()
        return float(self.base.mean() - c.mean()), (self.base - c)[self.idx].mean(1)

    def fraction(self, cond: torch.Tensor) -> dict[str, float]:
        """``{removed, lo, hi, score}``: the fraction removed with its 95% interval and the condition's mean score."""
        d, boot = self.drop(cond)
        lo, hi = percentile_interval(boot / self.boot_gap)
        return {"removed": d / self.gap, "lo": float(lo), "hi": float(hi), "score": float(cond.double().mean())}

    def joint_only(self, alone: Sequence[torch.Tensor], joint: torch.Tensor) -> dict[str, float]:
        """``1 - sum(alone drops) / joint drop`` with its interval (``share``, ``lo``, ``hi``), and the sum of the
        alone fractions."""
        dj, bj = self.drop(joint)
        parts = [self.drop(a) for a in alone]
        total, btotal = sum(p[0] for p in parts), sum(p[1] for p in parts)
        lo, hi = percentile_interval(1 - btotal / bj)
        slo, shi = percentile_interval(btotal / self.boot_gap)
        return {"share": 1 - total / dj, "lo": float(lo), "hi": float(hi), "sum_alone": total / self.gap,
                "sum_lo": float(slo), "sum_hi": float(shi)}


def category_rows(model: Model, prompts: Sequence[str], categories: Sequence[str], layer: int,
                  runtime: Runtime) -> torch.Tensor:
    """Activations ``[n, d]`` at ``resid_pre`` of ``layer``, last prompt token (the last post-instruction one)."""
    acts = capture(model, list(prompts), sites="resid_pre", positions="last", layers=[layer],
                   runtime=Runtime(batch_size=runtime.batch_size, progress=False))
    return acts.tensor.float().reshape(len(prompts), -1)


def category_bases(acts: torch.Tensor, labels: Sequence[str], wanted: Sequence[str], n_max: int, rank: int,
                   exclude: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Per category: its prompts' activations minus the mean of the other harmful categories' prompts (one
    difference-of-means direction per prompt, at most ``n_max``), and their top-``rank`` right singular vectors
    ``[rank, d]`` (orthonormal; rank 1 is the category's difference of means up to the spread). ``exclude``: a
    unit direction projected out of the differences first, so the subspace is orthogonal to it."""
    lab = list(labels)
    out = {}
    for c in wanted:
        mine = [i for i, x in enumerate(lab) if x == c][:n_max]
        rest = [i for i, x in enumerate(lab) if x != c]
        if len(mine) < rank:
            have = sorted({x for x in lab})
            raise ValueError(f"category {c!r} has {len(mine)} prompts (category directions) but rank {rank} was asked; "
                             f"lower the ranks to <= {len(mine)} or choose categories with more prompts "
                             f"(available: {have})")
        if not rest:
            raise ValueError(f"every prompt is in category {c!r}: there is no other harmful category to contrast it with")
        diffs = acts[mine].double() - acts[rest].double().mean(0)
        if exclude is not None:
            e = exclude.double()
            diffs = diffs - (diffs @ e)[:, None] * e
        _, _, vh = torch.linalg.svd(diffs, full_matrices=False)
        out[c] = vh[:rank].float()
    return out


def overlap(basis: torch.Tensor, r: torch.Tensor) -> float:
    """Norm of the unit direction ``r``'s projection into the span of the orthonormal ``basis [k, d]`` (0..1)."""
    return float((basis.double() @ r.double()).norm())


__all__ = ["Removal", "category_bases", "category_rows", "overlap", "scores"]
