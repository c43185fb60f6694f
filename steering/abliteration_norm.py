"""Norm-preserving abliteration (heretic's ``row_normalization="full"``, Lai's norm-preserving biprojection).

Each writer weight ``W`` (residual axis ``d``, input axis ``n``) is cut into its ``d`` rows, one per residual
coordinate, as heretic does with the HF ``[d_model, d_in]`` weight (``vector_norm(W, dim=1)``): ``N = W / |row|``,
``N' = N - w r (r^T N)``, then every row of ``N'`` is rescaled to its original norm. A bias has no rows: it is
ablated plainly (``b - w (b . r) r``). Unlike heretic (a rank-3 LoRA approximation) the edited weight is exact.

This is a weight edit without an activation-space form, so its hook form (``weights(model)``, entered by
``steering.apply``) computes each writer's output with the edited weight on the fly: a forward hook on each
``nn.Linear`` / GPT-2 ``Conv1D`` writer, the edited tensor swapped in (and always restored) for fused expert
weights. It acts on every token by nature; the bake (:meth:`NormPreservingAblation.bake`) equals it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from interp.hooking import module_hooks
from interp.models import Model
from steering._args import Layers
from steering.abliteration import WeightedAblation, every_token, measured, targets_of
from steering.baking import BakeResult, _hook_free_copy, _logits, _probe_ids, _Target, check_in_memory

Edited = tuple[_Target, torch.Tensor, torch.Tensor | None]   # a writer, its edited weight and bias


def norm_preserved(W: torch.Tensor, r: torch.Tensor, w: float, out_dim: int) -> torch.Tensor:
    """``W`` with its residual axis ``out_dim`` (width ``d``) ablated by ``w`` along unit ``r [d]`` on row-normalised
    rows, each row then rescaled to its original norm; same shape and dtype as ``W``."""
    cdt = torch.float64 if W.numel() <= (1 << 24) else torch.float32
    x = W.detach().to(cdt).movedim(out_dim, 0)
    shape = x.shape
    x = x.reshape(shape[0], -1)
    norms = x.norm(dim=1, keepdim=True)
    n = x / norms.clamp_min(1e-30)
    rd = r.to(x.device, cdt)
    n = n - w * torch.outer(rd, rd @ n)
    y = n / n.norm(dim=1, keepdim=True).clamp_min(1e-30) * norms
    return y.reshape(shape).movedim(0, out_dim).to(W.dtype)


def _ablated_bias(b: torch.Tensor | None, r: torch.Tensor, w: float) -> torch.Tensor | None:
    if b is None:
        return None
    x = b.detach().double()
    rd = r.to(x.device, torch.float64)
    return (x - w * (x @ rd)[..., None] * rd).to(b.dtype)


def _edited(t: _Target, r: torch.Tensor, w: float) -> Edited:
    """The edited weight and bias of one writer target."""
    mod = t.module
    if t.layout in ("linear", "rows"):
        W = mod.weight
        return t, norm_preserved(W, r, w, 0 if t.layout == "linear" else W.dim() - 1), \
            _ablated_bias(getattr(mod, "bias", None), r, w)
    W = getattr(mod, t.attr)
    axis = 0 if t.layout == "experts" else 1
    new = torch.stack([norm_preserved(W[e], r, w, axis) for e in range(W.shape[0])])
    b = getattr(mod, f"{t.attr}_bias", None)
    return t, new, _ablated_bias(b if isinstance(b, torch.Tensor) else None, r, w)


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
class NormPreservingAblation:
    """Heretic's norm-preserving abliteration of the writers ``attn``, ``mlp``, ``experts``, ``shared_expert`` with
    a weight per layer from ``kernel`` (as :class:`~steering.abliteration.WeightedAblation`); every token only."""

    direction: Any
    kernel: Any = 1.0
    writers: str | Sequence[str] = ("attn", "mlp")
    layers: Layers = "all"
    positions: Any = "all"
    scope: str = "both"

    def __post_init__(self) -> None:
        if "embed" in ((self.writers,) if isinstance(self.writers, str) else tuple(self.writers)):
            raise ValueError("NormPreservingAblation restores the norms of a writer's rows; the embedding's rows are "
                             "tokens, not residual coordinates: ablate it with WeightedAblation(writers=('embed',))")
        every_token(self, "NormPreservingAblation (a weight edit without an activation-space form)")
        self._inner = WeightedAblation(self.direction, self.kernel, self.writers, layers=self.layers)

    def edits(self, model: Model) -> list[Edited]:
        """Every edited writer with its new weight and bias (the originals untouched)."""
        out = []
        for kind, layer, w, r, _ in self._inner.plan(model):
            out += [_edited(t, r, w) for t in targets_of(model, kind, layer, post_norm_ok=True)]
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

    def random_like(self, model: Model, seed: int = 0) -> NormPreservingAblation:
        """The same edit along a seeded random direction of the same norm (the control of the same strength)."""
        ctrl = self._inner.random_like(model, seed)
        return replace(self, direction=ctrl.direction, layers=ctrl.layers)

    def bake(self, model: Model, inplace: bool = False, measure: bool = True,
             check_ids: torch.Tensor | None = None) -> BakeResult:
        """The edited weights written into a copy (or ``model`` with ``inplace=True``), measured against the hook
        form on ``check_ids`` (default 2 x 16 random tokens)."""
        model.require_local("the weight edit (NormPreservingAblation.bake)")
        check_in_memory(model, "NormPreservingAblation.bake")
        ids = _probe_ids(model, check_ids) if measure else None
        ref = measured(model, self, ids)
        out = model if inplace else _hook_free_copy(model)
        names = []
        with torch.no_grad():
            for t, W, b in self.edits(out):
                w_name = "weight" if t.layout in ("linear", "rows") else t.attr
                getattr(t.module, w_name).copy_(W)
                if b is not None:
                    getattr(t.module, "bias" if w_name == "weight" else f"{t.attr}_bias").copy_(b)
                names.append(t.name)
        res = BakeResult(out, tuple(self._inner._kernels), names, True,
                         notes=["norm-preserving: rows of each writer weight keep their norms"])
        if ref is not None:
            err = (_logits(out, ids) - ref).abs().max().item()
            res.max_logit_error, res.rel_logit_error = err, err / max(ref.abs().max().item(), 1e-30)
        return res
