"""Read the weights that write into and read out of the residual stream, split the way the looks need them.

``head_weights``: ``W_O`` per head; ``down_weights``: the MLP's down projection per neuron; ``unembed``: ``W_U`` and
its bias; ``rms_multiplier``: a post-sublayer RMS norm as a per-channel factor (frozen from one run); ``token_id``:
one token from a string or an id. Patching, the looks and the circuits all read them here.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from jaxtyping import Float

from interp.models import Model


def head_weights(model: Model, layer: int) -> tuple[Float[torch.Tensor, "H dh d"], torch.Tensor | None]:
    """``W_O`` split by head as ``[n_heads, d_head, d_model]`` and the output bias (``None`` if absent); for a layer
    offloaded by a ``device_map``, call it inside ``interp.models.onloaded(model.block(layer))``."""
    proj = model.module(model.spec.attn_proj, layer)
    W = proj.weight
    W = W if model.spec.conv1d else W.T                                  # [H*dh, d]
    H = model.n_heads
    return W.reshape(H, W.shape[0] // H, W.shape[1]), getattr(proj, "bias", None)


def down_weights(model: Model, layer: int) -> tuple[Float[torch.Tensor, "m d"], torch.Tensor | None]:
    """The dense MLP's down projection as ``[d_mlp, d_model]`` (row ``i``: what neuron ``i`` writes per unit of
    ``mlp_post``) and its bias; a mixture-of-experts layer has none (a clear error)."""
    if model.spec.mlp_proj is None:
        raise ValueError(f"layer {layer} is a mixture-of-experts layer: its neurons live inside each expert; "
                         f"use by='layer' or by='head'")
    proj = model.module(model.spec.mlp_proj, layer)
    W = proj.weight
    return (W if model.spec.conv1d else W.T), getattr(proj, "bias", None)


def unembed(model: Model) -> tuple[Float[torch.Tensor, "V d"], torch.Tensor | None]:
    """The unembedding matrix ``[V, d]`` and its bias (``None`` without one)."""
    head = unembed_module(model)
    return head.weight, getattr(head, "bias", None)


def unembed_module(model: Model) -> nn.Module:
    """The unembedding module: HF's output embeddings (the spec's path names an older attribute in some
    transformers versions, e.g. GPT-NeoX's ``embed_out`` is now ``lm_head``), else the spec's path."""
    get = getattr(model.hf, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if isinstance(head, nn.Module) else model.module(model.spec.unembed)


def rms_multiplier(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Per-token, per-channel factor ``m`` with ``norm(x) == m * x`` for an RMS norm (checked numerically)."""
    eps = getattr(norm, "variance_epsilon", None)
    eps = getattr(norm, "eps", 1e-6) if eps is None else eps
    w = norm.weight.float()
    gain = 1.0 + w if type(norm).__name__.startswith("Gemma") else w
    xf = x.float()
    m = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * gain
    want = norm.forward(x).float()                                       # .forward: bypasses any attached hooks
    if not torch.allclose(m * xf, want, atol=1e-4, rtol=1e-3):
        raise ValueError(f"{type(norm).__name__} after the sublayer is not a plain RMS norm, so its writers "
                         f"cannot be split through it; register a spec whose attn_out / mlp_out is the projection")
    return m


def token_id(tokenizer: Any, tok: int | str, vocab: int) -> int:
    """A token id from an id or a string that is exactly one token."""
    if isinstance(tok, str):
        ids = tokenizer.encode(tok, add_special_tokens=False) if tokenizer is not None else []
        if len(ids) != 1:
            pieces = [tokenizer.decode([i]) for i in ids] if tokenizer is not None else []
            raise ValueError(f"{tok!r} is {len(ids)} tokens {pieces}; a logit target needs one token "
                             f"(give one of those pieces, or its id)")
        tok = ids[0]
    if isinstance(tok, bool) or not 0 <= int(tok) < vocab:
        raise ValueError(f"token id {tok!r} is out of range: outside the vocabulary (0..{vocab - 1})")
    return int(tok)


__all__ = ["down_weights", "head_weights", "rms_multiplier", "token_id", "unembed", "unembed_module"]
