"""Interventions as small composable objects: add, ablate a direction or subspace, clamp a projection.

Each names its ``layers`` (``"all"``, an int, a list; negative from the end), its ``sites`` (residual-width
site kinds: ``resid_pre``, ``resid_mid``, ``resid_post``, ``attn_out``, ``mlp_out``), its ``positions``
(``"all"``, ``"post_instruction"``, or prompt positions, negative from the prompt's end) and its
``scope`` (``"prompt"``, ``"generated"``, ``"both"``). ``condition=Condition(c, t)`` (or ``.when(c, t)``)
makes it act only on tokens whose projection on unit ``c`` is above ``t`` (below with ``above=False``).

Vectors are a tensor ``[d]`` (shared by all layers), ``[n_layers, d]`` / ``{layer: [d]}`` (one per layer),
or any object with a ``.vectors`` tensor (a ``probes`` Direction; its ``.layers`` names the rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from interp.coerce import check_width
from interp.models import Model
from interp.sites import Site
from steering._checks import (
    Layers,
    as_tensor,
    check_finite,
    check_positions,
    check_scope,
    orthonormal,
    per_layer_vectors,
    resolve_kinds,
    resolve_layers,
    unit,
)
from steering.apply import SiteEdit, _native_fn
from steering.fused import LowRankEdit

RESIDUAL = "the model's residual stream has"  # what a steering vector's width is checked against


@dataclass(eq=False)
class Condition:
    """Gate: act where ``x . unit(direction) > threshold`` (``< threshold`` when ``above=False``)."""

    direction: Any
    threshold: float = 0.0
    above: bool = True

    def __post_init__(self) -> None:
        self._vecs = per_layer_vectors(self.direction, "condition direction")
        self.threshold = check_finite(self.threshold, "condition threshold")

    def at(self, layer: int, d_model: int) -> torch.Tensor:
        v = self._vecs if isinstance(self._vecs, torch.Tensor) else self._vecs.get(layer)
        if v is None:
            raise ValueError(f"the condition has no direction for layer {layer}; it covers {sorted(self._vecs)}")
        check_width(v, d_model, "condition direction", RESIDUAL)
        return unit(v, "condition direction")


class _Intervention:
    """Shared machinery: resolve layers and sites, build one :class:`SiteEdit` per (layer, site)."""

    _vecs: torch.Tensor | dict[int, torch.Tensor]
    layers: Layers
    sites: Any
    positions: Any
    scope: str
    condition: Condition | None

    def _common_checks(self) -> None:
        self.kinds = resolve_kinds(self.sites)
        self.scope = check_scope(self.scope)
        self.positions = check_positions(self.positions, self.scope)
        if self.condition is not None and not isinstance(self.condition, Condition):
            raise TypeError(f"condition must be a steering.Condition, got {type(self.condition).__name__}")

    def _edit(self, vec: torch.Tensor, layer: int) -> LowRankEdit:
        raise NotImplementedError

    def _vector(self, layer: int, d_model: int) -> torch.Tensor:
        v = self._vecs if isinstance(self._vecs, torch.Tensor) else self._vecs[layer]
        check_width(v, d_model, f"{type(self).__name__} vector", RESIDUAL)
        return v

    def resolved_layers(self, model: Model) -> list[int]:
        available = None if isinstance(self._vecs, torch.Tensor) else list(self._vecs)
        if available is not None:  # per-layer input: normalise negative keys once
            self._vecs = {resolve_layers(k, model.n_layers, what=type(self).__name__)[0]: v
                          for k, v in self._vecs.items()}
            available = list(self._vecs)
        return resolve_layers(self.layers, model.n_layers, available, what=type(self).__name__)

    def site_edits(self, model: Model) -> dict[str, SiteEdit]:
        """``{site name: SiteEdit}`` for every (layer, site kind) this intervention touches."""
        out: dict[str, SiteEdit] = {}
        for layer in self.resolved_layers(model):
            edit = self._edit(self._vector(layer, model.d_model), layer)
            cond = self.condition.at(layer, model.d_model) if self.condition is not None else None
            for kind in self.kinds:
                if kind == "resid_mid" and model.spec.resid_mid_in is None:
                    raise ValueError(f"{model.spec.family} has a parallel residual: there is no resid_mid; use "
                                     f"resid_pre / attn_out / mlp_out")
                out[Site(kind, layer).name] = SiteEdit(
                    edit, self.scope, self.positions, cond,
                    self.condition.threshold if self.condition else 0.0,
                    self.condition.above if self.condition else True)
        return out

    def hook_fns(self, model: Model) -> dict[str, Any]:
        """The shared protocol: ``{site name: fn(x, ctx)}`` for ``interp.hooks.hooks``."""
        return {site: _native_fn([e], "auto") for site, e in self.site_edits(model).items()}

    def when(self, direction: Any, threshold: float, above: bool = True):
        """A copy that acts only where the projection on ``direction`` passes ``threshold``."""
        return replace(self, condition=Condition(direction, threshold, above))


@dataclass(eq=False)
class AddVector(_Intervention):
    """``x + alpha * v`` at ``layers`` x ``sites``. Same convention as the steering-vectors library when
    ``sites='resid_post'`` (a decoder block's output) and ``positions='all'``."""

    vector: Any
    layers: Layers
    alpha: float = 1.0
    sites: str | Sequence[str] = "resid_post"
    positions: Any = "all"
    scope: str = "both"
    condition: Condition | None = None

    def __post_init__(self) -> None:
        self._vecs = per_layer_vectors(self.vector, "AddVector vector")
        self.alpha = check_finite(self.alpha, "AddVector alpha")
        self._common_checks()

    def _edit(self, vec: torch.Tensor, layer: int) -> LowRankEdit:
        return LowRankEdit.add(self.alpha * vec)


@dataclass(eq=False)
class Ablate(_Intervention):
    """Project out a direction: ``x - (x . r) r`` with ``r = unit(direction)``."""

    direction: Any
    layers: Layers = "all"
    sites: str | Sequence[str] = "resid_post"
    positions: Any = "all"
    scope: str = "both"
    condition: Condition | None = None

    def __post_init__(self) -> None:
        self._vecs = per_layer_vectors(self.direction, f"{type(self).__name__} direction")
        self._common_checks()

    def _edit(self, vec: torch.Tensor, layer: int) -> LowRankEdit:
        return LowRankEdit.project_out(unit(vec, "direction")[None])


@dataclass(eq=False)
class DirectionalAblation(Ablate):
    """The refusal-direction recipe's "ablate everywhere": project the direction out of every layer's
    ``resid_pre``, ``attn_out`` and ``mlp_out`` (so ``resid_mid`` and ``resid_post`` follow)."""

    sites: str | Sequence[str] = ("resid_pre", "attn_out", "mlp_out")


@dataclass(eq=False)
class Clamp(_Intervention):
    """Set the projection on ``r = unit(direction)`` to ``value``: ``x + (value - x . r) r``."""

    direction: Any
    value: float
    layers: Layers
    sites: str | Sequence[str] = "resid_post"
    positions: Any = "all"
    scope: str = "both"
    condition: Condition | None = None

    def __post_init__(self) -> None:
        self._vecs = per_layer_vectors(self.direction, "Clamp direction")
        self.value = check_finite(self.value, "Clamp value")
        self._common_checks()

    def _edit(self, vec: torch.Tensor, layer: int) -> LowRankEdit:
        return LowRankEdit.clamp(unit(vec, "direction"), self.value)


@dataclass(eq=False)
class AblateSubspace(_Intervention):
    """Project out the span of an orthonormal basis: ``x - Q^T Q x``; ``basis [k, d]`` (all layers),
    ``[n_layers, k, d]`` or ``{layer: [k, d]}``. A non-orthonormal basis is an error unless
    ``orthonormalize=True`` (QR, same span, with a warning)."""

    basis: Any
    layers: Layers = "all"
    sites: str | Sequence[str] = "resid_post"
    positions: Any = "all"
    scope: str = "both"
    condition: Condition | None = None
    orthonormalize: bool = False

    def __post_init__(self) -> None:
        b = self.basis
        if isinstance(b, dict):
            self._vecs = {int(k): orthonormal(as_tensor(v, f"basis[{k}]"), f"basis[{k}]", self.orthonormalize)
                          for k, v in b.items()}
        else:
            t = as_tensor(b, "basis")
            if t.dim() == 1:
                t = t[None]
            if t.dim() == 2:
                self._vecs = orthonormal(t, "basis", self.orthonormalize)
            elif t.dim() == 3:
                layers = getattr(b, "layers", None)
                keys = [int(x) for x in layers] if layers is not None else list(range(t.shape[0]))
                self._vecs = {k: orthonormal(t[i], f"basis[{k}]", self.orthonormalize) for i, k in enumerate(keys)}
            else:
                raise ValueError(f"basis must be [k, d] or [n_layers, k, d], got shape {tuple(t.shape)}")
        self._common_checks()

    def _edit(self, vec: torch.Tensor, layer: int) -> LowRankEdit:
        return LowRankEdit.project_out(vec)
