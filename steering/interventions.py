"""Interventions as small composable objects: add, ablate a direction or subspace, clamp a projection.

Each names its ``layers`` (``"all"``, an int, a list; negative from the end), its ``sites`` (residual-width
site kinds: ``resid_pre``, ``resid_mid``, ``resid_post``, ``attn_out``, ``mlp_out``; in a mixture of experts also
``experts_out`` and ``shared_expert_out``, the routed and shared parts of ``mlp_out``), its ``positions``
(``"all"``, ``"post_instruction"``, or prompt positions, negative from the prompt's end) and its
``scope`` (``"prompt"``, ``"generated"``, ``"both"``). ``condition=Condition(c, t)`` (or ``.when(c, t)``)
makes it act only on tokens whose projection on unit ``c`` is above ``t`` (below with ``above=False``).

Vectors are a tensor ``[d]`` (shared by all layers), ``{layer: [d]}`` (one per layer), any object with a
``.vectors`` tensor (a ``probes`` Direction: its ``.layers`` / ``.sites`` name the rows), or a bare
``[k, d]`` tensor: its rows are for ``layers=[...]`` (``k`` of them, row ``i`` for ``layers[i]``), or for
layers ``0..n_layers-1`` when ``k == n_layers``; any other bare ``[k, d]`` (k > 1) is an error, since
``d.select(band).raw`` would otherwise steer layers ``0..k-1``.

Strength: ``AddVector(..., unit="residual", norms=steering.residual_norms(model, prompts))`` makes ``alpha``
a fraction of the mean residual norm at each layer (see :mod:`steering.strength`). Every intervention has
``random_like(model, seed)``: the same edit along random directions of the same norm (the control).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from interp.bundle import check_model
from interp.coerce import check_width
from interp.models import Model
from interp.sites import WRITERS, Site, parse_site
from steering._args import (
    Layers,
    as_tensor,
    check_finite,
    check_positions,
    check_scope,
    label_rows,
    magnitude_table,
    object_layers,
    orthonormal,
    own_kind,
    per_layer_vectors,
    resolve_kinds,
    resolve_layers,
    unit,
)
from steering.applying import SiteEdit, _native_fn
from steering.fused import LowRankEdit
from steering.strength import ResidualNorms, norm_table

Table = torch.Tensor | dict[int, torch.Tensor]
UNITS = ("raw", "residual")

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

    def table(self, n_layers: int, layers: Layers) -> Table:
        """The condition's vectors by layer (a bare ``[k, d]`` is labelled like the intervention's)."""
        if isinstance(self._vecs, torch.Tensor) and self._vecs.dim() == 2:
            return label_rows(self._vecs, layers, n_layers, "condition direction")
        return self._vecs

    def at(self, layer: int, d_model: int, table: Table | None = None) -> torch.Tensor:
        vecs = self._vecs if table is None else table
        v = vecs if isinstance(vecs, torch.Tensor) else vecs.get(layer)
        if v is None:
            raise ValueError(f"the condition has no direction for layer {layer}; it covers {sorted(vecs)}")
        check_width(v, d_model, "condition direction", RESIDUAL)
        return unit(v, "condition direction")


def _random_as(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A seeded random stand-in for ``t``: a vector ``[d]`` of the same norm, or an orthonormal ``[k, d]``."""
    if t.dim() == 1:
        r = torch.randn(t.shape[0], generator=gen, dtype=torch.float64)
        return (r / r.norm() * t.double().norm()).to(t.dtype)
    q = torch.linalg.qr(torch.randn(t.shape[1], t.shape[0], generator=gen, dtype=torch.float64))[0]
    return q.T.contiguous().to(t.dtype)


class _Intervention:
    """Shared machinery: resolve layers and sites, build one :class:`SiteEdit` per (layer, site)."""

    _vecs: Table            # a shared vector (basis), a {layer: ...} table, or a bare stack to label
    _shared_dim: int = 1    # dims of one layer's entry: 1 for a vector, 2 for a subspace basis
    _field: str = "direction"  # the dataclass field holding the vectors (for random_like)
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
            raise TypeError(f"condition must be a steering.interventions.Condition, got {type(self.condition).__name__}")

    def _edit(self, vec: torch.Tensor, layer: int) -> LowRankEdit:
        raise NotImplementedError

    def _table(self, model: Model) -> Table:
        """One entry per layer, ``{layer: vector}``, or one shared tensor; bare stacks labelled by ``layers``."""
        what = type(self).__name__
        if isinstance(self._vecs, torch.Tensor):
            if self._vecs.dim() == self._shared_dim:
                return self._vecs
            return label_rows(self._vecs, self.layers, model.n_layers, what)
        return {resolve_layers(k, model.n_layers, what=what)[0]: v for k, v in self._vecs.items()}

    def _vector(self, table: Table, layer: int, d_model: int) -> torch.Tensor:
        v = table if isinstance(table, torch.Tensor) else table[layer]
        check_width(v, d_model, f"{type(self).__name__} vector", RESIDUAL)
        return v

    def _layers_of(self, model: Model, table: Table) -> list[int]:
        available = None if isinstance(table, torch.Tensor) else list(table)
        return resolve_layers(self.layers, model.n_layers, available, what=type(self).__name__)

    def resolved_layers(self, model: Model) -> list[int]:
        """The layers this intervention acts on in ``model``."""
        return self._layers_of(model, self._table(model))

    def site_edits(self, model: Model) -> dict[str, SiteEdit]:
        """``{site name: SiteEdit}`` for every (layer, site kind) this intervention touches."""
        check_model(getattr(self, self._field, None), model, f"the {type(self).__name__} {self._field}")
        out: dict[str, SiteEdit] = {}
        table = self._table(model)
        cond_table = None if self.condition is None else self.condition.table(model.n_layers, self.layers)
        for layer in self._layers_of(model, table):
            edit = self._edit(self._vector(table, layer, model.d_model), layer)
            cond = self.condition.at(layer, model.d_model, cond_table) if self.condition is not None else None
            for kind in self.kinds:
                if kind == "resid_mid" and model.spec.resid_mid_in is None:
                    raise ValueError(f"{model.spec.family} has a parallel residual: there is no resid_mid; use "
                                     f"resid_pre / attn_out / mlp_out")
                out[Site(kind, layer).name] = SiteEdit(
                    edit, self.scope, self.positions, cond,
                    self.condition.threshold if self.condition else 0.0,
                    self.condition.above if self.condition else True)
        return out

    def random_like(self, model: Model, seed: int = 0) -> Any:
        """The same intervention along seeded random directions, each of the norm of the one it replaces
        (a random orthonormal basis of the same rank for a subspace): the control of the same strength."""
        gen = torch.Generator().manual_seed(int(seed))
        table = self._table(model)
        if isinstance(table, torch.Tensor):
            return replace(self, **{self._field: _random_as(table, gen)})
        layers = self._layers_of(model, table)
        return replace(self, **{self._field: {layer: _random_as(table[layer], gen) for layer in layers},
                                "layers": layers})

    def hook_fns(self, model: Model) -> dict[str, Any]:
        """The shared protocol: ``{site name: fn(x, ctx)}`` for ``interp.hooking.hooks``."""
        return {site: _native_fn([e], "auto") for site, e in self.site_edits(model).items()}

    def when(self, direction: Any, threshold: float, above: bool = True):
        """A copy that acts only where the projection on ``direction`` passes ``threshold``."""
        return replace(self, condition=Condition(direction, threshold, above))


def _unit_checks(iv: Any, what: str) -> None:
    """Check ``iv.unit`` / ``iv.norms``: ``"raw"`` takes ``what`` as given, ``"residual"`` as a fraction of each
    layer's mean residual norm (``norms``: :func:`steering.residual_norms` or one number per layer)."""
    name = type(iv).__name__
    if iv.unit not in UNITS:
        raise ValueError(f"{name} unit must be one of {UNITS}, got {iv.unit!r}")
    if iv.unit == "residual" and iv.norms is None:
        raise ValueError("unit='residual' needs norms=: measure them with steering.residual_norms(model, "
                         "prompts, site=...) or give one number per layer")
    if iv.unit == "raw" and iv.norms is not None:
        raise ValueError(f"norms= is only used with unit='residual' ({what} as a fraction of the residual norm); "
                         "pass unit='residual' or drop norms=")
    if isinstance(iv.norms, ResidualNorms) and iv.norms.site not in iv.kinds:
        warnings.warn(f"{name} acts at {iv.kinds} but its norms were measured at {iv.norms.site!r}; "
                      f"measure them at the site you steer", stacklevel=4)
    iv._scale = None


def _unit_table(iv: Any, model: Model) -> None:
    """Resolve ``iv.norms`` to ``{layer: mean norm}`` for this model (``None`` for ``unit='raw'``)."""
    name = type(iv).__name__
    iv._scale = norm_table(iv.norms, model.n_layers, f"{name} norms") if iv.unit == "residual" else None


def _unit_scale(iv: Any, layer: int) -> float:
    """The mean residual norm at ``layer`` (``unit='residual'``), or an error naming the layers measured."""
    if layer not in iv._scale:
        raise ValueError(f"{type(iv).__name__} norms have no value for layer {layer} (they cover "
                         f"{sorted(iv._scale)}); measure it: steering.residual_norms(model, prompts, "
                         f"layers=[..., {layer}])")
    return iv._scale[layer]


@dataclass(eq=False)
class AddVector(_Intervention):
    """``x + alpha * v`` at ``layers`` x ``sites``. Same convention as the steering-vectors library when
    ``sites='resid_post'`` (a decoder block's output) and ``positions='all'``.

    ``sites`` defaults to the site kind a probes Direction was fitted at (``resid_post`` for a bare tensor).
    ``magnitude`` is required for a unit Direction that knows its raw norms when ``unit="raw"``: ``"raw"`` adds
    ``vectors * norms`` (the difference of means itself, as the refusal job adds it), ``"unit"`` the unit vector.

    ``unit`` says what ``alpha`` is measured in. ``"raw"`` (the default, as in 0.1.0): ``v`` is added as given,
    so for a unit-length probes Direction ``alpha`` is an absolute norm, tiny against residual norms of
    100+. ``"residual"``: ``alpha * norms[layer] * v / |v|``, a fraction of the mean residual norm at each
    layer; ``norms`` is :func:`steering.residual_norms` (measured on your prompts) or one number per layer.
    """

    vector: Any
    layers: Layers
    alpha: float = 1.0
    sites: str | Sequence[str] | None = None
    positions: Any = "all"
    scope: str = "both"
    condition: Condition | None = None
    unit: str = "raw"
    norms: ResidualNorms | Any = None
    magnitude: str | None = None

    _field = "vector"

    def __post_init__(self) -> None:
        self.sites = own_kind(self.vector) if self.sites is None else self.sites
        self._vecs = magnitude_table(self.vector, per_layer_vectors(self.vector, "AddVector vector"),
                                     self.magnitude, self.unit)
        self.alpha = check_finite(self.alpha, "AddVector alpha")
        self._common_checks()
        _unit_checks(self, "alpha")

    def site_edits(self, model: Model) -> dict[str, SiteEdit]:
        _unit_table(self, model)
        return super().site_edits(model)

    def _edit(self, vec: torch.Tensor, layer: int) -> LowRankEdit:
        if self._scale is None:
            return LowRankEdit.add(self.alpha * vec)
        return LowRankEdit.add(self.alpha * _unit_scale(self, layer) * unit(vec, "AddVector vector"))

    def added_norms(self, model: Model) -> dict[int, float]:
        """``{layer: norm of what is added}``: the strength in the residual stream's own units."""
        return {parse_site(k).layer: float(e.edit.b.norm()) for k, e in self.site_edits(model).items()}


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


WRITER_SITES = WRITERS  # every writer to the residual stream, layer by layer (interp.sites.WRITERS)


@dataclass(eq=False)
class DirectionalAblation(Ablate):
    """The refusal-direction recipe's "ablate everywhere": project the direction out of every layer's
    ``resid_pre``, ``attn_out`` and ``mlp_out`` (so ``resid_mid`` and ``resid_post`` follow). A Direction fitted
    at one layer is ablated at every layer asked (default all), as the recipe does, not at its own layer only. Same default
    sites as :class:`AblateSubspace`; ``sites="resid_post"`` gives the one-site edit of :class:`Ablate`."""

    sites: str | Sequence[str] = WRITER_SITES

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self._vecs, dict) and len(self._vecs) == 1 and not isinstance(self.direction, dict):
            # a Direction fitted at one layer: ablated at every layer asked (default all), as the recipe does
            self._vecs = next(iter(self._vecs.values()))


@dataclass(eq=False)
class Clamp(_Intervention):
    """Set the projection on ``r = unit(direction)`` to ``value``: ``x + (value - x . r) r``.

    ``unit="residual"`` (with ``norms=``, as for :class:`AddVector`) reads ``value`` as a fraction of each
    layer's mean residual norm, so one value means the same strength at every layer."""

    direction: Any
    value: float
    layers: Layers
    sites: str | Sequence[str] = "resid_post"
    positions: Any = "all"
    scope: str = "both"
    condition: Condition | None = None
    unit: str = "raw"
    norms: ResidualNorms | Any = None

    def __post_init__(self) -> None:
        self._vecs = per_layer_vectors(self.direction, "Clamp direction")
        self.value = check_finite(self.value, "Clamp value")
        self._common_checks()
        _unit_checks(self, "value")

    def site_edits(self, model: Model) -> dict[str, SiteEdit]:
        _unit_table(self, model)
        return super().site_edits(model)

    def _edit(self, vec: torch.Tensor, layer: int) -> LowRankEdit:
        scale = 1.0 if self._scale is None else _unit_scale(self, layer)
        return LowRankEdit.clamp(unit(vec, "direction"), self.value * scale)


@dataclass(eq=False)
class AblateSubspace(_Intervention):
    """Project out the span of an orthonormal basis: ``x - Q^T Q x``; ``basis [k, d]`` (all layers),
    ``{layer: [k, d]}``, a probes Subspace (its ``.bases`` / ``.sites``), or a bare ``[m, k, d]`` (labelled like a
    bare stack of vectors: ``layers=`` with ``m`` layers, or ``m == n_layers``). A non-orthonormal basis is an
    error unless ``orthonormalize=True`` (QR, same span, with a warning).

    By default it covers every writer, like :class:`DirectionalAblation`: ``resid_pre``, ``attn_out`` and
    ``mlp_out`` at every layer (0.1.0 defaulted to ``resid_post`` only; pass ``sites="resid_post"`` for that).
    """

    basis: Any
    layers: Layers = "all"
    sites: str | Sequence[str] = WRITER_SITES
    positions: Any = "all"
    scope: str = "both"
    condition: Condition | None = None
    orthonormalize: bool = False

    _shared_dim = 2
    _field = "basis"

    def __post_init__(self) -> None:
        b = self.basis
        if isinstance(b, dict):
            self._vecs = {int(k): orthonormal(as_tensor(v, f"basis[{k}]"), f"basis[{k}]", self.orthonormalize)
                          for k, v in b.items()}
        else:
            t = as_tensor(getattr(b, "bases", b), "basis")
            if t.dim() == 1:
                t = t[None]
            if t.dim() == 2:
                self._vecs = orthonormal(t, "basis", self.orthonormalize)
            elif t.dim() == 3:
                stack = torch.stack([orthonormal(t[i], f"basis[{i}]", self.orthonormalize) for i in range(t.shape[0])])
                keys = object_layers(b, t.shape[0], "basis")
                self._vecs = stack if keys is None else {k: stack[i] for i, k in enumerate(keys)}
            else:
                raise ValueError(f"basis must be [k, d] or [n_layers, k, d], got shape {tuple(t.shape)}")
        self._common_checks()

    def _edit(self, vec: torch.Tensor, layer: int) -> LowRankEdit:
        return LowRankEdit.project_out(vec)
