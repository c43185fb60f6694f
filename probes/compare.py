"""Comparing directions (cosine across layers, methods, models) and projecting corpora onto them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float

from interp.bundle import Result
from interp.coerce import check_width, layer_tensor
from probes._checks import encode_labels
from probes._frames import layer_sorted
from probes.objects import Direction, Subspace

if TYPE_CHECKING:
    import pandas as pd


def _vectors(a: Direction | Subspace | torch.Tensor) -> tuple[torch.Tensor, list[str] | None]:
    if isinstance(a, Direction):
        return a.vectors, a.sites
    if isinstance(a, Subspace):
        raise TypeError("cosines compare Directions; take a component with subspace.component(i)")
    t = torch.as_tensor(a)
    return (t[None] if t.dim() == 1 else t), None


def cosine_matrix(a: Direction | torch.Tensor, b: Direction | torch.Tensor | None = None) -> Float[torch.Tensor, "la lb"]:
    """Cosine of every layer of ``a`` with every layer of ``b`` (default ``b = a``): ``[n_layers_a, n_layers_b]``.

    ``a`` and ``b`` may come from different methods or models of the same width.
    """
    va, _ = _vectors(a)
    vb, _ = _vectors(a if b is None else b)
    if va.shape[-1] != vb.shape[-1]:
        raise ValueError(f"cannot compare directions of width {va.shape[-1]} and {vb.shape[-1]}; they come from "
                         f"models with different residual widths")
    na = va.double() / va.double().norm(dim=-1, keepdim=True).clamp_min(1e-300)
    nb = vb.double() / vb.double().norm(dim=-1, keepdim=True).clamp_min(1e-300)
    return (na @ nb.T).float()


def cosine_by_layer(a: Direction, b: Direction) -> Float[torch.Tensor, " n_shared"]:
    """Cosine at each site the two directions share (in ``a``'s order)."""
    shared = [s for s in a.sites if s in b.sites]
    if not shared:
        raise ValueError(f"the directions share no site: {a.sites[:3]}... vs {b.sites[:3]}...")
    va = a.vectors[[a.sites.index(s) for s in shared]].double()
    vb = b.vectors[[b.sites.index(s) for s in shared]].double()
    if va.shape[-1] != vb.shape[-1]:
        raise ValueError(f"cannot compare directions of width {va.shape[-1]} and {vb.shape[-1]}")
    return torch.nn.functional.cosine_similarity(va, vb, dim=-1).float()


def compare_directions(directions: Mapping[str, Direction]) -> Any:
    """Pairwise per-layer cosines of named directions (e.g. one per method): a long DataFrame."""
    import pandas as pd

    names = list(directions)
    rows = []
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            a, b = directions[x], directions[y]
            shared = [s for s in a.sites if s in b.sites]
            cos = cosine_by_layer(a, b)
            for s, c in zip(shared, cos.tolist(), strict=True):
                rows.append({"a": x, "b": y, "site": s, "cosine": c})
    return pd.DataFrame(rows)


def project(X: Any, direction: Direction | Subspace | torch.Tensor) -> torch.Tensor:
    """Projections on each layer's unit vector: ``[n, n_layers]`` (Subspace: coordinates ``[n, n_layers, k]``).

    ``X``: Activations (matched by site name) or ``[n, n_layers, d]``; a ``[d]`` / ``[n_layers, d]`` tensor
    direction is normalised first.
    """
    if isinstance(direction, Subspace):
        return direction.coordinates(X)
    if isinstance(direction, Direction):
        return direction.project(X)
    t = torch.as_tensor(direction)
    vecs = (t[None] if t.dim() == 1 else t)
    vecs = vecs / vecs.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    x = layer_tensor(X, [f"blocks.{i}.hook_resid_post" for i in range(vecs.shape[0])], check_finite=True)
    check_width(vecs, x.shape[-1])
    if x.shape[1] != vecs.shape[0]:
        raise ValueError(f"the activations have {x.shape[1]} layers, the direction {vecs.shape[0]}")
    return torch.einsum("nld,ld->nl", x.to(vecs.dtype), vecs)


@dataclass
class Signature(Result):
    """Projection statistics of a corpus on named directions: ``stats[name]`` is ``[n_groups, n_layers, 5]``
    (mean, std, q10, median, q90) per group of samples (one group ``"all"`` unless ``groups`` given)."""

    names: list[str]
    groups: list[str]
    sites: list[str]
    stats: torch.Tensor          # [n_directions, n_groups, n_layers, 5]

    STAT_NAMES = ("mean", "std", "q10", "median", "q90")

    def summary(self) -> dict[str, Any]:
        """Mean projection of each group on each direction at the last site (and which site that is)."""
        return {"directions": list(self.names), "groups": list(self.groups), "site": self.sites[-1],
                "mean": {n: {g: float(self.stats[a, i, -1, 0]) for i, g in enumerate(self.groups)}
                         for a, n in enumerate(self.names)}}

    def to_frame(self) -> pd.DataFrame:
        """One row per (direction, group, site), with a numeric layer column; sorted by those, layer last."""
        rows = []
        for a, name in enumerate(self.names):
            for g, grp in enumerate(self.groups):
                for j, s in enumerate(self.sites):
                    row = {"direction": name, "group": grp, "site": s}
                    row.update({k: float(self.stats[a, g, j, i]) for i, k in enumerate(self.STAT_NAMES)})
                    rows.append(row)
        return layer_sorted(rows, ["direction", "group"])

    def plot(self, layer: int = -1, stat: str = "mean", title: str | None = None) -> Any:
        from interp.viz.probes import signature_heatmap

        j = layer % len(self.sites)
        i = self.STAT_NAMES.index(stat)
        return signature_heatmap(self.stats[:, :, j, i], self.names, self.groups,
                                 title=title or f"{stat} projection at {self.sites[j]}")


def signature(X: Any, directions: Mapping[str, Direction] | Sequence[Direction], *, groups: Any = None) -> Signature:
    """The "signature" of a corpus on a set of directions (e.g. trait vectors): projection stats per layer."""
    if not isinstance(directions, Mapping):
        directions = {f"{d.method}_{i}": d for i, d in enumerate(directions)}
    if not directions:
        raise ValueError("pass at least one direction")
    dirs = list(directions.values())
    sites = dirs[0].sites
    for d in dirs[1:]:
        if d.sites != sites:
            raise ValueError("all directions must cover the same sites; use Direction.select(...) to align them")
    projs = torch.stack([project(X, d) for d in dirs])                   # [A, n, L]
    n = projs.shape[1]
    if groups is None:
        gcodes, gnames = torch.zeros(n, dtype=torch.long), ["all"]
    else:
        gcodes, gnames = encode_labels(groups, n, name="groups")
    out = []
    for g in range(len(gnames)):
        p = projs[:, gcodes == g].double()                                # [A, m, L]
        q = torch.quantile(p, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64), dim=1)  # [3, A, L]
        std = p.std(1) if p.shape[1] > 1 else torch.zeros_like(p[:, 0])
        out.append(torch.stack([p.mean(1), std, q[0], q[1], q[2]], -1))
    stats = torch.stack(out, 1).float()
    return Signature(names=list(directions), groups=[str(g) for g in gnames], sites=list(sites), stats=stats)
