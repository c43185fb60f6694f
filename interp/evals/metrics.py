"""Batched scores of projections / logits: AUROC (tie-aware), accuracy, Cohen's d, over any leading batch; the Wilson
interval of a rate.

All functions take ``scores [..., n]`` (one row per layer/fold/...) and binary labels ``y [n]`` (0/1).
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int


def _check(scores: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if scores.shape[-1] != y.shape[-1]:
        raise ValueError(f"scores have {scores.shape[-1]} samples but y has {y.shape[-1]}")
    y = y.to(torch.long)
    if y.min() < 0 or y.max() > 1:
        raise ValueError("these metrics need binary labels coded 0/1")
    return y


def average_ranks(scores: Float[torch.Tensor, "... n"]) -> Float[torch.Tensor, "... n"]:
    """Ranks 1..n along the last axis, ties sharing their average rank (as scipy.stats.rankdata)."""
    s = scores.double()
    flat = s.reshape(-1, s.shape[-1])
    b, n = flat.shape
    sv, order = flat.sort(dim=-1)
    new_run = torch.ones_like(sv, dtype=torch.bool)
    new_run[:, 1:] = sv[:, 1:] != sv[:, :-1]
    run_id = new_run.long().cumsum(-1) - 1                      # [b, n], runs numbered per row
    offset = (torch.arange(b) * n)[:, None]
    gid = (run_id + offset).reshape(-1)
    pos = torch.arange(1, n + 1, dtype=torch.float64).expand(b, n).reshape(-1)
    total = torch.zeros(b * n, dtype=torch.float64).index_add_(0, gid, pos)
    count = torch.zeros(b * n, dtype=torch.float64).index_add_(0, gid, torch.ones_like(pos))
    avg = (total / count.clamp_min(1))[gid].reshape(b, n)
    ranks = torch.empty_like(avg).scatter_(1, order, avg)
    return ranks.reshape(s.shape)


def spearman(a: Float[torch.Tensor, "... n"], b: Float[torch.Tensor, "... n"]) -> Float[torch.Tensor, "..."]:
    """Spearman rank correlation along the last axis (Pearson correlation of the tie-averaged ranks); nan
    where one side is constant."""
    if a.shape != b.shape:
        raise ValueError(f"spearman needs two tensors of one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(-1, keepdim=True), rb - rb.mean(-1, keepdim=True)
    return ((ra * rb).sum(-1) / (ra.norm(dim=-1) * rb.norm(dim=-1))).float()


def auroc(scores: Float[torch.Tensor, "... n"], y: Int[torch.Tensor, " n"]) -> Float[torch.Tensor, "..."]:
    """Area under the ROC curve of ``scores`` for positive class 1 (Mann-Whitney U / (n1 n0)); 0.5 = chance."""
    y = _check(scores, y)
    n1 = int(y.sum())
    n0 = y.numel() - n1
    if n1 == 0 or n0 == 0:
        raise ValueError("AUROC needs both classes among the evaluated samples; use folds that contain both")
    ranks = average_ranks(scores)
    r1 = (ranks * y.double()).sum(-1)
    return ((r1 - n1 * (n1 + 1) / 2) / (n1 * n0)).float()


def accuracy(scores: Float[torch.Tensor, "... n"], y: Int[torch.Tensor, " n"],
             threshold: float | torch.Tensor = 0.0) -> Float[torch.Tensor, "..."]:
    """Fraction with ``(scores > threshold) == y``; ``threshold`` broadcasts against ``scores[..., 0]``."""
    y = _check(scores, y)
    thr = torch.as_tensor(threshold, dtype=scores.dtype)
    if thr.dim() > 0:
        thr = thr[..., None]
    return ((scores > thr).long() == y).float().mean(-1)


def cohens_d(scores: Float[torch.Tensor, "... n"], y: Int[torch.Tensor, " n"]) -> Float[torch.Tensor, "..."]:
    """(mean of class 1 - mean of class 0) / pooled standard deviation (Bessel-corrected within class)."""
    y = _check(scores, y)
    s = scores.double()
    m1, m0 = y.bool(), ~y.bool()
    n1, n0 = int(m1.sum()), int(m0.sum())
    if n1 < 2 or n0 < 2:
        raise ValueError("Cohen's d needs at least two samples of each class")
    mu1 = s[..., m1].mean(-1)
    mu0 = s[..., m0].mean(-1)
    v1 = s[..., m1].var(-1, unbiased=True)
    v0 = s[..., m0].var(-1, unbiased=True)
    pooled = (((n1 - 1) * v1 + (n0 - 1) * v0) / (n1 + n0 - 2)).sqrt()
    return ((mu1 - mu0) / pooled.clamp_min(1e-12)).float()


def cohens_d_groups(a: Float[torch.Tensor, "... na"], b: Float[torch.Tensor, "... nb"]) -> Float[torch.Tensor, "..."]:
    """Cohen's d of ``b`` over ``a`` for two separate sample sets: (mean b - mean a) / pooled std."""
    y = torch.cat([torch.zeros(a.shape[-1], dtype=torch.long), torch.ones(b.shape[-1], dtype=torch.long)])
    return cohens_d(torch.cat([a, b], -1), y)
