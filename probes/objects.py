"""`Direction` and `Subspace`: unit vector(s) per layer with provenance; save/load as safetensors + JSON."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float

from interp.io import load_bundle, save_bundle
from interp.sites import parse_site
from probes._checks import check_width, layer_index


def _provenance(obj: Any) -> dict[str, Any]:
    return {"method": obj.method, "sites": list(obj.sites), "model_id": obj.model_id, "data_hash": obj.data_hash,
            "fitted_on": list(obj.fitted_on), "meta": obj.meta}


def _check_sites(sites: list[str], n: int, what: str) -> list[str]:
    sites = list(sites)
    if len(sites) != n:
        raise ValueError(f"{what} holds {n} layers but {len(sites)} site names were given")
    return sites


@dataclass
class Direction:
    """One unit vector per layer, ``vectors [n_layers, d]``, plus ``norms [n_layers]`` before normalising.

    ``method``, ``sites``, ``model_id``, ``data_hash`` and ``fitted_on`` (the sample ids it was fitted on)
    record where it came from. ``raw`` gives the un-normalised vectors (``vectors * norms``).
    """

    vectors: torch.Tensor
    norms: torch.Tensor
    sites: list[str]
    method: str = ""
    model_id: str = ""
    data_hash: str = ""
    fitted_on: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.vectors.dim() == 1:
            self.vectors = self.vectors[None]
        if self.vectors.dim() != 2:
            raise ValueError(f"Direction vectors must be [n_layers, d], got {tuple(self.vectors.shape)}")
        self.norms = torch.as_tensor(self.norms, dtype=self.vectors.dtype).reshape(-1)
        if self.norms.numel() != self.vectors.shape[0]:
            raise ValueError(f"{self.norms.numel()} norms for {self.vectors.shape[0]} layers")
        self.sites = _check_sites(self.sites, self.vectors.shape[0], "Direction")
        self.fitted_on = [str(i) for i in self.fitted_on]

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
        return Direction(self.vectors[idx], self.norms[idx], [self.sites[i] for i in idx], self.method, self.model_id,
                         self.data_hash, list(self.fitted_on), dict(self.meta))

    def project(self, X: Any) -> Float[torch.Tensor, "n n_layers"]:
        """Projection of activations ``[n, n_layers, d]`` (or Activations at the same sites) on each layer's vector."""
        from probes.compare import project

        return project(X, self)

    def __neg__(self) -> Direction:
        return Direction(-self.vectors, self.norms, list(self.sites), self.method, self.model_id, self.data_hash,
                         list(self.fitted_on), dict(self.meta))

    def to_frame(self) -> Any:
        import pandas as pd

        return pd.DataFrame({"site": self.sites, "layer": self.layers, "norm": self.norms.tolist(),
                             "method": self.method, "model_id": self.model_id})

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> None:
        """``PATH/tensors.safetensors`` + ``PATH/meta.json``, atomically; refuses to overwrite by default."""
        meta = {"kind": "probes.Direction", **_provenance(self)}
        save_bundle(path, {"vectors": self.vectors, "norms": self.norms}, meta, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Direction:
        t, m = load_bundle(path)
        if m.get("kind") != "probes.Direction":
            raise ValueError(f"{path} does not hold a saved Direction (kind={m.get('kind')!r})")
        return cls(t["vectors"], t["norms"], m["sites"], m["method"], m["model_id"], m["data_hash"],
                   m["fitted_on"], m.get("meta", {}))

    def __repr__(self) -> str:
        return (f"Direction(method={self.method!r}, layers={self.n_layers}, d={self.d_model}, "
                f"model={self.model_id!r}, fitted_on={len(self.fitted_on)} samples)")


@dataclass
class Subspace:
    """``k`` orthonormal directions per layer, ``bases [n_layers, k, d]`` (rows orthonormal), best first.

    ``strengths [n_layers, k]`` holds each component's size (singular value or raw norm); ``names`` labels
    the components (e.g. categories). ``truncate(k)`` keeps the first ``k`` so rank 1..k can be ablated.
    """

    bases: torch.Tensor
    strengths: torch.Tensor
    sites: list[str]
    method: str = ""
    model_id: str = ""
    data_hash: str = ""
    fitted_on: list[str] = field(default_factory=list)
    names: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.bases.dim() == 2:
            self.bases = self.bases[None]
        if self.bases.dim() != 3:
            raise ValueError(f"Subspace bases must be [n_layers, k, d], got {tuple(self.bases.shape)}")
        self.strengths = torch.as_tensor(self.strengths, dtype=self.bases.dtype).reshape(self.bases.shape[:2])
        self.sites = _check_sites(self.sites, self.bases.shape[0], "Subspace")
        if self.names is not None and len(self.names) != self.bases.shape[1]:
            raise ValueError(f"{len(self.names)} names for {self.bases.shape[1]} components")
        self.fitted_on = [str(i) for i in self.fitted_on]

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
        return Subspace(self.bases[:, :k], self.strengths[:, :k], list(self.sites), self.method, self.model_id,
                        self.data_hash, list(self.fitted_on), None if self.names is None else self.names[:k],
                        dict(self.meta))

    def component(self, i: int) -> Direction:
        """Component ``i`` as a :class:`Direction`."""
        return Direction(self.bases[:, i], self.strengths[:, i], list(self.sites), f"{self.method}[{i}]",
                         self.model_id, self.data_hash, list(self.fitted_on), dict(self.meta))

    def coordinates(self, X: Any) -> Float[torch.Tensor, "n n_layers k"]:
        """Coordinates of activations ``[n, n_layers, d]`` in each layer's basis."""
        x = _as_tensor(X, self.sites)
        check_width(self.bases, x.shape[-1], "subspace")
        return torch.einsum("nld,lkd->nlk", x.to(self.bases.dtype), self.bases)

    def project_out(self, X: Any) -> Float[torch.Tensor, "n n_layers d"]:
        """Activations with the subspace removed per layer (orthogonal projection; an analysis tool)."""
        x = _as_tensor(X, self.sites).to(self.bases.dtype)
        check_width(self.bases, x.shape[-1], "subspace")
        return x - torch.einsum("nlk,lkd->nld", torch.einsum("nld,lkd->nlk", x, self.bases), self.bases)

    def to_frame(self) -> Any:
        import pandas as pd

        rows = []
        for li, site in enumerate(self.sites):
            for k in range(self.rank):
                rows.append({"site": site, "layer": self.layers[li], "component": k,
                             "name": None if self.names is None else self.names[k],
                             "strength": float(self.strengths[li, k])})
        return pd.DataFrame(rows)

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> None:
        meta = {"kind": "probes.Subspace", "names": self.names, **_provenance(self)}
        save_bundle(path, {"bases": self.bases, "strengths": self.strengths}, meta, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Subspace:
        t, m = load_bundle(path)
        if m.get("kind") != "probes.Subspace":
            raise ValueError(f"{path} does not hold a saved Subspace (kind={m.get('kind')!r})")
        return cls(t["bases"], t["strengths"], m["sites"], m["method"], m["model_id"], m["data_hash"],
                   m["fitted_on"], m.get("names"), m.get("meta", {}))

    def __repr__(self) -> str:
        return (f"Subspace(method={self.method!r}, layers={self.n_layers}, rank={self.rank}, d={self.d_model}, "
                f"model={self.model_id!r})")


def _as_tensor(X: Any, sites: list[str]) -> torch.Tensor:
    """Activations -> tensor at ``sites`` (by name); tensors must already be ``[n, len(sites), d]``."""
    from interp.activations import Activations

    if isinstance(X, Activations):
        if X.has_positions:
            raise ValueError("Activations with several positions per prompt; use acts.flat_tokens() or reduce positions")
        missing = [s for s in sites if s not in X.sites]
        if missing:
            raise ValueError(f"the activations lack sites {missing}; capture them or select the direction's layers")
        return X.tensor[:, [X.sites.index(s) for s in sites]]
    t = torch.as_tensor(X)
    if t.dim() == 2:
        t = t[:, None]
    if t.dim() != 3 or t.shape[1] != len(sites):
        raise ValueError(f"activations must be [n, {len(sites)}, d] to match the {len(sites)} fitted layers, "
                         f"got {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ValueError("activations contain NaN or Inf")
    return t
