"""Abliteration of the writers' weights: :class:`WriterAblation` (heretic's ``W - w r r^T W``) and
:class:`NormPreservingAblation` (heretic's ``row_normalization="full"``, Lai's norm-preserving biprojection).

Each writer weight ``W`` (residual axis ``d``, input axis ``n``) is cut into its ``d`` rows, one per residual
coordinate, as heretic does with the HF ``[d_model, d_in]`` weight (``vector_norm(W, dim=1)``): ``N = W / |row|``,
``N' = N - w r (r^T N)``, then every row of ``N'`` is rescaled to its original norm. A bias has no rows: it is
ablated plainly (``b - w (b . r) r``). Unlike heretic (a rank-3 LoRA approximation) the edited weight is exact.

The norm-preserving edit has no activation-space form, so the hook form of both (``weights(model)``, entered by
``steering.apply``) computes each writer's output with the edited weight on the fly: a forward hook on each
``nn.Linear`` / GPT-2 ``Conv1D`` writer, the edited tensor swapped in (and always restored) for fused expert
weights. It acts on every token by nature, before any post-sublayer norm; the bake equals it in every family.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from interp.hooking import module_hooks
from interp.models import Model
from steering._args import Layers
from steering.abliteration import WeightedAblation, every_token, measured, targets_of
from steering.baking import BakeResult, _hook_free_copy, _logits, _probe_ids, _Target, check_in_memory
from steering.bias import FLAGS, _give_biases, _zero_bias

Edited = tuple[_Target, torch.Tensor, torch.Tensor | None]   # a writer, its edited weight and bias


def ablated_weight(W: torch.Tensor, r: torch.Tensor, w: float, out_dim: int, norm_preserving: bool) -> torch.Tensor:
    """``W`` with its residual axis ``out_dim`` (width ``d``) ablated by ``w`` along unit ``r [d]``: ``W - w r r^T W``;
    ``norm_preserving``: on row-normalised rows, each row then rescaled to its original norm. Same shape and dtype."""
    cdt = torch.float64 if W.numel() <= (1 << 24) else torch.float32
    x = W.detach().to(cdt).movedim(out_dim, 0)
    shape = x.shape
    x = x.reshape(shape[0], -1)
    norms = x.norm(dim=1, keepdim=True)
    n = x / norms.clamp_min(1e-30) if norm_preserving else x
    rd = r.to(x.device, cdt)
    n = n - w * torch.outer(rd, rd @ n)
    y = n / n.norm(dim=1, keepdim=True).clamp_min(1e-30) * norms if norm_preserving else n
    return y.reshape(shape).movedim(0, out_dim).to(W.dtype)


def _ablated_bias(b: torch.Tensor | None, r: torch.Tensor, w: float, ref: float, like: torch.Tensor
                  ) -> torch.Tensor | None:
    """``b - w (b . r - ref) r`` (``b`` absent: ``w ref r``, or None when ``ref`` is 0)."""
    if b is None and not ref:
        return None
    x = torch.zeros(like.shape[0], dtype=torch.float64, device=like.device) if b is None else b.detach().double()
    rd = r.to(x.device, torch.float64)
    return (x - w * ((x @ rd)[..., None] - ref) * rd).to(like.dtype)


def _edited(t: _Target, r: torch.Tensor, w: float, ref: float, norm_preserving: bool) -> Edited:
    """The edited weight and bias of one writer target."""
    mod = t.module
    if t.layout in ("linear", "rows"):
        W = mod.weight
        out_dim = 0 if t.layout == "linear" else W.dim() - 1
        return t, ablated_weight(W, r, w, out_dim, norm_preserving), \
            _ablated_bias(getattr(mod, "bias", None), r, w, ref, W.movedim(out_dim, 0))
    W = getattr(mod, t.attr)
    axis = 0 if t.layout == "experts" else 1
    new = torch.stack([ablated_weight(W[e], r, w, axis, norm_preserving) for e in range(W.shape[0])])
    b = getattr(mod, f"{t.attr}_bias", None)
    return t, new, _ablated_bias(b if isinstance(b, torch.Tensor) else None, r, w, 0.0, W)


def _output_hook(layout: str, W: torch.Tensor, b: torch.Tensor | None):
    """A forward hook returning the writer's output computed with ``W`` / ``b`` (Linear, or GPT-2's Conv1D)."""
    def hook(mod: torch.nn.Module, args: tuple, out: Any) -> torch.Tensor:
        x = args[0]
        if layout == "linear":
            return F.linear(x, W.to(x.dtype), None if b is None else b.to(x.dtype))
        y = x.reshape(-1, x.shape[-1]) @ W.to(x.dtype)
        y = y if b is None else y + b.to(x.dtype)
        return y.reshape(*x.shape[:-1], W.shape[-1])
    return hook


@dataclass(eq=False)
class _WriterEdit:
    """A weighted ablation of the writers' weights themselves, with a per-layer ``kernel`` per writer kind (as
    :class:`~steering.abliteration.WeightedAblation`); its hook form edits each writer's own output, so it acts
    before a post-sublayer norm and its bake is exact in every family. Every token only."""

    direction: Any
    kernel: Any = 1.0
    writers: str | Sequence[str] = ("attn", "mlp")
    layers: Layers = "all"
    positions: Any = "all"
    scope: str = "both"

    _norm: ClassVar[bool] = False

    def __post_init__(self) -> None:
        name = type(self).__name__
        if "embed" in ((self.writers,) if isinstance(self.writers, str) else tuple(self.writers)):
            raise ValueError(f"{name} edits the writers of a layer; ablate the embedding with "
                             f"WeightedAblation(writers=('embed',)), exact in every family")
        every_token(self, f"{name} (a weight edit, applied to every token)")
        self._inner = WeightedAblation(self.direction, self.kernel, self.writers, layers=self.layers,
                                       reference=getattr(self, "reference", None))

    def edits(self, model: Model) -> list[Edited]:
        """Every edited writer with its new weight and bias (the originals untouched)."""
        out = []
        for kind, layer, w, r, ref in self._inner.plan(model):
            for t in targets_of(model, kind, layer, post_norm_ok=True):
                if ref and t.layout not in ("linear", "rows"):
                    raise ValueError(f"layer {layer}'s experts are one fused tensor without a bias to hold the "
                                     f"reference level; put the reference on 'attn', or use WeightedAblation hooks")
                out.append(_edited(t, r, w, ref, self._norm))
        return out

    @contextmanager
    def weights(self, model: Model) -> Iterator[None]:
        """The hook form, for ``steering.apply``: each writer computes its output with the edited weight."""
        edits = self.edits(model)
        items = [(t.module, "post", _output_hook(t.layout, W, b)) for t, W, b in edits
                 if t.layout in ("linear", "rows")]
        fused = [(t, W, b) for t, W, b in edits if t.layout not in ("linear", "rows")]
        saved = []
        try:
            for t, W, b in fused:
                names = [t.attr] + ([f"{t.attr}_bias"] if b is not None else [])
                for name, new in zip(names, (W, b)):
                    p = getattr(t.module, name)
                    saved.append((p, p.data))
                    p.data = new
            with module_hooks(items):
                yield
        finally:
            for p, data in saved:
                p.data = data

    def random_like(self, model: Model, seed: int = 0) -> Any:
        """The same edit along a seeded random direction of the same norm (the control of the same strength)."""
        ctrl = self._inner.random_like(model, seed)
        return replace(self, direction=ctrl.direction, layers=ctrl.layers)

    def bake(self, model: Model, inplace: bool = False, measure: bool = True,
             check_ids: torch.Tensor | None = None) -> BakeResult:
        """The edited weights written into a copy (or ``model`` with ``inplace=True``), measured against the hook
        form on ``check_ids`` (default 2 x 16 random tokens)."""
        name = type(self).__name__
        model.require_local(f"the weight edit ({name}.bake)")
        check_in_memory(model, f"{name}.bake")
        ids = _probe_ids(model, check_ids) if measure else None
        ref = measured(model, self, ids)
        out = model if inplace else _hook_free_copy(model)
        edits = self.edits(out)
        notes = _give_missing_biases(out, edits)
        with torch.no_grad():
            for t, W, b in edits:
                w_name = "weight" if t.layout in ("linear", "rows") else t.attr
                getattr(t.module, w_name).copy_(W)
                if b is not None:
                    getattr(t.module, "bias" if w_name == "weight" else f"{t.attr}_bias").copy_(b)
        if self._norm:
            notes.append("norm-preserving: the rows of each writer weight keep their norms")
        res = BakeResult(out, tuple(self._inner._kernels), [t.name for t, _, _ in edits], True, notes=notes)
        if ref is not None:
            err = (_logits(out, ids) - ref).abs().max().item()
            res.max_logit_error, res.rel_logit_error = err, err / max(ref.abs().max().item(), 1e-30)
        return res


def _give_missing_biases(out: Model, edits: list[Edited]) -> list[str]:
    """A zero bias for each edited Linear writer that needs one (a reference level): through the config flag where
    it has one (saved and reloaded), else in memory only (said in the notes; the save paths refuse it)."""
    missing = [t for t, _, b in edits if b is not None and t.layout == "linear" and t.module.bias is None]
    flagged = {t.writer for t in missing if t.writer in FLAGS and hasattr(out.hf.config, FLAGS[t.writer])
               and not (t.writer == "mlp" and out.spec.is_moe)}
    notes = []
    if flagged:
        _give_biases(out, flagged)
        notes.append(f"set config {sorted(FLAGS[w] for w in flagged)}: the reference biases save and reload")
    rest = [t for t in missing if t.module.bias is None]
    for t in rest:
        _zero_bias(t.module, torch.Size([t.module.weight.shape[0]]))
    if rest:
        notes.append(f"{len(rest)} writer biases ({rest[0].name}, ...) have no config flag: exact in memory only; "
                     f"save_for_serving / export_gguf refuse this model (steering.bias.check_saveable)")
    return notes


@dataclass(eq=False)
class WriterAblation(_WriterEdit):
    """``W <- W - w_l r r^T W`` on each writer, its output ``y - w_l (y . r - ref_l) r`` with a ``reference`` level
    (as :class:`~steering.abliteration.WeightedAblation`) taken before any post-sublayer norm: heretic's edit of
    the matrices. Equal to ``WeightedAblation`` where no norm follows the writer; exact to bake everywhere."""

    reference: Any = None


@dataclass(eq=False)
class NormPreservingAblation(_WriterEdit):
    """Heretic's norm-preserving abliteration of the writers ``attn``, ``mlp``, ``experts``, ``shared_expert``."""

    _norm: ClassVar[bool] = True
