"""Heretic-style abliteration as edit objects: weighted ablation with a per-layer kernel per writer kind, ablation to a
reference level, the interpolated direction index and the direction orthogonalised against the harmless mean.

:class:`WeightedAblation` acts at each residual writer's output (``resid_pre 0`` for the embedding, ``attn_out``,
``mlp_out``, ``experts_out``, ``shared_expert_out``): ``y - w_l (y . r - ref_l) r`` with ``r`` the unit direction
(per layer where it has one), ``w_l`` the writer kind's weight at layer ``l`` and ``ref_l`` the reference level
(0: plain ablation). Its hook form takes ``positions`` / ``scope`` like every steering edit; its :meth:`bake` is
every-token by nature and exact: ``W <- W - w r r^T W`` on the writer (bias too) plus a bias ``w ref r``.
The norm-preserving bake is :class:`steering.abliteration_norm.NormPreservingAblation`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from interp.bundle import check_model
from interp.coerce import check_width
from interp.models import Model
from interp.sites import Site
from steering._args import (
    Layers,
    as_tensor,
    check_finite,
    label_rows,
    per_layer_vectors,
    resolve_layers,
    unit,
)
from steering.applying import SiteEdit, apply
from steering.baking import (
    BakeResult,
    _edit,
    _hook_free_copy,
    _logits,
    _moe_here,
    _probe_ids,
    _Target,
    _targets,
    _untie,
    check_in_memory,
)
from steering.bias import _add_to, _give_biases, _memory_biases, _zero_bias
from steering.fused import LowRankEdit
from steering.interventions import RESIDUAL, Condition, _Intervention

KINDS = ("embed", "attn", "mlp", "experts", "shared_expert")   # the writer kinds a kernel is given for
SITE_OF = {"embed": "resid_pre", "attn": "attn_out", "mlp": "mlp_out", "experts": "experts_out",
           "shared_expert": "shared_expert_out"}


@dataclass(frozen=True)
class AblationKernel:
    """Heretic's layer kernel: weight ``max_weight`` at layer ``max_weight_position`` (a float), falling linearly to
    ``min_weight`` at distance ``min_weight_distance``, zero beyond it."""

    max_weight: float
    max_weight_position: float
    min_weight: float
    min_weight_distance: float

    def __post_init__(self) -> None:
        for name in ("max_weight", "max_weight_position", "min_weight", "min_weight_distance"):
            check_finite(getattr(self, name), f"AblationKernel {name}")
        if self.min_weight > self.max_weight:
            raise ValueError(f"AblationKernel min_weight {self.min_weight} is above max_weight {self.max_weight}; the "
                             f"kernel falls from max_weight at its position to min_weight: swap them")
        if self.min_weight_distance < 0:
            raise ValueError(f"AblationKernel min_weight_distance {self.min_weight_distance} is negative; it is a "
                             f"number of layers (0: the position's layer alone)")

    def weights(self, n_layers: int) -> dict[int, float]:
        """``{layer: weight}`` for every layer of a model of ``n_layers`` (0 beyond the distance)."""
        p, dist = float(self.max_weight_position), float(self.min_weight_distance)
        if not 0 <= p <= n_layers - 1:
            raise ValueError(f"AblationKernel max_weight_position {p} is beyond the model's {n_layers} layers; give a "
                             f"position in [0, {n_layers - 1}]")
        out = {}
        for layer in range(n_layers):
            d = abs(layer - p)
            if d > dist:
                out[layer] = 0.0
            else:
                out[layer] = self.max_weight if dist == 0 else \
                    self.max_weight + d / dist * (self.min_weight - self.max_weight)
        return out


def layer_weights(kernel: Any, n_layers: int, what: str) -> dict[int, float]:
    """``{layer: weight}`` from an :class:`AblationKernel`, one number (every layer), ``{layer: weight}`` or a list
    of one weight per layer."""
    if isinstance(kernel, AblationKernel):
        return kernel.weights(n_layers)
    if isinstance(kernel, (int, float)) and not isinstance(kernel, bool):
        w = check_finite(kernel, what)
        return {layer: w for layer in range(n_layers)}
    if isinstance(kernel, Mapping):
        return {resolve_layers(k, n_layers, what=what)[0]: check_finite(v, f"{what}[{k}]") for k, v in kernel.items()}
    if isinstance(kernel, (Sequence, torch.Tensor)) and not isinstance(kernel, str):
        items = [check_finite(v, what) for v in kernel]
        if len(items) != n_layers:
            raise ValueError(f"{what} has {len(items)} weights but the model has {n_layers} layers; give one weight per "
                             f"layer, a {{layer: weight}} dict, or an AblationKernel")
        return dict(enumerate(items))
    raise TypeError(f"{what} must be an AblationKernel, a number, a list of per-layer weights or a {{layer: weight}} "
                    f"dict, got {type(kernel).__name__}")


def direction_at(directions: Any, index: float) -> torch.Tensor:
    """Heretic's direction index: ``unit(lerp(dir[floor i], dir[ceil i], frac i))`` over per-layer directions
    (``[n, d]``, ``{layer: [d]}`` or a probes Direction; ``index`` counts the table's layers); ``[d]`` float32."""
    table = per_layer_vectors(directions, "direction_at directions")
    if isinstance(table, torch.Tensor):
        if table.dim() == 1:
            raise ValueError("direction_at needs per-layer directions ([n_layers, d] or {layer: [d]}), got one vector")
        table = dict(enumerate(table))
    i = check_finite(index, "direction index")
    lo, hi = math.floor(i), math.ceil(i)
    keys = sorted(table)
    if not keys[0] <= i <= keys[-1]:
        raise ValueError(f"direction index {i} is outside the layers of the directions ({keys[0]}..{keys[-1]})")
    for k in (lo, hi):
        if k not in table:
            raise ValueError(f"direction index {i} needs layers {lo} and {hi}, but there is no direction for layer "
                             f"{k} (the table covers {keys})")
    v = torch.lerp(table[lo].double(), table[hi].double(), i - lo)
    return unit(v, f"the direction at index {i}").float()


def orthogonalize(direction: Any, mean: Any) -> torch.Tensor:
    """``unit(r - (r . m) m / |m|^2)``: the part of the direction orthogonal to the harmless mean ``m`` (``[d]``)."""
    r, m = as_tensor(direction, "direction").double(), as_tensor(mean, "harmless mean").double()
    if r.dim() != 1 or m.dim() != 1:
        raise ValueError(f"orthogonalize takes one direction [d] and one mean [d], got {tuple(r.shape)} and "
                         f"{tuple(m.shape)}; orthogonalise per layer")
    check_width(m, r.shape[0], "harmless mean", "the direction has")
    mm = float(m @ m)
    if not mm > 0:
        raise ValueError("the harmless mean is zero; nothing to orthogonalise against")
    return unit(r - (r @ m) / mm * m, "the orthogonalised direction (the direction is parallel to the mean)").float()


def writer_kernels(kernel: Any, writers: Sequence[str]) -> dict[str, Any]:
    """``{writer kind: kernel}``: a dict keyed by writer kinds, or one kernel for every kind but the embedding."""
    ws = (writers,) if isinstance(writers, str) else tuple(writers)
    bad = [w for w in ws if w not in KINDS]
    if bad or not ws:
        raise ValueError(f"unknown writers {bad or ws}; choose from {KINDS}")
    if isinstance(kernel, Mapping) and kernel and all(isinstance(k, str) for k in kernel):
        extra = [k for k in kernel if k not in ws]
        missing = [w for w in ws if w not in kernel]
        if extra or missing:
            raise ValueError(f"kernel names writers {sorted(kernel)} but writers={ws}: "
                             f"{f'no kernel for {missing}' if missing else f'{extra} not in writers'}")
        out = dict(kernel)
    else:
        if "embed" in ws:
            raise ValueError("the embedding has no layers: give its weight by name, kernel={'embed': 0.5, 'attn': ...}")
        out = {w: kernel for w in ws}
    if "embed" in out and not isinstance(out["embed"], (int, float)):
        raise TypeError(f"the embedding's kernel is one weight (a number), got {type(out['embed']).__name__}")
    return out


@dataclass(eq=False)
class WeightedAblation(_Intervention):
    """``y - w_l (y . r - ref_l) r`` at each chosen writer's output, ``w_l`` from ``kernel`` (one for all writer
    kinds, or ``{kind: kernel}``: see :func:`layer_weights`; the embedding's is one number). ``reference``: ``None``
    (ablate to 0), a level (a number, or ``{layer: level}``), or vectors whose projection is the level (the harmless
    mean: ``[d]``, ``[n_layers, d]``, ``{layer: [d]}``). ``direction``: ``[d]`` or per layer, like :class:`Ablate`."""

    direction: Any
    kernel: Any = 1.0
    writers: str | Sequence[str] = ("attn", "mlp")
    reference: Any = None
    layers: Layers = "all"
    positions: Any = "all"
    scope: str = "both"
    condition: Condition | None = None

    def __post_init__(self) -> None:
        self._vecs = per_layer_vectors(self.direction, "WeightedAblation direction")
        self._kernels = writer_kernels(self.kernel, self.writers)
        self.sites = tuple(SITE_OF[w] for w in self._kernels)
        self._common_checks()
        ref = self.reference
        if ref is None or isinstance(ref, (int, float)):
            self._ref = 0.0 if ref is None else check_finite(ref, "reference level")
        elif isinstance(ref, Mapping) and all(isinstance(v, (int, float)) for v in ref.values()):
            self._ref = {int(k): check_finite(v, f"reference[{k}]") for k, v in ref.items()}
        else:
            self._ref = per_layer_vectors(ref, "reference")

    def _level(self, model: Model, layer: int, r: torch.Tensor) -> float:
        """The reference level at ``layer`` for unit ``r`` (a projection where the reference is a vector)."""
        ref = self._ref
        if isinstance(ref, float):
            return ref
        if isinstance(ref, dict) and ref and not isinstance(next(iter(ref.values())), torch.Tensor):
            if layer not in ref:
                raise ValueError(f"reference has no level for layer {layer}; it covers {sorted(ref)}")
            return ref[layer]
        table = label_rows(ref, self.layers, model.n_layers, "reference") \
            if isinstance(ref, torch.Tensor) and ref.dim() == 2 else ref
        v = table if isinstance(table, torch.Tensor) else table.get(layer)
        if v is None:
            raise ValueError(f"reference has no vector for layer {layer}; it covers {sorted(table)}")
        check_width(v, model.d_model, "reference", RESIDUAL)
        return float(v.double() @ r)

    def plan(self, model: Model) -> list[tuple[str, int, float, torch.Tensor, float]]:
        """``[(writer kind, layer, weight, unit r [d] float64, reference level)]``, zero weights left out
        (the embedding at layer 0, with layer 0's direction and level)."""
        check_model(self.direction, model, "the WeightedAblation direction")
        table = self._table(model)
        layers = self._layers_of(model, table)
        out = []
        for kind, kern in self._kernels.items():
            if kind == "embed":
                weights = {0: check_finite(kern, "embed weight")}
            else:
                weights = layer_weights(kern, model.n_layers, f"the {kind} kernel")
            unplaced = [layer for layer, w in weights.items() if w and layer not in layers]
            if unplaced and isinstance(self.layers, str):
                raise ValueError(f"the {kind} kernel weighs layers {unplaced} but the direction has none there (it "
                                 f"covers {layers}); give a direction for every weighted layer, a kernel that is 0 "
                                 f"there, or layers=[...] to act on fewer")
            for layer in layers:
                w = weights.get(layer, 0.0)
                if w == 0.0 or (kind == "embed" and layer != 0):
                    continue
                if kind in ("experts", "shared_expert") and not _moe_here(model, layer):
                    raise ValueError(f"layer {layer}'s MLP is dense: it has no {kind}; use writers 'mlp'")
                r = unit(self._vector(table, layer, model.d_model).double(), "direction")
                out.append((kind, layer, w, r, self._level(model, layer, r)))
        return out

    def site_edits(self, model: Model) -> dict[str, SiteEdit]:
        out: dict[str, SiteEdit] = {}
        cond_table = None if self.condition is None else self.condition.table(model.n_layers, self.layers)
        for kind, layer, w, r, ref in self.plan(model):
            cond = None if self.condition is None else self.condition.at(layer, model.d_model, cond_table)
            edit = LowRankEdit(w * r[None], r[None].clone(), w * ref * r if ref else None)
            c = self.condition
            out[Site(SITE_OF[kind], layer).name] = SiteEdit(edit, self.scope, self.positions, cond,
                                                             c.threshold if c else 0.0, c.above if c else True)
        return out

    def bake(self, model: Model, inplace: bool = False, measure: bool = True,
             check_ids: torch.Tensor | None = None) -> BakeResult:
        """The same edit in the writers' weights: :func:`bake_weighted`."""
        return bake_weighted(model, self, inplace=inplace, measure=measure, check_ids=check_ids)


def measured(model: Model, edit: Any, ids: torch.Tensor | None) -> torch.Tensor | None:
    """Logits of ``ids`` under ``edit`` applied by hooks, the reference a bake is measured against (None: no ids)."""
    if ids is None:
        return None
    with apply(model, edit):
        return _logits(model, ids)


def every_token(edit: Any, what: str) -> None:
    """Refuse a scope, positions or a condition: a baked weight acts on every token of every pass."""
    if edit.scope != "both" or edit.positions != "all" or getattr(edit, "condition", None) is not None:
        raise ValueError(f"{what}: a baked weight acts on every token, so it equals the hooks only with scope='both', "
                         f"positions='all' and no condition (got scope={edit.scope!r}, positions={edit.positions!r}); "
                         f"apply the edit with hooks (steering.apply / steering.generate) for the rest")


def targets_of(model: Model, kind: str, layer: int, post_norm_ok: bool = False) -> list[_Target]:
    """The weights a writer kind has at ``layer`` (``mlp`` of a mixture of experts: the experts and the shared one);
    a writer before a post-sublayer norm is refused (a weight edit cannot equal an edit after the norm)."""
    spec = model.spec
    if kind != "embed" and spec.post_sublayer_norms and not post_norm_ok:
        raise ValueError(f"{spec.family} normalises each sublayer's output ({spec.attn_out}, {spec.mlp_out}), so a "
                         f"weight edit of the {kind} writer cannot equal the edit at {SITE_OF[kind]} (the norm rescales "
                         f"the rest); use steering.WriterAblation (the same edit of the writer's own output, before the norm: exact to "
                         f"bake), bake writers=('embed',) only, or apply the edit with hooks")
    names = {"embed": ("embed", "pos_embed"), "mlp": ("experts", "shared_expert") if _moe_here(model, layer)
             else ("mlp",)}.get(kind, (kind,))
    return _targets(model, names, [layer])


def _bias_for_reference(out: Model, plan: list, notes: list[str]) -> None:
    """Give a zero bias to each writer that needs one for its reference level (config flag where there is one)."""
    need = [(k, layer) for k, layer, _, _, ref in plan if ref and k != "embed"]
    for k, layer in need:
        if k in ("experts",) or (k == "mlp" and _moe_here(out, layer)):
            raise ValueError(f"a reference level at layer {layer}'s routed experts is a bias on each expert, which the "
                             f"router weighs (its weights need not sum to 1): not one level; put the reference on "
                             f"'attn' or 'shared_expert', or apply the edit with hooks")
    dense = [(k, layer) for k, layer in need if k in ("attn", "mlp")
             and getattr(targets_of(out, k, layer)[0].module, "bias", None) is None]
    flagged = {k for k, _ in dense if hasattr(out.hf.config, {"attn": "attention_bias", "mlp": "mlp_bias"}[k])}
    if flagged:
        _give_biases(out, flagged)
        notes.append(f"set config flags for {sorted(flagged)} so the reference biases save and reload")
    rest = [key for key in dense if key[0] not in flagged]
    if rest:
        notes.append(_memory_biases(out, rest))
    for k, layer in need:
        if k == "shared_expert":
            mod = targets_of(out, k, layer)[0].module
            if mod.bias is None:
                _zero_bias(mod, torch.Size([mod.weight.shape[0]]))
                notes.append(f"layer {layer}'s shared expert got a bias no config builds: exact in memory only")


def bake_weighted(model: Model, edit: WeightedAblation, inplace: bool = False, measure: bool = True,
                  check_ids: torch.Tensor | None = None) -> BakeResult:
    """Bake a :class:`WeightedAblation`: ``W <- W - w r r^T W`` (and the bias) at each writer, plus a bias
    ``w ref r`` (the embedding: every row) for a reference level; exact, measured against the hooks on ``check_ids``
    (default 2 x 16 random tokens). Returns a copy (or ``model`` with ``inplace=True``) in a :class:`BakeResult`."""
    model.require_local("the weight edit (WeightedAblation.bake)")
    check_in_memory(model, "WeightedAblation.bake")
    every_token(edit, "WeightedAblation.bake")
    plan = edit.plan(model)
    for kind, layer, *_ in plan:
        targets_of(model, kind, layer)                       # refuse before copying anything
    ids = _probe_ids(model, check_ids) if measure else None
    ref_logits = measured(model, edit, ids)
    out = model if inplace else _hook_free_copy(model)
    notes: list[str] = []
    if any(k == "embed" for k, *_ in plan) and _untie(out):
        notes.append("untied the embedding from the unembedding (lm_head keeps the original weights)")
    _bias_for_reference(out, plan, notes)
    edited = []
    for kind, layer, w, r, ref in plan:
        for t in targets_of(out, kind, layer):
            _edit(t, r[None], w)
            edited.append(t.name)
        if ref:
            writer = "embed" if kind == "embed" else kind
            if writer in ("attn", "mlp", "embed"):
                _add_to(out, writer, None if writer == "embed" else layer, w * ref * r)
            else:
                b = targets_of(out, kind, layer)[0].module.bias
                with torch.no_grad():
                    b.add_((w * ref * r).to(b.device, b.dtype))
    res = BakeResult(out, tuple(edit._kernels), edited, True, notes=notes)
    if ref_logits is not None:
        err = (_logits(out, ids) - ref_logits).abs().max().item()
        res.max_logit_error, res.rel_logit_error = err, err / max(ref_logits.abs().max().item(), 1e-30)
    return res
