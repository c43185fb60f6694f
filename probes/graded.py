"""Graded directions from ``k`` ordered levels (e.g. low / neutral / high expressions of a trait)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from evals.metrics import average_ranks, cohens_d_groups
from probes._checks import as_data
from probes._linalg import class_means, top_components
from probes.objects import Direction


@dataclass
class GradedDirection:
    """A direction along ordered levels, and how well the levels line up on it, per layer.

    ``level_means [n_layers, k]``: mean projection of each level; ``adjacent_d [n_layers, k-1]``: Cohen's d
    between neighbouring levels; ``monotonic [n_layers]``: the level means increase strictly in order;
    ``spearman [n_layers]``: rank correlation of sample projections with level; ``collinearity
    [n_layers]``: share of the level means' spread that lies along the direction (1 = the levels sit on a line).
    """

    direction: Direction
    levels: list[Any]
    level_means: torch.Tensor
    adjacent_d: torch.Tensor
    monotonic: torch.Tensor
    spearman: torch.Tensor
    collinearity: torch.Tensor

    @property
    def sites(self) -> list[str]:
        return self.direction.sites

    def to_frame(self) -> Any:
        import pandas as pd

        rows = []
        for j, s in enumerate(self.sites):
            row = {"site": s, "monotonic": bool(self.monotonic[j]), "spearman": float(self.spearman[j]),
                   "collinearity": float(self.collinearity[j])}
            for i, lev in enumerate(self.levels):
                row[f"mean[{lev}]"] = float(self.level_means[j, i])
            for i in range(len(self.levels) - 1):
                row[f"d[{self.levels[i]}->{self.levels[i + 1]}]"] = float(self.adjacent_d[j, i])
            rows.append(row)
        return pd.DataFrame(rows)

    def plot(self, title: str | None = None) -> Any:
        from viz.probes import graded_levels

        return graded_levels(self.level_means, self.adjacent_d, [str(x) for x in self.levels], self.sites,
                             title=title or "level means along the graded direction")


def graded_direction(X: Any, levels: Any = None, *, order: Sequence[Any] | None = None,
                     method: str = "pca") -> GradedDirection:
    """Fit a direction through ``k >= 2`` ordered levels and test whether the levels are ordered along it.

    ``levels``: one level per sample; ``order``: the levels from lowest to highest (default: sorted).
    ``method``: ``"pca"`` (first principal axis of the count-weighted level means) or ``"extremes"``
    (highest level mean minus lowest). The sign makes the highest level project highest.
    """
    data = as_data(X, levels, min_classes=2)
    if order is not None:
        order = list(order)
        if sorted(map(str, order)) != sorted(map(str, data.classes)) or len(order) != len(data.classes):
            raise ValueError(f"order {order} must list each level exactly once; levels seen: {data.classes}")
        remap = torch.tensor([order.index(c) for c in data.classes], dtype=torch.long)
        ylev = remap[data.y]
        names = order
    else:
        ylev, names = data.y, list(data.classes)
    k = len(names)
    mu, counts = class_means(data.X, ylev, k)                            # [k, L, d]
    if (counts < 2).any():
        raise ValueError(f"every level needs at least two samples; counts: {dict(zip(names, counts.tolist(), strict=True))}")
    if method == "pca":
        grand = (mu * counts[:, None, None]).sum(0) / counts.sum()
        rows = ((mu - grand) * counts.sqrt()[:, None, None]).transpose(0, 1)
        V, _ = top_components(rows, 1)
        raw = V[:, 0]
        gap = ((mu[-1] - mu[0]) * raw).sum(-1)
        raw = raw * torch.where(gap < 0, -1.0, 1.0)[:, None] * gap.abs()[:, None]
    elif method == "extremes":
        raw = mu[-1] - mu[0]
    else:
        raise ValueError(f"method must be 'pca' or 'extremes', got {method!r}")
    direction = Direction.from_vectors(raw.to(data.X.dtype), data.sites, method=f"graded_{method}",
                                       model_id=data.model_id, data_hash=data.data_hash,
                                       fitted_on=list(data.sample_ids), meta={"levels": [str(x) for x in names]})
    unit = direction.vectors.double()
    proj = torch.einsum("nld,ld->ln", data.X.double(), unit)             # [L, n]
    means = torch.stack([proj[:, ylev == i].mean(-1) for i in range(k)], -1)
    adj = torch.stack([cohens_d_groups(proj[:, ylev == i], proj[:, ylev == i + 1]) for i in range(k - 1)], -1)
    mono = (means[:, 1:] > means[:, :-1]).all(-1)
    rs = average_ranks(proj)
    rl = average_ranks(ylev.double().expand_as(proj))
    rs, rl = rs - rs.mean(-1, keepdim=True), rl - rl.mean(-1, keepdim=True)
    spear = (rs * rl).sum(-1) / (rs.norm(dim=-1) * rl.norm(dim=-1)).clamp_min(1e-12)
    grand = (mu * counts[:, None, None]).sum(0) / counts.sum()
    dev = (mu - grand) * counts.sqrt()[:, None, None]                    # [k, L, d]
    along = (torch.einsum("kld,ld->kl", dev, unit) ** 2).sum(0)
    colin = along / (dev ** 2).sum((0, 2)).clamp_min(1e-30)
    return GradedDirection(direction=direction, levels=names, level_means=means.float(), adjacent_d=adj,
                           monotonic=mono, spearman=spear.float(), collinearity=colin.float())
