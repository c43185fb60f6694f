"""Typicality gradients within categories (prototype theory): is a typical item closer to its category's prototype?

Per layer, each item's distance to the centroid of the other items of its category (leave one out) is turned into a
closeness (minus the distance) and rank-correlated with the typicality ratings: per category, and pooled over all items
after standardising closeness and ratings within each category (so category offsets do not count). A positive rho is a
prototype effect. Controls: ratings permuted within categories (one-sided permutation p, and a family-wise p over
layers) and a bootstrap interval resampling items within categories.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from interp.bundle import Result
from interp.evals.bootstrap import percentile_interval, resample_ids
from interp.evals.metrics import spearman
from interp.models import Model
from interp.studies.directions.similarity import SIMILARITY_MOVED, SimilarityConfig, check_items, format_items
from interp.studies.directions.similarity_data import item_activations
from interp.values import Runtime, moved_keywords
from interp.viz.directions_similarity import typicality_by_layer
from probes.similarity import group_ids, group_permutations, p_greater, prototype_distance


def _zscore_within(v: torch.Tensor, gid: torch.Tensor) -> torch.Tensor:
    """``v [..., n]`` standardised inside each group (mean 0, sd 1; a constant group stays 0)."""
    out = torch.zeros_like(v, dtype=torch.float64)
    for g in gid.unique():
        idx = (gid == g).nonzero()[:, 0]
        x = v[..., idx].double()
        sd = x.std(-1, keepdim=True)
        out[..., idx] = (x - x.mean(-1, keepdim=True)) / torch.where(sd > 0, sd, torch.ones_like(sd))
    return out


def _group_boot(gid: torch.Tensor, n_boot: int, seed: int) -> torch.Tensor:
    """``[n_boot, n]`` indices resampling items with replacement inside each group (group sizes kept)."""
    return resample_ids(len(gid), n_boot, seed + 1, groups=gid)


def _rho(close: torch.Tensor, rating: torch.Tensor) -> torch.Tensor:
    """Spearman of ``close [L, n]`` with ``rating [..., n]`` broadcast to ``[..., L]`` (float64)."""
    c, r = torch.broadcast_tensors(close, rating[..., None, :])
    return spearman(c, r).double()


@dataclass
class TypicalityResult(Result):
    """Prototype effect by layer: ``pooled [L]`` (within-category standardised Spearman), its ``p [L]``, ``p_fwe [L]``,
    bootstrap ``lo``/``hi [L]``, the null's 97.5% ``null_hi [L]``, and per category ``per_group [G, L]`` with ``group_p``,
    ``group_lo``/``group_hi``; ``distance [L, n]`` is each item's leave-one-out distance to its prototype."""

    layers: list[int]
    groups: list[Any]
    pooled: torch.Tensor
    p: torch.Tensor
    p_fwe: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor
    null_hi: torch.Tensor
    per_group: torch.Tensor
    group_p: torch.Tensor
    group_lo: torch.Tensor
    group_hi: torch.Tensor
    distance: torch.Tensor
    metric: str
    boot: torch.Tensor | None = None

    def compare(self, other: TypicalityResult) -> pd.DataFrame:
        """Pooled rho of this result minus ``other``'s by layer, with a paired bootstrap 95% interval: both must come
        from the same items, groups, ``n_boot`` and seed (so they share their resamples), e.g. a model and its
        :func:`~interp.studies.directions.similarity_data.random_init` twin."""
        if self.boot is None or other.boot is None or self.boot.shape != other.boot.shape or \
                self.groups != other.groups or self.distance.shape[-1] != other.distance.shape[-1]:
            raise ValueError("compare needs two typicality results of the same items, groups, n_boot and seed")
        d = self.boot - other.boot
        return pd.DataFrame({"layer": self.layers, "difference": (self.pooled - other.pooled).tolist(),
                             "lo": percentile_interval(d)[0].tolist(), "hi": percentile_interval(d)[1].tolist()})

    def to_frame(self) -> pd.DataFrame:
        """One row per (layer, category) and per layer for ``category == "pooled"``."""
        rows = []
        for k, v in enumerate(self.layers):
            rows.append({"layer": v, "category": "pooled", "rho": float(self.pooled[k]), "p": float(self.p[k]),
                         "p_fwe": float(self.p_fwe[k]), "lo": float(self.lo[k]), "hi": float(self.hi[k])})
            rows += [{"layer": v, "category": g, "rho": float(self.per_group[i, k]), "p": float(self.group_p[i, k]),
                      "p_fwe": None, "lo": float(self.group_lo[i, k]), "hi": float(self.group_hi[i, k])}
                     for i, g in enumerate(self.groups)]
        return pd.DataFrame(rows)

    def summary(self) -> dict[str, Any]:
        """Headline numbers: the best layer's pooled rho, its bootstrap interval, p and family-wise p."""
        k = int(torch.nan_to_num(self.pooled, nan=-2.0).argmax())
        return {"best_layer": self.layers[k], "rho": float(self.pooled[k]), "lo": float(self.lo[k]),
                "hi": float(self.hi[k]), "p": float(self.p[k]), "p_fwe": float(self.p_fwe[k]),
                "above_null": bool(self.p_fwe[k] < 0.05), "metric": self.metric}

    def report(self) -> str:
        """One line: the best layer's figures and the verdict against the null."""
        k = int(torch.nan_to_num(self.pooled, nan=-2.0).argmax())
        verdict = ("above the within-category permutation null (check a random_init twin with compare() before "
                   "reading it as learned)" if self.p_fwe[k] < 0.05 else "a null result (family-wise p >= 0.05)")
        return (f"best layer {self.layers[k]}: pooled rho = {float(self.pooled[k]):.3f} "
                f"[{float(self.lo[k]):.3f}, {float(self.hi[k]):.3f}], p = {float(self.p[k]):.3g}, "
                f"family-wise p = {float(self.p_fwe[k]):.3g}: {verdict}")

    def plot(self) -> Any:
        return typicality_by_layer(self.pooled, self.lo, self.hi, self.layers,
                                   per_group={str(g): self.per_group[i] for i, g in enumerate(self.groups)},
                                   null_hi=self.null_hi, title=f"typicality gradient by layer ({self.metric} distance)")


def typicality_stats(distance: torch.Tensor, groups: Sequence[Any], ratings: Sequence[float], layers: Sequence[int],
                     n_perm: int = 1000, n_boot: int = 1000, seed: int = 0, metric: str = "cosine") -> TypicalityResult:
    """The prototype-effect statistics of leave-one-out distances ``distance [L, n]`` against ``ratings [n]``.

    Permutations and bootstrap resamples are seeded by ``seed``: two results with one seed and the same items share
    them, so :meth:`TypicalityResult.compare` is a paired comparison."""
    gid, names = group_ids(groups)
    rating = torch.as_tensor(list(ratings), dtype=torch.float64)
    if rating.shape[0] != distance.shape[-1]:
        raise ValueError(f"{rating.shape[0]} ratings for {distance.shape[-1]} items: give one rating per item")
    close = -distance.double()
    zc, zr = _zscore_within(close, gid), _zscore_within(rating, gid)
    perms, boots = group_permutations(gid, n_perm, seed), _group_boot(gid, n_boot, seed)
    pooled = _rho(zc, zr)
    null = _rho(zc, zr[perms])                                            # [P, L]
    boot = _rho_boot(zc, zr, boots)                                       # [B, L]
    per, gp, glo, ghi = [], [], [], []
    for k in range(len(names)):
        idx = (gid == k).nonzero()[:, 0]
        obs = _rho(close[:, idx], rating[idx])
        local = idx.new_empty(len(gid))
        local[idx] = torch.arange(len(idx))
        gnull = _rho(close[:, idx], rating[perms[:, idx]])
        gboot = _rho_boot(close[:, idx], rating[idx], local[boots[:, idx]])
        per.append(obs), gp.append(p_greater(obs, gnull))
        glo.append(percentile_interval(gboot)[0]), ghi.append(percentile_interval(gboot)[1])
    fwe = p_greater(pooled, torch.nan_to_num(null, nan=-2.0).max(1, keepdim=True).values)
    return TypicalityResult(layers=list(layers), groups=names, pooled=pooled, p=p_greater(pooled, null), p_fwe=fwe,
                            lo=percentile_interval(boot)[0], hi=percentile_interval(boot)[1],
                            null_hi=null.nanquantile(0.975, 0), per_group=torch.stack(per), group_p=torch.stack(gp),
                            group_lo=torch.stack(glo), group_hi=torch.stack(ghi), distance=distance, metric=metric,
                            boot=boot)


def _rho_boot(close: torch.Tensor, rating: torch.Tensor, boots: torch.Tensor) -> torch.Tensor:
    """Spearman on resampled items: ``close [L, n]``, ``rating [n]``, ``boots [B, n]`` -> ``[B, L]``."""
    return spearman(close[:, boots].transpose(0, 1), rating[boots][:, None, :].expand(-1, close.shape[0], -1)).double()


@moved_keywords(SIMILARITY_MOVED)
def typicality(model: Model, items: Sequence[str], categories: Sequence[Any], ratings: Sequence[float],
               layers: Sequence[int] | None = None, positions: Any = "last", *,
               config: SimilarityConfig | None = None, runtime: Runtime | None = None) -> TypicalityResult:
    """The typicality gradient of ``model``'s residual stream after each block: leave-one-out distance of each item to
    its category's centroid vs ``ratings`` (higher = more typical), per category and pooled, with controls
    (``config.n_perm`` / ``n_boot``, seeded by ``runtime.seed``)."""
    cfg, run = config or SimilarityConfig(), Runtime.of(runtime)
    metric, template, batch_size = cfg.metric or "cosine", cfg.template, run.batch_size
    items = check_items(items, categories)
    if len(ratings) != len(items):
        raise ValueError(f"{len(ratings)} ratings for {len(items)} items: give one rating per item")
    counts = pd.Series(list(categories)).value_counts()
    if (counts < 3).any():
        raise ValueError(f"categories {counts[counts < 3].index.tolist()} have fewer than 3 items; a leave-one-out "
                         f"prototype and a rank correlation need >= 3 per category")
    X, layer_list = item_activations(model, format_items(items, template), layers, positions, batch_size)
    distance = prototype_distance(X, categories, metric=metric)
    return typicality_stats(distance, categories, ratings, layer_list, n_perm=cfg.n_perm, n_boot=cfg.n_boot,
                            seed=run.seed, metric=metric)


__all__ = ["typicality", "typicality_stats", "TypicalityResult"]
