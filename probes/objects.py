"""`Direction` and `Subspace`: unit vector(s) per layer with provenance; save/load as safetensors + JSON."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float

from interp.bundle import Fitted, from_provenance, read_object, register_kind, save_object
from interp.coerce import check_width, layer_tensor
from interp.sites import parse_site
from probes._checks import layer_index
from probes._frames import layer_sorted


def _check_sites(sites: list[str], n: int, what: str) -> list[str]:
    sites = list(sites)
    if len(sites) != n:
        raise ValueError(f"{what} holds {n} layers but {len(sites)} site names were given")
    return sites


@dataclass
class Direction(Fitted):
    """One unit vector per layer, ``vectors [n_layers, d]``, plus ``norms [n_layers]`` before normalising.

    ``method``, ``sites``, ``model_id``, ``data_hash`` and ``fitted_on`` (the sample ids it was fitted on)
    record where it came from. ``raw`` gives the un-normalised vectors (``vectors * norms``).
    """

    vectors: torch.Tensor
    norms: torch.Tensor
    sites: list[str]

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.vectors.dim() == 1:
            self.vectors = self.vectors[None]
        if self.vectors.dim() != 2:
            raise ValueError(f"Direction vectors must be [n_layers, d], got {tuple(self.vectors.shape)}")
        self.norms = torch.as_tensor(self.norms, dtype=self.vectors.dtype).reshape(-1)
        if self.norms.numel() != self.vectors.shape[0]:
            raise ValueError(f"{self.norms.numel()} norms for {self.vectors.shape[0]} layers")
        self.sites = _check_sites(self.sites, self.vectors.shape[0], "Direction")

    @classmethod
    def from_vectors(cls, raw: Float[torch.Tensor, "n_layers d"], sites: list[str], **prov: Any) -> Direction:
        """Unit-normalise ``raw`` per layer and keep its norms."""
        raw = raw[None] if raw.dim() == 1 else raw
        norms = raw.norm(dim=-1)
        unit = raw / norms.clamp_min(torch.finfo(raw.dtype).tiny)[:, None]
        return cls(vectors=unit, norms=norms, sites=list(sites), **prov)

    @property
    def n_layers(self) -> int:
        return self.vectors.shape[0]

    @property
    def d_model(self) -> int:
        return self.vectors.shape[1]

    @property
    def layers(self) -> list[int | None]:
        return [parse_site(s).layer for s in self.sites]

    @property
    def raw(self) -> Float[torch.Tensor, "n_layers d"]:
        return self.vectors * self.norms[:, None]

    def at(self, layer: int | str) -> Float[torch.Tensor, " d"]:
        """Unit vector at a layer number or site name."""
        return self.vectors[layer_index(self.sites, layer)]

    def select(self, layers: list[int | str]) -> Direction:
        idx = [layer_index(self.sites, lay) for lay in layers]
        return Direction(self.vectors[idx], self.norms[idx], [self.sites[i] for i in idx], **self.provenance_kwargs())

    def project(self, X: Any) -> Float[torch.Tensor, "n n_layers"]:
        """Projection of activations ``[n, n_layers, d]`` (or Activations at the same sites) on each layer's vector."""
        x = layer_tensor(X, self.sites, check_finite=True)
        check_width(self.vectors, x.shape[-1])
        return torch.einsum("nld,ld->nl", x.to(self.vectors.dtype), self.vectors)

    def __neg__(self) -> Direction:
        return Direction(-self.vectors, self.norms, list(self.sites), **self.provenance_kwargs())

    def to_frame(self) -> Any:
        """One row per site (norm of the raw vector), with a numeric layer column, sorted by layer."""
        return layer_sorted([{"site": s, "norm": float(self.norms[j]), "method": self.method,
                              "model_id": self.model_id} for j, s in enumerate(self.sites)])

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> None:
        """``PATH/tensors.safetensors`` + ``PATH/meta.json``, atomically; refuses to overwrite by default."""
        save_object(path, "probes.Direction", {"vectors": self.vectors, "norms": self.norms}, self.provenance,
                    overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Direction:
        """Load what :meth:`save` wrote (also the older flat ``meta.json`` layout)."""
        b = read_object(path, "probes.Direction")
        return cls(b.tensors["vectors"], b.tensors["norms"], b.provenance.sites, **from_provenance(b.provenance))

    def __repr__(self) -> str:
        return (f"Direction(method={self.method!r}, layers={self.n_layers}, d={self.d_model}, "
                f"model={self.model_id!r}, fitted_on={len(self.fitted_on)} samples)")


@dataclass
class Subspace(Fitted):
    """``k`` orthonormal directions per layer, ``bases [n_layers, k, d]`` (rows orthonormal), best first.

    ``strengths [n_layers, k]`` holds each component's size (singular value or raw norm); ``names`` labels
    the components (e.g. categories). ``truncate(k)`` keeps the first ``k`` so rank 1..k can be ablated.
    """

    bases: torch.Tensor
    strengths: torch.Tensor
    sites: list[str]
    names: list[str] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bases.dim() == 2:
            self.bases = self.bases[None]
        if self.bases.dim() != 3:
            raise ValueError(f"Subspace bases must be [n_layers, k, d], got {tuple(self.bases.shape)}")
        self.strengths = torch.as_tensor(self.strengths, dtype=self.bases.dtype).reshape(self.bases.shape[:2])
        self.sites = _check_sites(self.sites, self.bases.shape[0], "Subspace")
        if self.names is not None and len(self.names) != self.bases.shape[1]:
            raise ValueError(f"{len(self.names)} names for {self.bases.shape[1]} components")

    @property
    def rank(self) -> int:
        return self.bases.shape[1]

    @property
    def n_layers(self) -> int:
        return self.bases.shape[0]

    @property
    def d_model(self) -> int:
        return self.bases.shape[2]

    @property
    def layers(self) -> list[int | None]:
        return [parse_site(s).layer for s in self.sites]

    def at(self, layer: int | str) -> Float[torch.Tensor, "k d"]:
        return self.bases[layer_index(self.sites, layer)]

    def truncate(self, k: int) -> Subspace:
        """The first ``k`` components (1 <= k <= rank)."""
        if not 1 <= k <= self.rank:
            raise ValueError(f"k must be in 1..{self.rank}, got {k}")
        return Subspace(self.bases[:, :k], self.strengths[:, :k], list(self.sites),
                        None if self.names is None else self.names[:k], **self.provenance_kwargs())

    def component(self, i: int) -> Direction:
        """Component ``i`` as a :class:`Direction`."""
        return Direction(self.bases[:, i], self.strengths[:, i], list(self.sites),
                         **self.provenance_kwargs(method=f"{self.method}[{i}]"))

    def coordinates(self, X: Any) -> Float[torch.Tensor, "n n_layers k"]:
        """Coordinates of activations ``[n, n_layers, d]`` in each layer's basis."""
        x = layer_tensor(X, self.sites, check_finite=True)
        check_width(self.bases, x.shape[-1], "subspace")
        return torch.einsum("nld,lkd->nlk", x.to(self.bases.dtype), self.bases)

    def project_out(self, X: Any) -> Float[torch.Tensor, "n n_layers d"]:
        """Activations with the subspace removed per layer (orthogonal projection; an analysis tool)."""
        x = layer_tensor(X, self.sites, check_finite=True).to(self.bases.dtype)
        check_width(self.bases, x.shape[-1], "subspace")
        return x - torch.einsum("nlk,lkd->nld", torch.einsum("nld,lkd->nlk", x, self.bases), self.bases)

    def to_frame(self) -> Any:
        """One row per (site, component), with a numeric layer column; sorted by layer, then component."""
        rows = []
        for li, site in enumerate(self.sites):
            for k in range(self.rank):
                rows.append({"site": site, "component": k,
                             "name": None if self.names is None else self.names[k],
                             "strength": float(self.strengths[li, k])})
        return layer_sorted(rows)

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> None:
        """``PATH/tensors.safetensors`` + ``PATH/meta.json``, atomically; refuses to overwrite by default."""
        save_object(path, "probes.Subspace", {"bases": self.bases, "strengths": self.strengths}, self.provenance,
                    {"names": self.names}, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Subspace:
        """Load what :meth:`save` wrote (also the older flat ``meta.json`` layout)."""
        b = read_object(path, "probes.Subspace")
        return cls(b.tensors["bases"], b.tensors["strengths"], b.provenance.sites, b.fields.get("names"),
                   **from_provenance(b.provenance))

    def __repr__(self) -> str:
        return (f"Subspace(method={self.method!r}, layers={self.n_layers}, rank={self.rank}, d={self.d_model}, "
                f"model={self.model_id!r})")


register_kind("probes.Direction", Direction.load)
register_kind("probes.Subspace", Subspace.load)
