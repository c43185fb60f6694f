"""Input coercion shared by every public function: `Activations` or plain tensors in, checked tensors out.

Every public function accepts either an :class:`~interp.activations.Activations` (labels taken from
``acts.labels`` unless given) or a plain tensor ``X [n, n_layers, d]`` (``[n, d]`` means one layer) with
labels ``y [n]``. Bad input raises ``ValueError``/``TypeError`` that says how to fix it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from interp.activations import Activations
from interp.coerce import layer_tensor
from interp.sites import parse_site


@dataclass
class ProbeData:
    """Checked inputs: ``X [n, n_layers, d]`` (float), ``y [n]`` (class codes 0..k-1) and provenance."""

    X: torch.Tensor
    y: torch.Tensor | None
    classes: list[Any]
    sites: list[str]
    model_id: str
    data_hash: str
    sample_ids: list[str]
    groups: list[Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return self.X.shape[0]

    def carried(self) -> dict[str, Any]:
        """What a fitted object's provenance keeps of the capture's meta: the model's shape (``model``: checked
        when the object is applied, :func:`interp.bundle.check_model`) and the sink note (``sinks``)."""
        return {k: self.meta[k] for k in ("model", "sinks") if k in self.meta}

    @property
    def n_layers(self) -> int:
        return self.X.shape[1]

    @property
    def d(self) -> int:
        return self.X.shape[2]

    def subset(self, idx: torch.Tensor | Sequence[int]) -> ProbeData:
        idx_t = torch.as_tensor(idx, dtype=torch.long)
        ids = idx_t.tolist()
        return ProbeData(
            X=self.X[idx_t], y=None if self.y is None else self.y[idx_t], classes=list(self.classes),
            sites=list(self.sites), model_id=self.model_id, data_hash=self.data_hash,
            sample_ids=[self.sample_ids[i] for i in ids],
            groups=None if self.groups is None else [self.groups[i] for i in ids], meta=dict(self.meta))


def default_sites(n_layers: int) -> list[str]:
    """Site names given to plain tensors: ``blocks.{i}.hook_resid_post`` for i in 0..n_layers-1."""
    return [f"blocks.{i}.hook_resid_post" for i in range(n_layers)]


def encode_labels(y: Any, n: int | None = None, positive: Any = None, name: str = "y") -> tuple[torch.Tensor, list[Any]]:
    """Map labels (bools, ints, strings, tensor, array) to codes ``0..k-1``; returns ``(codes [n], classes)``.

    Classes are sorted, so for bool / 0-1 labels class 1 is ``True`` / ``1``. With two classes,
    ``positive`` picks which label value becomes class 1 (the side a fitted direction points toward).
    """
    if y is None:
        raise ValueError(f"no labels: pass {name}=[...] (one per sample) or use Activations with labels set "
                         f"(acts.with_labels(...))")
    if isinstance(y, torch.Tensor):
        if y.dim() != 1:
            raise ValueError(f"{name} must be 1-D (one label per sample), got shape {tuple(y.shape)}")
        if y.is_floating_point() and not torch.isfinite(y).all():
            raise ValueError(f"{name} contains NaN or Inf")
        values = y.tolist()
    elif isinstance(y, np.ndarray):
        if y.ndim != 1:
            raise ValueError(f"{name} must be 1-D (one label per sample), got shape {y.shape}")
        values = y.tolist()
    elif isinstance(y, (str, bytes)) or not isinstance(y, Sequence):
        raise TypeError(f"{name} must be a list / tensor / array of labels, got {type(y).__name__}")
    else:
        values = list(y)
    if n is not None and len(values) != n:
        raise ValueError(f"{name} has {len(values)} labels for {n} samples; give exactly one label per sample")
    if any(v is None for v in values):
        raise ValueError(f"{name} contains None; drop unlabelled samples first")
    try:
        classes = sorted(set(values))
    except TypeError as err:
        raise TypeError(f"{name} mixes label types that cannot be ordered ({err}); use one type") from err
    if positive is not None:
        if len(classes) != 2:
            raise ValueError(f"positive= only applies to two classes; {name} has {len(classes)}: {classes[:10]}")
        if positive not in classes:
            raise ValueError(f"positive={positive!r} is not one of the labels {classes}")
        classes = [c for c in classes if c != positive] + [positive]
    index = {c: i for i, c in enumerate(classes)}
    codes = torch.tensor([index[v] for v in values], dtype=torch.long)
    return codes, classes


def as_data(X: Any, y: Any = None, *, groups: Any = None, positive: Any = None, need_labels: bool = True,
            min_classes: int = 2, max_classes: int | None = None, sites: Sequence[str] | None = None,
            dtype: torch.dtype | None = None) -> ProbeData:
    """Check and normalise ``X`` (Activations or ``[n, n_layers, d]`` / ``[n, d]`` tensor) plus labels."""
    model_id, base_hash, ids, meta = "", None, None, {}
    t = layer_tensor(X)
    if isinstance(X, Activations):
        if y is None:
            y = X.labels
        site_names = list(X.sites)
        model_id, ids, meta = X.model_id, list(X.prompt_ids), dict(X.meta)
        base_hash = X.data_hash()
    else:
        site_names = list(sites) if sites is not None else default_sites(t.shape[1])
    if sites is not None and len(site_names) != t.shape[1]:
        raise ValueError(f"{len(site_names)} site names for {t.shape[1]} layers")
    if not (t.is_floating_point()):
        raise TypeError(f"activations must be floating point, got {t.dtype}")
    n = t.shape[0]
    if n == 0 or t.shape[-1] == 0:
        raise ValueError(f"empty activations of shape {tuple(t.shape)}")
    if dtype is not None:
        t = t.to(dtype)
    elif t.dtype not in (torch.float32, torch.float64):
        t = t.float()
    if not bool(torch.isfinite(t.sum())) and not bool(torch.isfinite(t).all()):   # one cheap pass first
        bad = (~torch.isfinite(t)).flatten(1).any(1).nonzero().flatten()[:5].tolist()
        raise ValueError(f"activations contain NaN or Inf (first bad samples: {bad}); drop those samples or "
                         f"re-capture in float32")
    codes, classes = None, []
    if y is not None or need_labels:
        codes, classes = encode_labels(y, n, positive)
        if len(classes) < min_classes:
            raise ValueError(f"need at least {min_classes} classes, but all {n} samples have the label "
                             f"{classes[0]!r}; add samples of the other class")
        if max_classes is not None and len(classes) > max_classes:
            raise ValueError(f"this method takes at most {max_classes} classes, got {len(classes)}: {classes[:10]}")
    grp = None
    if groups is not None:
        grp = list(groups.tolist() if isinstance(groups, (torch.Tensor, np.ndarray)) else groups)
        if len(grp) != n:
            raise ValueError(f"groups has {len(grp)} entries for {n} samples; give one group per sample")
    if ids is None:
        ids = [str(i) for i in range(n)]
    digest = _hash(t, codes, base_hash)
    return ProbeData(X=t, y=codes, classes=classes, sites=site_names, model_id=model_id, data_hash=digest,
                     sample_ids=ids, groups=grp, meta=meta)


def _hash(t: torch.Tensor, codes: torch.Tensor | None, base: str | None) -> str:
    """Content hash: the Activations' own hash, or shape + a strided sample of values for plain tensors."""
    h = hashlib.sha256()
    if base is not None:
        h.update(base.encode())
    else:
        flat = t.reshape(-1)
        step = max(1, flat.numel() // 65536)
        h.update(repr(tuple(t.shape)).encode())
        h.update(flat[::step].detach().cpu().double().numpy().tobytes())
    if codes is not None:
        h.update(codes.numpy().tobytes())
    return h.hexdigest()[:16]


def layer_index(sites: list[str], layer: int | str) -> int:
    """Index into ``sites`` of a layer number (``3``, ``-1`` = last) or a site name."""
    if isinstance(layer, str):
        canon = parse_site(layer).name
        if canon not in sites:
            raise KeyError(f"site {layer!r} is not among {sites}")
        return sites.index(canon)
    if not isinstance(layer, (int, np.integer)):
        raise TypeError(f"layer must be an int or a site name, got {type(layer).__name__}")
    layers = [parse_site(s).layer for s in sites]
    if layer < 0:
        if -layer > len(sites):
            raise IndexError(f"layer {layer} out of range for {len(sites)} sites")
        return len(sites) + layer
    hits = [i for i, lay in enumerate(layers) if lay == layer]
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        raise KeyError(f"layer {layer} matches several sites {[sites[i] for i in hits]}; pass the site name")
    raise KeyError(f"layer {layer} is not among the fitted sites {sites}; available layers: {layers}")


def to_layers_first(X: torch.Tensor) -> torch.Tensor:
    """``[n, L, d]`` -> contiguous ``[L, n, d]`` (one copy) for batched matmuls over layers."""
    return X.transpose(0, 1).contiguous()
