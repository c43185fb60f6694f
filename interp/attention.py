"""Sites inside attention: q / k / v (per head, before rotary), rot_q / rot_k (after rotary and qk-norm), scores
(pre-softmax) and pattern (post-softmax), read and edited through :func:`interp.hooks`.

``q`` / ``k`` / ``v`` are forward hooks on the projections (fused ones, GPT-2 ``c_attn``, GPT-NeoX
``query_key_value``, Phi-3 ``qkv_proj``, are split), shape ``[batch, pos, n_heads | n_kv_heads, d_head]``; as in
TransformerLens, qk-norm (Qwen3, OLMo-2) is applied after ``hook_q`` and so shows in ``hook_rot_q``. The four inner
sites need the attention computed in the open: while one is hooked, the model's attention implementation is
switched to :func:`eager_attention` (registered with transformers' ``AttentionInterface`` and, for the masks, its
``AttentionMaskInterface``, as the eager mask: padding, causal and sliding windows exactly as HF builds them) and
restored when the last such hook is removed. ``rot_q`` / ``rot_k``: ``[batch, pos, heads, d_head]``; ``scores`` /
``pattern``: ``[batch, n_heads, query, key]`` (TransformerLens layout; ``scores`` after scaling, soft-capping and
the additive mask, whose masked entries hold the dtype's minimum as HF's eager attention has them). A hook that
returns a tensor replaces the value the attention goes on with.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn

from interp.models import Model
from interp.sites import Site, parse_site

IMPL = "interp_attention"
INNER_KINDS = ("rot_q", "rot_k", "scores", "pattern")
QKV_KINDS = ("q", "k", "v")
Edit = Callable[[torch.Tensor], "torch.Tensor | None"]  # already bound to its context and shape-checked

_ACTIVE: dict[int, dict[str, list[Edit]]] = {}  # id(attention module) -> kind -> edits, while hooked
_SWITCHED: dict[int, tuple[int, list[tuple[Any, Any]]]] = {}  # id(hf model) -> (hooks alive, saved impls)


def expand_kv(t: torch.Tensor, n_heads: int, dim: int = -2) -> torch.Tensor:
    """k or v per key-value head ``[..., n_kv_heads, d_head]`` -> per query head ``[..., n_heads, d_head]``
    (query head ``h`` reads key-value head ``h // (n_heads // n_kv_heads)``, as HF's ``repeat_kv``)."""
    n_kv = t.shape[dim]
    if n_heads % n_kv:
        raise ValueError(f"expand_kv: {n_heads} query heads are not a multiple of {n_kv} key-value heads")
    return t.repeat_interleave(n_heads // n_kv, dim=dim)


def _apply(edits: list[Edit], x: torch.Tensor) -> torch.Tensor:
    for e in edits:
        new = e(x)
        if new is not None:
            x = new
    return x


def eager_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    softcap: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's eager attention (``query [b, H, T, d]`` after rotary, ``key`` / ``value [b, H_kv, S, d]``) with the
    inner sites' hooks of ``module`` applied; returns ``(output [b, T, H, d], pattern [b, H, T, S])``."""
    edits = _ACTIVE.get(id(module), {})
    if "rot_q" in edits:
        query = _apply(edits["rot_q"], query.transpose(1, 2)).transpose(1, 2)
    if "rot_k" in edits:
        key = _apply(edits["rot_k"], key.transpose(1, 2)).transpose(1, 2)
    n_heads = query.shape[1]
    key, value = expand_kv(key, n_heads, 1), expand_kv(value, n_heads, 1)
    scores = torch.matmul(query, key.transpose(2, 3)) * (query.shape[-1] ** -0.5 if scaling is None else scaling)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        mask = attention_mask[:, :, :, : key.shape[-2]]
        if mask.dtype == torch.bool:
            mask = torch.zeros_like(mask, dtype=scores.dtype).masked_fill(~mask, torch.finfo(scores.dtype).min)
        scores = scores + mask
    scores = _apply(edits.get("scores", []), scores)
    pattern = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    pattern = _apply(edits.get("pattern", []), pattern)
    pattern_used = nn.functional.dropout(pattern, p=dropout, training=module.training)
    out = torch.matmul(pattern_used, value).transpose(1, 2).contiguous()
    return out, pattern


def _register_impl() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(IMPL, eager_attention)
    AttentionMaskInterface.register(IMPL, eager_mask)


_register_impl()


def _configs(model: Model) -> list[Any]:
    """Every distinct config object the model's modules read ``_attn_implementation`` from."""
    seen: dict[int, Any] = {}
    for m in model.hf.modules():
        c = getattr(m, "config", None)
        if c is not None and hasattr(c, "_attn_implementation_internal"):
            seen.setdefault(id(c), c)
    return list(seen.values())


class _Handle:
    """Removes one inner-site edit; the last one alive restores the model's attention implementation."""

    def __init__(self, model: Model, module: nn.Module, kind: str, edit: Edit):
        self.model, self.key, self.kind, self.edit = model, id(module), kind, edit
        count, saved = _SWITCHED.get(id(model.hf), (0, []))
        if count == 0:
            saved = [(c, c._attn_implementation_internal) for c in _configs(model)]
            for c, _ in saved:
                c._attn_implementation_internal = IMPL
        _SWITCHED[id(model.hf)] = (count + 1, saved)
        _ACTIVE.setdefault(self.key, {}).setdefault(kind, []).append(edit)
        self.alive = True

    def remove(self) -> None:
        if not self.alive:
            return
        self.alive = False
        kinds = _ACTIVE.get(self.key, {})
        kinds.get(self.kind, []).remove(self.edit)
        if not kinds.get(self.kind):
            kinds.pop(self.kind, None)
        if not kinds:
            _ACTIVE.pop(self.key, None)
        count, saved = _SWITCHED.pop(id(self.model.hf))
        if count > 1:
            _SWITCHED[id(self.model.hf)] = (count - 1, saved)
        else:
            for c, impl in saved:
                c._attn_implementation_internal = impl


def register_inner(model: Model, site: Site, edit: Edit) -> list[Any]:
    """Hook ``rot_q`` / ``rot_k`` / ``scores`` / ``pattern`` at ``site.layer``: returns handles with ``remove()``."""
    if not hasattr(model.hf, "set_attn_implementation") or not getattr(model.hf, "_supports_attention_backend", True):
        raise ValueError(f"{site.name}: {model.spec.family} does not route attention through transformers' "
                         f"AttentionInterface, so its scores and pattern cannot be read or edited")
    return [_Handle(model, model.module(model.spec.attn, site.layer), site.kind, edit)]


# fused projection -> (module name, layout): how q, k and v sit in its output
_FUSED = {"c_attn": "qkv_blocks", "query_key_value": "per_head", "qkv_proj": "qkv_blocks"}


def _projection(model: Model, layer: int, kind: str) -> tuple[nn.Module, str | None]:
    attn = model.module(model.spec.attn, layer)
    own = getattr(attn, f"{kind}_proj", None)
    if isinstance(own, nn.Module):
        return own, None
    for name, layout in _FUSED.items():
        mod = getattr(attn, name, None)
        if isinstance(mod, nn.Module):
            return mod, layout
    raise ValueError(f"blocks.{layer}.attn.hook_{kind}: no {kind}_proj or fused q/k/v projection found in "
                     f"{type(attn).__name__}; hook its modules with interp.hooking.module_hooks")


def _slice(model: Model, kind: str, width: int, layout: str | None) -> tuple[int, int, int]:
    """``(start, size, heads)`` of ``kind`` in a projection output of ``width`` (``per_head``: within each head)."""
    d, H, Hkv = model.d_head, model.n_heads, model.n_kv_heads
    heads = H if kind == "q" else Hkv
    if layout is None:
        return 0, width, heads
    if layout == "per_head":
        return "qkv".index(kind) * d, d, heads
    starts = {"q": 0, "k": H * d, "v": (H + Hkv) * d}
    return starts[kind], heads * d, heads


def qkv_hook(model: Model, site: Site, edit: Edit) -> tuple[nn.Module, Any]:
    """``(projection module, forward hook)`` that shows ``q`` / ``k`` / ``v`` (before rotary and qk-norm) to ``edit``
    as ``[batch, pos, heads, d_head]``; :mod:`interp.hooking` registers it (raw hooks live there only)."""
    assert site.layer is not None
    mod, layout = _projection(model, site.layer, site.kind)
    d = model.d_head

    def hook(m: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
        start, size, heads = _slice(model, site.kind, out.shape[-1], layout)
        if layout == "per_head":
            grouped = out.unflatten(-1, (model.n_heads, 3 * d))
            x = grouped[..., start:start + size]
        else:
            x = out[..., start:start + size].unflatten(-1, (heads, d))
        new = edit(x)
        if new is None:
            return None
        out = out.clone()
        if layout == "per_head":
            out.unflatten(-1, (model.n_heads, 3 * d))[..., start:start + size] = new
        else:
            out[..., start:start + size] = new.flatten(-2)
        return out

    return mod, hook


def shape(model: Model, site: Site, n_keys: int | None = None) -> tuple[int, ...]:
    """A site's trailing shape per position: ``(heads, d_head)`` for q / k / v / rot_q / rot_k, ``(n_heads,
    n_keys)`` for scores / pattern (``n_keys``: the key axis, the longest prompt in a capture)."""
    if site.kind in ("scores", "pattern"):
        if n_keys is None:
            raise ValueError(f"{site.name}: the key axis length is needed (the longest prompt)")
        return (model.n_heads, n_keys)
    return (model.n_kv_heads if site.kind in ("k", "v", "rot_k") else model.n_heads, model.d_head)


def keys_aligned(x: torch.Tensor, attention_mask: torch.Tensor, n_keys: int) -> torch.Tensor:
    """A batch's ``scores`` / ``pattern`` ``[b, H, T, T]`` (left-padded columns) -> ``[b, T, H, n_keys]`` with
    the key axis left-aligned: key ``j`` is the prompt's own token ``j``; keys past its length are 0."""
    b, _, _, T = x.shape
    start = (attention_mask.shape[1] - attention_mask.sum(1)).to(x.device)  # pad columns per row
    j = torch.arange(n_keys, device=x.device)
    src = (start[:, None] + j[None, :])  # [b, K]
    valid = src < T
    idx = src.clamp(max=T - 1).view(b, 1, 1, n_keys).expand(*x.shape[:3], n_keys)
    y = torch.gather(x, 3, idx) * valid.view(b, 1, 1, n_keys).to(x.dtype)
    return y.transpose(1, 2)


PATTERN_BYTES_LIMIT = 2 * 1024**3


def check_pattern_memory(sites: Sequence[Site], n_prompts: int, n_keys: int, rule: Any, itemsize: int,
                         n_heads: int) -> None:
    """Refuse ``positions="all"`` on scores / pattern when the ``T x T`` tables would exceed 2 GiB."""
    kept = [s for s in sites if s.kind in ("scores", "pattern")]
    if not kept or rule != "all":
        return
    need = n_prompts * len(kept) * n_heads * n_keys * n_keys * itemsize
    if need > PATTERN_BYTES_LIMIT:
        raise ValueError(f"{len(kept)} attention pattern/scores sites at positions='all' over {n_prompts} prompts of "
                         f"up to {n_keys} tokens need {need / 1024**3:.1f} GiB (query x key x heads x sites); ask "
                         f"for a row rule instead, e.g. positions='last' or a list of query positions")


def knockout(layer: int, heads: int | Sequence[int] | None, queries: int | Sequence[int] | None,
             keys: int | Sequence[int]) -> dict[str, Callable[..., torch.Tensor]]:
    """Attention knockout, ``{scores site: hook}`` for :func:`interp.hooks`: query rows ``queries`` (None: all) of
    ``heads`` (None: all) at ``layer`` may not attend to ``keys``; the pattern renormalises over the rest.
    Positions count within each prompt (0 is its first token, negatives from its end), as capture lays keys out."""
    def as_list(v: Any) -> list[int] | None:
        return None if v is None else [v] if isinstance(v, int) else list(v)

    hs, qs, ks = as_list(heads), as_list(queries), as_list(keys)

    def fn(x: torch.Tensor, ctx: Any) -> torch.Tensor:
        b, H, T, S = x.shape
        tok = getattr(ctx, "tokens", None)
        start = tok.prompt.start.tolist() if tok is not None and tok.past == 0 else [0] * b
        cols = torch.zeros(b, H, T, S, dtype=torch.bool, device=x.device)
        h_idx = torch.arange(H) if hs is None else torch.tensor(hs)
        for r in range(b):
            n = S - start[r]
            q_rows = torch.arange(T) if qs is None else torch.tensor([T - n + q % n for q in qs])
            k_cols = torch.tensor([start[r] + k % n for k in ks])
            cols[r, h_idx[:, None, None], q_rows[None, :, None], k_cols[None, None, :]] = True
        return x.masked_fill(cols, torch.finfo(x.dtype).min)

    return {parse_site(f"scores.{layer}").name: fn}
