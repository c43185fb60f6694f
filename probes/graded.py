"""Graded directions from ``k`` ordered levels (e.g. low / neutral / high expressions of a trait).

The default method is ``trend`` (the least-squares slope of the activations on the level index). Measured on
SmolLM2-135M-Instruct, extraversion statements under three system-prompt levels (48 questions each, last
token of ``resid_post``), the old default ``pca`` put the levels in order at 0 of 30 layers, in-sample and
held out, while ``trend`` / ``extremes`` put them in order (see ``tests/test_probes_graded_real.py``).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from probes._checks import ProbeData, as_data
from probes._frames import layer_sorted
from probes._graded_fit import LevelStats, collinearity, fit_graded, level_stats
from probes.folds import make_folds
from probes.objects import Direction

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class GradedDirection(Result):
    """A direction along ordered levels, and how well the levels line up on it, per layer.

    In-sample (the direction was fitted on these samples): ``level_means`` / ``level_std [n_layers, k]``,
    ``adjacent_d [n_layers, k-1]`` (Cohen's d of each level over the one below), ``monotonic [n_layers]``
    (level means increase strictly), ``spearman [n_layers]`` (rank correlation of projections with level),
    ``collinearity [n_layers]`` (share of the level means' spread along the direction; 1 = on a line).
    Held out (fitted on the other folds' items, scored on this fold's, ``heldout_* [n_folds, n_layers, ...]``;
    None when ``n_folds=None``): ``heldout_level_means``, ``heldout_adjacent_d``, ``heldout_monotonic``,
    ``heldout_spearman``. Every layer's direction is oriented low -> high (positive trend over levels).
    """

    direction: Direction
    levels: list[Any]
    level_means: torch.Tensor
    adjacent_d: torch.Tensor
    monotonic: torch.Tensor
    spearman: torch.Tensor
    collinearity: torch.Tensor
    level_std: torch.Tensor | None = None
    heldout_level_means: torch.Tensor | None = None
    heldout_adjacent_d: torch.Tensor | None = None
    heldout_monotonic: torch.Tensor | None = None
    heldout_spearman: torch.Tensor | None = None

    @property
    def sites(self) -> list[str]:
        return self.direction.sites

    @property
    def heldout_ordered(self) -> torch.Tensor | None:
        """Share of held-out folds ``[n_layers]`` in which the level means come out in order."""
        return None if self.heldout_monotonic is None else self.heldout_monotonic.double().mean(0)

    def ordered_layers(self, heldout: bool = True) -> list[int]:
        """Indices of layers whose levels are in order: in every held-out fold (or in-sample)."""
        mask = self.monotonic if not heldout or self.heldout_monotonic is None else self.heldout_monotonic.all(0)
        return mask.nonzero().flatten().tolist()

    def summary(self) -> dict[str, Any]:
        """How many layers order the levels, and the best layer by Spearman with its spread and adjacent d."""
        j = int(self.spearman.nan_to_num(-2.0).argmax())
        out: dict[str, Any] = {"levels": [str(x) for x in self.levels], "n_layers": len(self.sites),
                               "n_ordered": len(self.ordered_layers(heldout=False)), "best_site": self.sites[j],
                               "spearman": float(self.spearman[j]), "collinearity": float(self.collinearity[j]),
                               "min_adjacent_d": float(self.adjacent_d[j].min())}
        if self.heldout_ordered is not None:
            out |= {"n_ordered_heldout": len(self.ordered_layers()), "heldout_spearman": float(
                self.heldout_spearman[:, j].mean())}
        return out

    def to_frame(self) -> pd.DataFrame:
        """One row per site, with a numeric layer column, sorted by it; held-out columns are fold means."""
        rows = []
        for j, s in enumerate(self.sites):
            row: dict[str, Any] = {"site": s, "monotonic": bool(self.monotonic[j]), "spearman": float(self.spearman[j]),
                                   "collinearity": float(self.collinearity[j])}
            for i, lev in enumerate(self.levels):
                row[f"mean[{lev}]"] = float(self.level_means[j, i])
            for i in range(len(self.levels) - 1):
                row[f"d[{self.levels[i]}->{self.levels[i + 1]}]"] = float(self.adjacent_d[j, i])
            if self.heldout_adjacent_d is not None:
                row["heldout_ordered"] = float(self.heldout_ordered[j])
                row["heldout_spearman"] = float(self.heldout_spearman[:, j].mean())
                for i in range(len(self.levels) - 1):
                    row[f"heldout_d[{self.levels[i]}->{self.levels[i + 1]}]"] = float(
                        self.heldout_adjacent_d[:, j, i].mean())
            rows.append(row)
        return layer_sorted(rows)

    def plot(self, title: str | None = None) -> Any:
        """Level means with +-1 std bands by layer, and adjacent-level d (in-sample and held out) below."""
        from interp.viz.probes import graded_levels

        held = None if self.heldout_adjacent_d is None else self.heldout_adjacent_d.mean(0)
        return graded_levels(self.level_means, self.adjacent_d, [str(x) for x in self.levels], self.sites,
                             title=title or f"levels along the graded direction ({self.direction.method})",
                             level_std=self.level_std, heldout_d=held)


def _level_codes(data: ProbeData, order: Sequence[Any] | None) -> tuple[torch.Tensor, list[Any]]:
    """Level codes ``0..k-1`` from lowest to highest, and the level names in that order."""
    if order is None:
        return data.y, list(data.classes)
    order = list(order)
    if sorted(map(str, order)) != sorted(map(str, data.classes)) or len(order) != len(data.classes):
        raise ValueError(f"order {order} must list each level exactly once; levels seen: {data.classes}")
    remap = torch.tensor([order.index(c) for c in data.classes], dtype=torch.long)
    return remap[data.y], order


def _heldout(X: torch.Tensor, ylev: torch.Tensor, k: int, method: str, n_folds: int, groups: list[Any] | None,
             seed: int) -> list[LevelStats]:
    """Level statistics on each fold's held-out items, the direction fitted on the other folds (all layers at once)."""
    try:
        folds = make_folds(ylev, n_folds, groups, seed)
    except ValueError as err:
        raise ValueError(f"held-out evaluation of the ordering cannot split these samples ({err}); pass fewer "
                         f"n_folds, more samples per level, or n_folds=None to skip it") from err
    out = []
    for fold in folds:
        raw = fit_graded(X[fold.train], ylev[fold.train], k, method)
        unit = raw / raw.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        proj = torch.einsum("nld,ld->ln", X[fold.test].double(), unit)
        try:
            out.append(level_stats(proj, ylev[fold.test], k))
        except ValueError as err:
            raise ValueError(f"a held-out fold has too few samples of a level ({err}); pass fewer n_folds "
                             f"or n_folds=None") from err
    return out


def _warn_unordered(res: GradedDirection, method: str) -> None:
    """Warn when the levels come out of order at every layer (in-sample, or in every held-out fold)."""
    n = len(res.sites)
    inside, held = len(res.ordered_layers(heldout=False)), len(res.ordered_layers(heldout=True))
    if inside == 0 or (res.heldout_monotonic is not None and held == 0):
        msg = f"in order at {inside}/{n} layers in-sample"
        if res.heldout_monotonic is not None:
            msg += f", {held}/{n} in every held-out fold"
        warnings.warn(f"graded_direction(method={method!r}): the levels {res.levels} are not ordered along the "
                      f"direction ({msg}); the middle levels may sit off the low-high axis. Inspect .plot() / "
                      f".to_frame(), try another method, or check that the levels differ only in degree",
                      stacklevel=3)


def graded_direction(X: Any, levels: Any = None, *, order: Sequence[Any] | None = None, method: str = "trend",
                     groups: Any = None, n_folds: int | None = 5, seed: int = 0, warn: bool = True) -> GradedDirection:
    """Fit a direction through ``k >= 2`` ordered levels and test whether the levels are ordered along it.

    ``levels``: one level per sample; ``order``: the levels from lowest to highest (default: sorted).
    ``method``: ``"trend"`` (default; slope of activations on level index), ``"extremes"`` (highest level
    mean minus lowest) or ``"pca"`` (first principal axis of the level means); see
    :func:`probes._graded_fit.fit_graded`. ``groups`` (e.g. the question each prompt was built from) keep
    an item's levels in one fold of the held-out check (``n_folds`` folds; ``None`` skips it). ``warn``:
    warn when the levels are out of order at every layer.
    """
    data = as_data(X, levels, groups=groups, min_classes=2)
    ylev, names = _level_codes(data, order)
    k = len(names)
    counts = torch.bincount(ylev, minlength=k)
    if (counts < 2).any():
        raise ValueError(f"every level needs at least two samples; counts: {dict(zip(names, counts.tolist(), strict=True))}")
    raw = fit_graded(data.X, ylev, k, method)
    direction = Direction.from_vectors(raw.to(data.X.dtype), data.sites, method=f"graded_{method}",
                                       model_id=data.model_id, data_hash=data.data_hash,
                                       fitted_on=list(data.sample_ids), meta={"levels": [str(x) for x in names]})
    unit = direction.vectors.double()
    st = level_stats(torch.einsum("nld,ld->ln", data.X.double(), unit), ylev, k)
    held = None if n_folds is None else _heldout(data.X, ylev, k, method, n_folds, data.groups, seed)
    res = GradedDirection(
        direction=direction, levels=names, level_means=st.means.float(), adjacent_d=st.adjacent_d.float(),
        monotonic=st.monotonic, spearman=st.spearman.float(), collinearity=collinearity(data.X, ylev, k, unit).float(),
        level_std=st.std.float(),
        heldout_level_means=None if held is None else torch.stack([h.means for h in held]).float(),
        heldout_adjacent_d=None if held is None else torch.stack([h.adjacent_d for h in held]).float(),
        heldout_monotonic=None if held is None else torch.stack([h.monotonic for h in held]),
        heldout_spearman=None if held is None else torch.stack([h.spearman for h in held]).float())
    if warn:
        _warn_unordered(res, method)
    return res
