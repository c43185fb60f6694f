"""`Sweep`: a grid of metric values (layer x position, layer x head, ...) with its baseline and a ``.plot()``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class Sweep(Result):
    """``values[i, j]``: the metric after patching row ``i`` (a layer), column ``j`` (a position, head, ...).

    ``baseline`` is the unpatched target run's metric and ``reference`` the source run's, so
    :meth:`normalized` is 0 for no effect and 1 for a full restoration of the source behaviour. ``method`` is
    ``exact`` (real patched forwards) or ``attribution`` (the gradient x difference estimate).
    """

    values: torch.Tensor
    baseline: float
    reference: float | None
    rows: list[str]
    cols: list[str]
    row_name: str = "layer"
    col_name: str = "position"
    site: str = ""
    method: str = "exact"
    metric: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.values.dim() != 2 or tuple(self.values.shape) != (len(self.rows), len(self.cols)):
            raise ValueError(f"values of shape {tuple(self.values.shape)} do not match {len(self.rows)} rows x "
                             f"{len(self.cols)} columns")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    @property
    def delta(self) -> torch.Tensor:
        """Change of the metric caused by each patch."""
        return self.values - self.baseline

    def normalized(self) -> torch.Tensor:
        """``(value - baseline) / (reference - baseline)``: 1 means the source run's metric is reached."""
        if self.reference is None:
            raise ValueError("this sweep has no reference (source-run) metric; use .delta instead")
        gap = self.reference - self.baseline
        if abs(gap) < 1e-12:
            raise ValueError("the source and target runs have the same metric, so there is nothing to normalise; "
                             "use .delta or pick prompts whose metric differs")
        return self.delta / gap

    def summary(self) -> dict[str, Any]:
        """Headline numbers: the baseline and reference metrics and the cell with the largest effect (its delta
        and, with a reference, the fraction of the gap it restores)."""
        row, col, delta = self.top(1)[0]
        gap = None if self.reference is None else self.reference - self.baseline
        return {"metric": self.metric, "method": self.method, "site": self.site, "baseline": self.baseline,
                "reference": self.reference, "n_cells": int(self.values.numel()), f"top_{self.row_name}": row,
                f"top_{self.col_name}": col, "top_delta": delta,
                "top_normalized": None if gap is None or abs(gap) < 1e-12 else delta / gap}

    def top(self, k: int = 10, by: str = "abs") -> list[tuple[str, str, float]]:
        """The ``k`` cells with the largest effect: ``(row, col, delta)``; ``by`` is ``abs``, ``max`` or ``min``."""
        d = self.delta.flatten()
        key = {"abs": d.abs(), "max": d, "min": -d}.get(by)
        if key is None:
            raise ValueError(f"by must be 'abs', 'max' or 'min', got {by!r}")
        idx = key.argsort(descending=True)[:k].tolist()
        C = len(self.cols)
        return [(self.rows[i // C], self.cols[i % C], float(d[i])) for i in idx]

    def __getitem__(self, idx: Any) -> torch.Tensor:
        return self.values[idx]

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        arr = self.values.detach().cpu().numpy()
        return arr if dtype is None else arr.astype(dtype)

    def to_frame(self, wide: bool = False, normalized: bool = False) -> pd.DataFrame:
        """One row per cell: ``{row_name}`` and ``{col_name}`` (e.g. ``layer``, ``position``; integers, so layer
        10 sorts after layer 2), ``value``, ``delta`` and, with a reference, ``normalized``. Labels that are not
        integers (token labels, site kinds) go to ``{name}_label`` beside an integer index. ``wide=True``: the
        grid itself (rows x cols) of the values, or of the normalised effects with ``normalized=True``."""
        import pandas as pd

        if wide:
            z = self.normalized() if normalized else self.values
            return pd.DataFrame(z.tolist(), index=self.rows, columns=self.cols)
        R, C = len(self.rows), len(self.cols)
        frame = pd.DataFrame({**axis_columns(self.row_name, [r for r in self.rows for _ in range(C)],
                                             [i for i in range(R) for _ in range(C)]),
                              **axis_columns(self.col_name, self.cols * R, list(range(C)) * R)})
        frame["value"] = self.values.flatten().tolist()
        frame["delta"] = self.delta.flatten().tolist()
        has_gap = self.reference is not None and abs(self.reference - self.baseline) > 1e-12
        if has_gap:
            frame["normalized"] = self.normalized().flatten().tolist()
        return frame

    def plot(self, normalized: bool | None = None, title: str | None = None) -> Any:
        """Heatmap (plotly); normalised when a reference metric exists unless ``normalized=False``."""
        from interp.viz.patching import sweep_heatmap

        return sweep_heatmap(self, normalized=normalized, title=title)

    def __repr__(self) -> str:
        return (f"Sweep({self.method}, site={self.site!r}, {self.row_name} x {self.col_name} = {self.shape}, "
                f"baseline={self.baseline:.4g}, reference={self.reference if self.reference is None else round(self.reference, 4)})")


_NUMERIC_AXES = ("layer", "position", "head", "neuron", "latent", "step")


def axis_columns(name: str, labels: list[str], index: list[int]) -> dict[str, list[Any]]:
    """Columns for one axis of a grid: ``{name: ints}`` when every label is an integer; otherwise, for a
    numeric axis (layer, position, head, neuron) ``{name: index, name_label: labels}`` so ``name`` still sorts
    numerically, and for a categorical one (site, block) ``{name: labels, name_index: index}``."""
    try:
        return {name: [int(x) for x in labels]}
    except ValueError:
        if name in _NUMERIC_AXES:
            return {name: index, f"{name}_label": list(labels)}
        return {name: list(labels), f"{name}_index": index}


__all__ = ["Sweep", "axis_columns"]
