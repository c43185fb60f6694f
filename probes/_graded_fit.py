"""The arithmetic of graded directions: fitting a direction through ordered level means, and the statistics
of how the levels line up along it (means, spread, adjacent-level d, order, rank correlation), over layers."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from interp.evals.metrics import average_ranks
from probes._linalg import class_means, top_components

METHODS = ("trend", "extremes", "pca")


def _trend_coefs(counts: torch.Tensor) -> torch.Tensor:
    """Centred level scores ``0..k-1`` (count-weighted mean removed): the linear contrast over levels."""
    idx = torch.arange(len(counts), dtype=torch.float64)
    return idx - (counts * idx).sum() / counts.sum()


def fit_graded(X: torch.Tensor, ylev: torch.Tensor, k: int, method: str) -> torch.Tensor:
    """Raw vectors ``[L, d]`` (float64) through ``k`` ordered levels of ``X [n, L, d]`` (codes ``ylev`` 0..k-1).

    ``trend``: least-squares slope of the activations on the level index (sum_i n_i c_i (mu_i - mu) / sum_i
    n_i c_i^2, with c_i the centred index); it uses every level, and equals ``extremes`` / 2 for two levels or
    three equal-sized ones. ``extremes``: highest level mean minus lowest. ``pca``: first principal axis of the
    count-weighted level means, scaled to the trend's per-level step along it. Every layer's vector is oriented
    low -> high: the projections' linear trend over levels is positive (one rule at every layer).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    mu, counts = class_means(X, ylev, k)                                # [k, L, d], [k]
    grand = (mu * counts[:, None, None]).sum(0) / counts.sum()
    c = _trend_coefs(counts)
    w = counts * c
    trend = torch.einsum("k,kld->ld", w, mu - grand) / (w * c).sum()
    if method == "trend":
        return trend
    if method == "extremes":
        raw = mu[-1] - mu[0]
    else:
        rows = ((mu - grand) * counts.sqrt()[:, None, None]).transpose(0, 1)
        raw = top_components(rows, 1)[0][:, 0].double()                 # unit [L, d]
        raw = raw * (raw * trend).sum(-1, keepdim=True).abs()           # length: per-level step along it
    slope = (raw * trend).sum(-1)                                       # sign of the projections' trend
    return raw * torch.where(slope < 0, -1.0, 1.0)[:, None]


@dataclass
class LevelStats:
    """How ``k`` levels line up along one direction per layer (all float64 / bool, leading axis ``n_layers``)."""

    means: torch.Tensor          # [L, k]
    std: torch.Tensor            # [L, k]
    adjacent_d: torch.Tensor     # [L, k-1]  Cohen's d of level i+1 over level i
    monotonic: torch.Tensor      # [L]       level means increase strictly
    spearman: torch.Tensor       # [L]       rank correlation of projections with level


def level_stats(proj: torch.Tensor, ylev: torch.Tensor, k: int) -> LevelStats:
    """Statistics of projections ``proj [L, n]`` grouped by level codes ``ylev [n]``, all layers in one pass."""
    onehot = torch.nn.functional.one_hot(ylev, k).double()              # [n, k]
    counts = onehot.sum(0)
    if (counts < 2).any():
        raise ValueError(f"every level needs at least two samples here; counts per level: {counts.long().tolist()}")
    p = proj.double()
    means = p @ onehot / counts
    ss = (p ** 2) @ onehot - counts * means ** 2
    var = (ss / (counts - 1)).clamp_min(0)
    pooled = (((counts[:-1] - 1) * var[:, :-1] + (counts[1:] - 1) * var[:, 1:]) / (counts[:-1] + counts[1:] - 2)).sqrt()
    adj = (means[:, 1:] - means[:, :-1]) / pooled.clamp_min(1e-12)
    rs = average_ranks(p)
    rl = average_ranks(ylev.double().expand_as(p))
    rs, rl = rs - rs.mean(-1, keepdim=True), rl - rl.mean(-1, keepdim=True)
    spear = (rs * rl).sum(-1) / (rs.norm(dim=-1) * rl.norm(dim=-1)).clamp_min(1e-12)
    return LevelStats(means=means, std=var.sqrt(), adjacent_d=adj, monotonic=(means[:, 1:] > means[:, :-1]).all(-1),
                      spearman=spear)


def collinearity(X: torch.Tensor, ylev: torch.Tensor, k: int, unit: torch.Tensor) -> torch.Tensor:
    """Share ``[L]`` of the count-weighted level means' spread that lies along ``unit [L, d]`` (1 = on a line)."""
    mu, counts = class_means(X, ylev, k)
    grand = (mu * counts[:, None, None]).sum(0) / counts.sum()
    dev = (mu - grand) * counts.sqrt()[:, None, None]                   # [k, L, d]
    along = (torch.einsum("kld,ld->kl", dev, unit.double()) ** 2).sum(0)
    return along / (dev ** 2).sum((0, 2)).clamp_min(1e-30)
