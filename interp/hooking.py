"""Hooks on named sites, attached only inside a context manager and always removed on exit.

A hook function is ``fn(x, ctx)``: ``x`` is the site's tensor (``[batch, seq, d_model]``; ``[batch, seq,
n_heads, d_head]`` for ``attn_z`` and q / k / v / rot_q / rot_k; ``[batch, n_heads, query, key]`` for scores and
pattern, :mod:`interp.attention`; ``[batch, seq, d_mlp]`` for ``mlp_post``) and ``ctx`` a
:class:`HookContext` (its ``tokens``: which columns of the pass are prompt / generated, :mod:`interp.tokens`).
Returning a tensor replaces the activation; returning ``None`` leaves it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

from interp import attention
from interp.arch import get_module, has_module
from interp.models import Model
from interp.sites import ATTN_KINDS, MOE_KINDS, Site, parse_site
from interp.tokens import TokenState, TokenTracker

HookFn = Callable[[torch.Tensor, "HookContext"], "torch.Tensor | None"]


class StopForward(Exception):
    """Raised by a hook to end the forward pass early (every requested site already seen)."""


@dataclass
class HookContext:
    """What a hook knows: its site, the model, ``tokens`` (the pass's :class:`~interp.tokens.TokenState`, read from
    ``tracker``), and ``data``, a dict shared by all hooks of one run (for the hooks' own use)."""

    site: Site
    model: Model
    data: dict[str, Any] = field(default_factory=dict)
    tracker: TokenTracker | None = field(default=None, repr=False)

    @property
    def tokens(self) -> TokenState | None:
        """This pass's prompt / generated columns and each row's prompt span (None outside a recorded pass)."""
        return None if self.tracker is None else self.tracker.state


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def _replace_first(out: Any, new: torch.Tensor) -> Any:
    return (new, *out[1:]) if isinstance(out, tuple) else new


def _input_of(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _with_input(args: tuple, kwargs: dict, new: torch.Tensor) -> tuple[tuple, dict]:
    if args:
        return (new, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": new}


def _check(new: Any, old: torch.Tensor, site: Site) -> torch.Tensor:
    if not isinstance(new, torch.Tensor):
        raise TypeError(f"hook at {site.name} returned {type(new).__name__}; return a tensor or None")
    if new.shape != old.shape:
        raise ValueError(f"hook at {site.name} returned shape {tuple(new.shape)}, expected {tuple(old.shape)}")
    return new.to(old.dtype)


def _register(model: Model, site: Site, fn: HookFn, ctx: HookContext) -> list[RemovableHandle]:
    spec = model.spec
    block: nn.Module | None = model.block(site.layer) if site.layer is not None else None

    def post_hook(mod: nn.Module, args: tuple, out: Any) -> Any:
        x = _first(out)
        new = fn(x, ctx)
        return None if new is None else _replace_first(out, _check(new, x, site))

    def pre_hook(mod: nn.Module, args: tuple, kwargs: dict) -> Any:
        x = _input_of(args, kwargs)
        new = fn(x, ctx)
        return None if new is None else _with_input(args, kwargs, _check(new, x, site))

    kind = site.kind
    if kind in ATTN_KINDS:
        return _register_attention(model, site, fn, ctx)
    if kind == "ln_final":
        if spec.extra.get("normalized"):  # a model whose tree has the pre-gain value as a module (TransformerLens)
            return [model.module(spec.extra["normalized"]).register_forward_hook(post_hook)]
        return _register_ln_final(model, site, fn, ctx)
    if kind == "ln_final_out":
        return [model.module(spec.final_norm).register_forward_hook(post_hook)]
    assert block is not None
    if kind == "resid_pre":
        return [block.register_forward_pre_hook(pre_hook, with_kwargs=True)]
    if kind == "resid_post":
        return [block.register_forward_hook(post_hook)]
    if kind == "attn_out":
        return [model.module(spec.attn_out, site.layer).register_forward_hook(post_hook)]
    if kind == "mlp_out":
        return [model.module(spec.mlp_out, site.layer).register_forward_hook(post_hook)]
    if kind == "mlp_in":
        return [model.module(spec.mlp, site.layer).register_forward_pre_hook(pre_hook, with_kwargs=True)]
    if kind == "mlp_module_out":
        return [model.module(spec.mlp, site.layer).register_forward_hook(post_hook)]
    if kind == "resid_mid":
        return _register_resid_mid(model, site, fn, ctx)
    if kind == "attn_z":
        n_heads = model.n_heads

        def z_hook(mod: nn.Module, args: tuple, kwargs: dict) -> Any:
            x = _input_of(args, kwargs)
            z = x.unflatten(-1, (n_heads, x.shape[-1] // n_heads))
            new = fn(z, ctx)
            return None if new is None else _with_input(args, kwargs, _check(new, z, site).flatten(-2))

        return [model.module(spec.attn_proj, site.layer).register_forward_pre_hook(z_hook, with_kwargs=True)]
    if kind == "mlp_post":
        if spec.mlp_proj is None:
            raise ValueError(f"{site.name}: this is a mixture-of-experts layer; neurons live inside each expert. "
                             f"Hook the experts' modules directly or use mlp_out")
        return [model.module(spec.mlp_proj, site.layer).register_forward_pre_hook(pre_hook, with_kwargs=True)]
    if kind in MOE_KINDS:
        return _register_moe_part(model, site, fn, ctx)
    raise ValueError(f"site kind {kind!r} cannot be hooked")


def _register_attention(model: Model, site: Site, fn: HookFn, ctx: HookContext) -> list[Any]:
    """q / k / v on the projections, rot_q / rot_k / scores / pattern inside attention (:mod:`interp.attention`)."""
    def edit(x: torch.Tensor) -> torch.Tensor | None:
        new = fn(x, ctx)
        return None if new is None else _check(new, x, site)

    if site.kind in attention.QKV_KINDS:
        mod, hook = attention.qkv_hook(model, site, edit)
        return [mod.register_forward_hook(hook)]
    return attention.register_inner(model, site, edit)


def moe_part_module(model: Model, site: Site) -> nn.Module:
    """The module whose output is ``experts_out`` (the routed experts) or ``shared_expert_out`` at ``site.layer``;
    a clear error where the layer has no such module."""
    spec = model.spec
    path = spec.experts if site.kind == "experts_out" else spec.shared_expert
    if path is None:
        what = "is not a mixture of experts" if spec.experts is None else "has no shared expert"
        raise ValueError(f"{site.name}: {spec.family} {what}; use mlp_out (the whole MLP write)")
    assert site.layer is not None
    block = model.block(site.layer)
    if not has_module(block, path):
        raise ValueError(f"{site.name}: layer {site.layer} has a dense MLP (no {path}); choose mixture-of-experts "
                         f"layers, or use mlp_out")
    mod = get_module(block, path)
    if isinstance(mod, nn.ModuleList):
        raise ValueError(f"{site.name}: the experts at {path} are separate modules called one by one, so their sum "
                         f"is no module's output; use mlp_out")
    return mod


def _register_moe_part(model: Model, site: Site, fn: HookFn, ctx: HookContext) -> list[RemovableHandle]:
    """HF runs the experts on tokens flattened to ``[batch * seq, d]``: the hook sees ``[batch, seq, d]`` (the MoE
    block's input shape, read as the block starts) and its result is flattened back."""
    target = moe_part_module(model, site)
    shape: dict[str, torch.Size] = {}

    def grab(mod: nn.Module, args: tuple, kwargs: dict) -> None:
        shape["bt"] = _input_of(args, kwargs).shape[:-1]

    def write(mod: nn.Module, args: tuple, out: Any) -> Any:
        flat = _first(out)
        x = flat.view(*shape["bt"], flat.shape[-1]) if flat.dim() == 2 else flat
        new = fn(x, ctx)
        return None if new is None else _replace_first(out, _check(new, x, site).reshape(flat.shape))

    return [model.module(model.spec.mlp, site.layer).register_forward_pre_hook(grab, with_kwargs=True),
            target.register_forward_hook(write)]


def _register_ln_final(model: Model, site: Site, fn: HookFn, ctx: HookContext) -> list[RemovableHandle]:
    """``ln_final.hook_normalized`` as TransformerLens means it: the final norm's input normalised, before the
    gain (and bias). Read from the norm's input; an edit is written back through the gain, ``out = gain(fn(n))``."""
    norm = model.module(model.spec.final_norm)
    parts = norm_parts(norm, model.spec.norm_offset)

    def hook(mod: nn.Module, args: tuple, kwargs: dict, out: Any) -> Any:
        x = _input_of(args, kwargs)
        n = parts.normalize(x)
        new = fn(n, ctx)
        if new is None:
            return None
        y = _first(out)
        return _replace_first(out, parts.gain(_check(new, n, site)).to(y.dtype))

    return [norm.register_forward_hook(hook, with_kwargs=True)]


@dataclass
class NormParts:
    """A norm split in two: ``normalize`` (centre for LayerNorm, divide by the RMS / std) and ``gain`` (weight,
    ``offset + weight`` for Gemma, then bias). ``gain(normalize(x))`` is the module's output."""

    eps: float
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    centre: bool
    offset: float = 0.0

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        if self.centre:
            xf = xf - xf.mean(-1, keepdim=True)
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def gain(self, n: torch.Tensor) -> torch.Tensor:
        y = n.float() if self.offset else n
        if self.weight is not None:
            y = y * (self.offset + self.weight.float()) if self.offset else y * self.weight
        return y if self.bias is None else y + self.bias


def norm_parts(norm: nn.Module, offset: float = 0.0) -> NormParts:
    """The :class:`NormParts` of an HF LayerNorm or RMSNorm module (``offset`` 1 for Gemma's ``1 + weight``)."""
    norm = getattr(norm, "_original_component", norm)  # a TransformerLens bridge wrapper: read the HF norm it wraps
    eps = next((float(getattr(norm, a)) for a in ("variance_epsilon", "eps", "epsilon") if hasattr(norm, a)), 1e-6)
    name = type(norm).__name__
    centre = isinstance(norm, nn.LayerNorm) or ("LayerNorm" in name and "RMS" not in name)
    return NormParts(eps, getattr(norm, "weight", None), getattr(norm, "bias", None), centre, offset)


def site_shape(model: Model, site: Site, n_keys: int | None = None) -> tuple[int, ...]:
    """The trailing shape a site's tensor has: ``(n_heads, d_head)`` for ``attn_z``, ``(d_mlp,)`` for
    ``mlp_post``, ``(d_model,)`` for the residual-width sites; attention sites: :func:`interp.attention.shape`."""
    if site.kind in ATTN_KINDS:
        return attention.shape(model, site, n_keys)
    if site.kind == "attn_z":
        return (model.n_heads, model.d_head)
    if site.kind == "mlp_post":
        if model.spec.mlp_proj is None:
            raise ValueError(f"{site.name}: this is a mixture-of-experts layer; neurons live inside each expert. "
                             f"Hook the experts' modules directly or use mlp_out")
        mod = model.module(model.spec.mlp_proj, site.layer)
        w = getattr(mod, "weight", None)
        if isinstance(w, torch.Tensor) and w.dim() == 2:
            return (int(w.shape[0] if model.spec.conv1d else w.shape[1]),)
        return (int(model.d_mlp or 0),)
    return (model.d_model,)


def _register_resid_mid(model: Model, site: Site, fn: HookFn, ctx: HookContext) -> list[RemovableHandle]:
    """resid_mid = resid_pre + attn_out. We stash resid_pre where the block reads it and apply ``fn`` to the
    sum inside the attention-write hook, writing back ``fn(pre + out) - pre`` so the stream changes exactly."""
    spec = model.spec
    if spec.resid_mid_in is None:
        raise ValueError(f"{site.name}: {spec.family} uses a parallel residual (attention and MLP read the same "
                         f"input), so there is no resid_mid; use resid_pre / resid_post")
    stash: dict[str, torch.Tensor] = {}

    def grab(mod: nn.Module, args: tuple, kwargs: dict) -> None:
        stash["pre"] = _input_of(args, kwargs)

    def write(mod: nn.Module, args: tuple, out: Any) -> Any:
        pre = stash.pop("pre")
        attn = _first(out)
        mid = pre + attn
        new = fn(mid, ctx)
        return None if new is None else _replace_first(out, _check(new, mid, site) - pre)

    return [
        model.module(spec.resid_pre_in, site.layer).register_forward_pre_hook(grab, with_kwargs=True),
        model.module(spec.attn_out, site.layer).register_forward_hook(write),
    ]


HookSpec = Mapping[Any, "HookFn | Sequence[HookFn]"] | Sequence[tuple[Any, HookFn]]


@contextmanager
def hooks(model: Model, fns: HookSpec, data: dict[str, Any] | None = None,
          tokens: TokenTracker | None = None) -> Iterator[dict[str, Any]]:
    """Attach ``{site: fn}`` (or ``[(site, fn), ...]``) for the duration of the block.

    Contexts nest and compose (hooks on one site run in the order they were attached). Every hook is
    removed on exit, also when the body raises. Yields the shared ``data`` dict given to every hook.
    Each forward pass of the model in the block is recorded once, before it runs, in ``tokens`` (a fresh
    :class:`~interp.tokens.TokenTracker` by default; ``steering.apply`` passes its own), which hooks read as
    ``ctx.tokens``. A model whose passes run elsewhere (the nnsight backend) refuses hooks: they would not run there.
    """
    items = list(fns.items()) if isinstance(fns, Mapping) else list(fns)
    if items:
        model.require_local("interp.hooks (hook functions of our own on the model's modules)")
    shared = {} if data is None else data
    tracker = TokenTracker() if tokens is None else tokens
    handles: list[RemovableHandle] = []
    try:
        if items or tokens is not None:
            handles.append(model.hf.register_forward_pre_hook(tracker.pre_hook, with_kwargs=True))
        for site_name, fn_or_list in items:
            site = parse_site(site_name, model.n_layers)
            for fn in (fn_or_list if isinstance(fn_or_list, (list, tuple)) else [fn_or_list]):
                if not callable(fn):
                    raise TypeError(f"hook for {site.name} is {type(fn).__name__}, not callable")
                handles += _register(model, site, fn, HookContext(site, model, shared, tracker))
        yield shared
    finally:
        for h in handles:
            h.remove()


ModuleHook = tuple[nn.Module, str, Callable[..., Any]]


@contextmanager
def module_hooks(items: Sequence[ModuleHook]) -> Iterator[None]:
    """Attach raw hooks ``[(module, "pre" | "post", fn), ...]`` to ``nn.Module`` s for the block; always removed.

    ``"pre"``: ``fn(module, args, kwargs)`` before the module runs (``with_kwargs=True``: return ``(args,
    kwargs)`` to replace them, or ``None``). ``"post"``: ``fn(module, args, output)`` (return a new output or
    ``None``). For hooks that do not fit a named site (the whole model, a q/k/v projection, the embedding).
    """
    handles: list[RemovableHandle] = []
    try:
        for mod, kind, fn in items:
            if kind not in ("pre", "post"):
                raise ValueError(f"module hook kind must be 'pre' or 'post', got {kind!r}")
            if not isinstance(mod, nn.Module):
                raise TypeError(f"module_hooks needs nn.Module objects, got {type(mod).__name__}")
            handles.append(mod.register_forward_pre_hook(fn, with_kwargs=True) if kind == "pre"
                           else mod.register_forward_hook(fn))
        yield
    finally:
        for h in handles:
            h.remove()


OUR_PACKAGES = ("interp", "evals", "viz", "probes", "sae", "steering", "patching", "pipelines", "organism")


def count_hooks(module: nn.Module, ours_only: bool = False) -> int:
    """Number of forward (pre-)hooks attached anywhere below ``module`` (0 when nothing leaked).

    ``ours_only``: count only hooks whose function comes from this project (transformers installs hooks of its own,
    e.g. to record router logits of mixture-of-experts layers once outputs were requested)."""
    def ours(fn: object) -> bool:
        return str(getattr(fn, "__module__", "") or "").split(".")[0] in OUR_PACKAGES

    return sum(sum(1 for fn in (*m._forward_hooks.values(), *m._forward_pre_hooks.values())
                   if not ours_only or ours(fn)) for m in module.modules())
