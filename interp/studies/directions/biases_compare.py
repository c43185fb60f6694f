"""Bias directions across two checkpoints of one family: the cosine per bias per layer.

    cmp = compare_checkpoints(load_model("smollm2-base"), load_model("smollm2-aligned"), items, layers=[6, 12])
    cmp.to_frame(); cmp.plot()
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.models import Model
from interp.sites import parse_site
from interp.studies.directions.biases import BiasConfig, BiasFamily, bias_directions
from interp.studies.directions.biases_items import BiasItem
from probes.compare import cosine_by_layer, cosine_matrix

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class CheckpointComparison(Result):
    """Two checkpoints of one family on the same items and layers: ``cosine [B, n_layers]`` between their
    direction for each bias, ``cross [B, B]`` (checkpoint a's bias i vs b's bias j at ``cross_site``) and both
    families (their AUROC, LODO and flags)."""

    names: tuple[str, str]
    biases: list[str]
    sites: list[str]
    cosine: torch.Tensor
    cross: torch.Tensor
    cross_site: str
    a: BiasFamily
    b: BiasFamily
    chance: float

    def summary(self) -> dict[str, Any]:
        """Headline numbers: per bias, the cosine between the checkpoints' directions (mean over layers and at
        ``cross_site``), the mean |cosine| of different biases across checkpoints there, and chance."""
        j = self.sites.index(self.cross_site) if self.cross_site in self.sites else None
        B = len(self.biases)
        off = self.cross[~torch.eye(B, dtype=torch.bool)]
        return {"checkpoints": list(self.names), "cross_site": self.cross_site, "chance": self.chance,
                "cosine_mean": {b: float(self.cosine[i].mean()) for i, b in enumerate(self.biases)},
                "cosine_at_cross_site": None if j is None else {b: float(self.cosine[i, j])
                                                               for i, b in enumerate(self.biases)},
                "same_bias_cross": {b: float(self.cross[i, i]) for i, b in enumerate(self.biases)},
                "other_bias_cross_abs": float(off.abs().mean()) if off.numel() else None}

    def to_frame(self) -> pd.DataFrame:
        """One row per (bias, site): the cosine between checkpoints and each checkpoint's held-out AUROC there."""
        import pandas as pd

        rows = []
        for i, bias in enumerate(self.biases):
            pa, pb = self.a.probes[bias], self.b.probes[bias]
            for j, s in enumerate(self.sites):
                rows.append({"bias": bias, "site": s, "layer": pa.direction.layers[j],
                             "cosine": float(self.cosine[i, j]), f"auroc_{self.names[0]}": float(pa.auroc[j]),
                             f"auroc_{self.names[1]}": float(pb.auroc[j]), "chance": self.chance})
        return pd.DataFrame(rows)

    def plot(self, title: str | None = None) -> Any:
        from interp.viz.directions_biases import checkpoint_cosines

        return checkpoint_cosines(self.cosine, self.biases, self.sites, chance=self.chance,
                                  title=title or f"bias directions, {self.names[0]} vs {self.names[1]}: cosine by layer")


def _family(x: BiasFamily | Model, items: Sequence[BiasItem] | None, layers: Sequence[int] | None,
            config: BiasConfig | None) -> BiasFamily:
    if isinstance(x, BiasFamily):
        return x
    if items is None:
        raise ValueError("pass items=... to fit the bias directions of a model (or pass two BiasFamily objects)")
    return bias_directions(x, items, layers=layers, config=config)


def compare_checkpoints(a: BiasFamily | Model, b: BiasFamily | Model, items: Sequence[BiasItem] | None = None,
                        layers: Sequence[int] | None = None, config: BiasConfig | None = None,
                        names: tuple[str, str] | None = None) -> CheckpointComparison:
    """The same bias analysis on two checkpoints (models, or families already fitted on the same items and
    layers) and the cosine between their directions per bias per layer. A model given beside a family is fitted
    on the family's layers unless ``layers=`` says otherwise."""
    if layers is None:                      # a model fitted beside a family: on the family's layers
        fitted = next((x for x in (a, b) if isinstance(x, BiasFamily)), None)
        layers = None if fitted is None else [parse_site(s).layer for s in fitted.sites]
    fa, fb = _family(a, items, layers, config), _family(b, items, layers, config)
    if fa.biases != fb.biases or fa.sites != fb.sites:
        raise ValueError(f"the families differ (biases {fa.biases} vs {fb.biases}, sites {fa.sites[:2]}... vs "
                         f"{fb.sites[:2]}...); fit both on the same items and layers")
    cos = torch.stack([cosine_by_layer(fa.direction(x), fb.direction(x)) for x in fa.biases])
    j = fa.probes[fa.biases[0]].best
    cross = cosine_matrix(torch.stack([fa.direction(x).vectors[j] for x in fa.biases]),
                          torch.stack([fb.direction(x).vectors[j] for x in fb.biases]))
    d = fa.direction(fa.biases[0]).d_model
    return CheckpointComparison(names or (fa.model_id, fb.model_id), fa.biases, fa.sites, cos, cross, fa.sites[j],
                                fa, fb, math.sqrt(2 / (math.pi * d)))


__all__ = ["CheckpointComparison", "compare_checkpoints"]
