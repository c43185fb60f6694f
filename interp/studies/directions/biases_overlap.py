"""How a family's bias directions relate at one layer: cosines of the directions and principal angles between
their per-source subspaces (one difference of means per source dataset).

    fam.overlap(layer=12).plot()       # BiasFamily.overlap calls bias_overlap
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from probes.compare import cosine_matrix
from probes.subspace import principal_angles

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class BiasOverlap(Result):
    """At one ``site``: ``cosine [B, B]`` of the biases' difference-of-means directions and ``angles [B, B, k]``
    (degrees) between their rank-``k`` subspaces (one difference of means per source dataset); ``chance``:
    the typical |cosine| of two random directions of this width, ``sqrt(2 / (pi d))``."""

    biases: list[str]
    site: str
    cosine: torch.Tensor
    angles: torch.Tensor | None
    chance: float

    def summary(self) -> dict[str, Any]:
        """Headline numbers: each pair's cosine (and smallest principal angle, degrees), the largest |cosine|
        between two different biases, and chance."""
        pairs = [(a, b) for a in range(len(self.biases)) for b in range(a + 1, len(self.biases))]
        name = {p: f"{self.biases[p[0]]}/{self.biases[p[1]]}" for p in pairs}
        out = {"site": self.site, "chance": self.chance,
               "cosine": {name[p]: float(self.cosine[p]) for p in pairs},
               "max_abs_cosine": max((abs(float(self.cosine[p])) for p in pairs), default=None)}
        if self.angles is not None:
            out["smallest_angle_deg"] = {name[p]: float(self.angles[p][0]) for p in pairs}
        return out

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        rows = []
        for a, x in enumerate(self.biases):
            for b, y in enumerate(self.biases):
                row = {"a": x, "b": y, "site": self.site, "cosine": float(self.cosine[a, b]), "chance": self.chance}
                if self.angles is not None:
                    row["smallest_angle_deg"] = float(self.angles[a, b, 0])
                    row["largest_angle_deg"] = float(self.angles[a, b, -1])
                rows.append(row)
        return pd.DataFrame(rows)

    def plot(self, title: str | None = None) -> Any:
        from interp.viz.directions_biases import overlap_heatmap

        return overlap_heatmap(self.cosine, self.biases, None if self.angles is None else self.angles[..., 0],
                               title=title or f"bias directions at {self.site}: cosine (and smallest principal angle)")


def bias_overlap(family: Any, layer: int | None = None) -> BiasOverlap:
    """Overlap of a :class:`~interp.studies.directions.biases.BiasFamily`'s biases at ``layer`` (default: the median of
    the biases' chosen layers)."""
    names = family.biases
    dirs = [family.direction(b) for b in names]
    if layer is None:
        chosen = sorted(int(dirs[0].layers[family.probes[b].best]) for b in names)
        layer = chosen[(len(chosen) - 1) // 2]
    if layer not in dirs[0].layers:
        raise ValueError(f"layer {layer} was not captured; the family has layers {dirs[0].layers}")
    V = torch.stack([d.at(layer) for d in dirs])
    cos = cosine_matrix(V)
    subs = [family.probes[b].subspace for b in names]
    angles = None
    if all(s is not None for s in subs):
        B = [s.at(layer) for s in subs]
        angles = torch.stack([torch.stack([principal_angles(a, b) for b in B]) for a in B]).rad2deg()
    site = family.sites[dirs[0].layers.index(layer)]
    return BiasOverlap(names, site, cos, angles, math.sqrt(2 / (math.pi * V.shape[-1])))


__all__ = ["bias_overlap", "BiasOverlap"]
