"""The one forward/batching layer: prompts -> encodings -> left-padded batches -> a forward pass.

Every floor runs the model through these: ``prepare`` (format and tokenise once), ``encode_ids`` (token ids
given directly), ``encodings`` / ``batch_of`` (either kind of input), ``batches`` (left-pad with the one
pad-id rule), ``forward`` (hooks attached, optional early stop, full or last-position logits) and
``last_logits``. ``position_ids`` always come from the attention mask (see :mod:`interp.chat`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from interp.chat import Batch, Encoded, collate, encode, format_prompts
from interp.hooking import StopForward, hooks, module_hooks
from interp.models import Model
from interp.nnsight_backend import NNsightModel, refuse, trace_batch
from interp.skip import SKIPPABLE, can_skip, resume_from, skip_blocks

KV = list[tuple[torch.Tensor, torch.Tensor]]  # keys and values per layer

Inputs = Sequence[str] | Sequence[Sequence[int]] | torch.Tensor
"""Prompts (strings), lists of token ids, or an integer tensor ``[n, T]`` of token ids (every token real)."""


def pad_id(tokenizer: Any) -> int:
    """The id used for left padding: the tokenizer's pad token, else its end-of-sequence token, else 0.

    Padded positions are masked out, so the value never changes a real token's activations."""
    for name in ("pad_token_id", "eos_token_id"):
        v = getattr(tokenizer, name, None) if tokenizer is not None else None
        if isinstance(v, (list, tuple)):
            v = v[0] if v else None
        if v is not None:
            return int(v)
    return 0


def prepare(model: Model, prompts: Sequence[str], chat: bool = True, responses: Sequence[str] | None = None,
            system: str | None = None) -> tuple[list[str], list[Encoded]]:
    """Format (chat template unless ``chat=False``) and tokenise prompts once; ``(texts, encodings)``.

    Every encoding starts with the tokenizer's own special prefix (its BOS) exactly once, with or without a
    chat template (see :func:`interp.chat.special_prefix`)."""
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of strings, not a single string; wrap it in a list")
    prompts = list(prompts)
    texts = format_prompts(model, prompts, system=system, chat=chat)
    if responses is not None and len(responses) != len(prompts):
        raise ValueError(f"{len(responses)} responses for {len(prompts)} prompts")
    encs = encode(model, texts, instructions=prompts, responses=list(responses) if responses is not None else None)
    max_len = model.max_length
    for i, e in enumerate(encs):
        if max_len is not None and len(e.ids) > max_len:
            raise ValueError(f"prompt {i} has {len(e.ids)} tokens but the model's context is {max_len} tokens; "
                             f"shorten it or drop it")
    return texts, encs


def encode_ids(token_ids: Sequence[Sequence[int]] | torch.Tensor) -> list[Encoded]:
    """Token ids given directly (lists, 1-D tensors, or an integer tensor ``[n, T]``) -> encodings, every token
    a real prompt token (no post-instruction or response part)."""
    if isinstance(token_ids, torch.Tensor):
        if token_ids.dim() != 2 or token_ids.is_floating_point() or token_ids.is_complex() or \
                token_ids.dtype == torch.bool:
            raise TypeError(f"token ids must be an integer tensor [n, T], got {token_ids.dtype} "
                            f"{tuple(token_ids.shape)}")
        token_ids = token_ids.tolist()
    out = []
    for i, p in enumerate(token_ids):
        if not isinstance(p, (list, tuple, torch.Tensor)):
            raise TypeError(f"prompt {i} is {type(p).__name__}; give token ids as lists of ints")
        ids = [int(t) for t in (p.tolist() if isinstance(p, torch.Tensor) else p)]
        if not ids:
            raise ValueError(f"prompt {i} has no tokens")
        out.append(Encoded(ids, len(ids), len(ids)))
    return out


def encodings(model: Model, inputs: Inputs, chat: bool = True) -> list[Encoded]:
    """Strings (through :func:`prepare`; chat-formatted unless ``chat=False``), an :class:`interp.Prompts` (in its
    own format; ``chat`` is not read) or token ids (through :func:`encode_ids`) -> encodings."""
    if isinstance(inputs, str):
        raise TypeError("prompts must be a list of strings (or of token-id lists), not one string; wrap it in a list")
    if hasattr(inputs, "encode"):                     # interp.Prompts (values imports this module): its own format
        return inputs.encode(model)[1]
    if isinstance(inputs, torch.Tensor):
        return encode_ids(inputs)
    items = list(inputs)
    if not items:
        raise ValueError("the prompt list is empty; give at least one prompt")
    if all(isinstance(p, str) for p in items):
        return prepare(model, items, chat=chat)[1]
    if all(isinstance(p, (list, tuple, torch.Tensor)) for p in items):
        return encode_ids(items)
    raise TypeError("prompts must all be strings or all be token-id lists")


def batch_of(model: Model, inputs: Inputs | Batch, chat: bool = True) -> Batch:
    """All of ``inputs`` (see :func:`encodings`) as one left-padded :class:`Batch`; a ``Batch`` passes through."""
    if isinstance(inputs, Batch):
        return inputs
    encs = encodings(model, inputs, chat)
    return batches(model, encs, len(encs))[0]


def batches(model: Model, encs: Sequence[Encoded], batch_size: int) -> list[Batch]:
    """Left-padded batches of ``batch_size`` encodings (the last may be smaller)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    pad = pad_id(model.tokenizer)
    encs = list(encs)
    return [collate(encs[i:i + batch_size], pad, max_length=model.max_length) for i in range(0, len(encs), batch_size)]


def length_order(encs: Sequence[Encoded]) -> list[int]:
    """Indices of ``encs`` longest first (stable: equal lengths keep their order). Batching in this order puts
    prompts of similar length together, so left padding wastes little compute; results go back to the caller's
    order through the inverse permutation."""
    return sorted(range(len(encs)), key=lambda i: -len(encs[i].ids))


def forward(model: Model, batch: Batch, hook_fns: Any = (), *, logits: str | int | None = "all",
            grad: bool = False, repeat: int = 1, prefix: KV | None = None, start: int = 0, from_layer: int = 0,
            resid: torch.Tensor | None = None) -> torch.Tensor | None:
    """One forward pass of ``batch`` with ``hook_fns`` (``{site: fn}`` or ``[(site, fn)]``) attached.

    ``logits``: ``"all"`` -> ``[B, T, V]``; ``"last"`` -> ``[B, V]`` (only the last position is unembedded;
    padding is on the left so it is every row's last real token); an int ``k`` -> ``[B, k, V]``, the last ``k``
    columns only (e.g. the response tokens of left-padded prompt + response rows); ``None`` -> no logits are needed, and a hook
    may raise :class:`~interp.hooking.StopForward` to end the pass early (returns ``None``). Logits are float32
    on the model's device. ``repeat`` stacks the batch that many times (batched candidate scoring).
    ``prefix`` (from :func:`prefix_cache` of a batch with these rows) and ``start``: only columns ``start:``
    are computed, the keys and values of the earlier ones come from ``prefix`` (exact for a causal model when
    nothing before ``start`` changed); logits then cover columns ``start:`` only.
    ``from_layer`` and ``resid [B or B * repeat, T, d]`` (e.g. from :func:`resid_pre_cache`): block
    ``from_layer`` reads ``resid`` as its resid_pre (hooks there see it) and the blocks below are not computed
    (:func:`skip_blocks`; for families outside ``SKIPPABLE`` they run and their output is replaced); exact when
    nothing below ``from_layer`` is edited (an edit there is refused).
    """
    _check_args(model, batch)
    width = batch.input_ids.shape[1] - (start if prefix is not None else 0)  # the columns this pass computes
    if not (logits in ("all", "last", None) or (type(logits) is int and 1 <= logits <= width)):
        raise ValueError(f"logits must be 'all', 'last', None or a number of last columns in 1..{width}, got "
                         f"{logits!r}")
    if isinstance(model, NNsightModel):
        _refuse_traced(hook_fns, grad, prefix, start, from_layer, resid)
        return trace_batch(model, batch, logits=logits, repeat=repeat)[1]
    dev = model.device
    inputs = {k: v.to(dev).repeat(repeat, *([1] * (v.dim() - 1))) for k, v in batch.model_inputs.items()}
    kw: dict[str, Any] = {"use_cache": False}
    full = _resume_rows(model, from_layer, resid, inputs["input_ids"].shape[0], prefix is not None)
    if prefix is not None and start > 0:
        inputs, kw = _after_prefix(model, inputs, prefix, start)
    if logits == "last" or isinstance(logits, int):
        kw["logits_to_keep"] = 1 if logits == "last" else logits
    grad_ctx = nullcontext() if grad else torch.inference_mode()
    with grad_ctx, hooks(model, hook_fns), resume_from(model, from_layer, full), dense_unembed(model):
        try:
            out = model.hf(**inputs, **kw)
        except StopForward:
            if logits is not None:
                raise RuntimeError("a hook stopped the forward pass but logits were asked for; pass logits=None") from None
            return None
    if logits is None:
        return None
    return out.logits[:, -1].float() if logits == "last" else out.logits.float()


@contextmanager
def dense_unembed(model: Model) -> Iterator[None]:
    """While open, the model's unembedding reads a contiguous copy of a strided input.

    Under ``logits_to_keep`` HF models unembed ``hidden[:, -k:]``, a strided view; torch's ``linear`` does not fold
    such a 3-d input into one matrix product but runs a batched product with the vocabulary head broadcast over
    the rows, reading the whole head once per row: 4-12x slower on CPU for a batch of 64-256 rows than one product
    of the copied rows (the same logits up to float rounding). The hook is removed on exit, also on error."""
    from interp.weights import unembed_module

    try:
        head = unembed_module(model)
    except (AttributeError, KeyError, TypeError):   # no unembedding module to hook (e.g. an adapter's own head)
        head = None
    with module_hooks([(head, "pre", _contiguous_input)] if isinstance(head, torch.nn.Module) else []):
        yield


def _contiguous_input(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    if args and isinstance(args[0], torch.Tensor) and not args[0].is_contiguous():
        return (args[0].contiguous(), *args[1:]), kwargs
    return None


def _refuse_traced(hook_fns: Any, grad: bool, prefix: Any, start: int, from_layer: int, resid: Any) -> None:
    """What the nnsight backend cannot take: our hook functions (Python that cannot travel), gradients, reuse."""
    wanted = [("hook functions (interp.hooks / hook_fns)", bool(hook_fns)), ("grad=True", grad),
              ("prefix reuse (prefix=, start=)", prefix is not None or start > 0),
              ("resuming from a layer (from_layer=, resid=)", from_layer > 0 or resid is not None)]
    for what, asked in wanted:
        if asked:
            raise refuse(what)


def _check_args(model: Any, batch: Any) -> None:
    """Refuse a wrong argument with its type only (never its repr: a model's repr fills the screen)."""
    if not isinstance(model, Model):
        raise TypeError(f"the first argument must be an interp Model, got {type(model).__name__}; "
                        f"load one with interp.load_model or wrap an HF model with interp.from_hf")
    if not isinstance(batch, Batch):
        raise TypeError(f"expected a Batch (from interp.forward.batch_of / batches), got {type(batch).__name__}; "
                        f"for logits of prompts call interp.logits(model, prompts)")


def cache_kwarg(model: Model) -> str:
    """The name the model's forward (and ``generate``) takes its KV cache under: ``cache`` or ``past_key_values``."""
    params = inspect.signature(model.hf.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def kv_cache(prefix: KV, start: int) -> Any:
    """A fresh HF ``DynamicCache`` holding the first ``start`` columns of ``prefix`` (a model run on it extends it,
    so each run takes its own)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (K, V) in enumerate(prefix):
        cache.update(K[:, :, :start], V[:, :, :start], i)
    return cache


def prefix_cache(model: Model, batch: Batch) -> KV | None:
    """Keys and values per layer of a plain forward of ``batch`` (to recompute only its later columns with
    ``forward(..., prefix=, start=)``); ``None`` when the cache is not a plain full-attention dynamic cache
    (sliding-window or other caches: no reuse)."""
    return cached_forward(model, batch, 1)[1]


def cached_forward(model: Model, batch: Batch, last: int) -> tuple[torch.Tensor, KV | None]:
    """One plain forward of ``batch``: the logits of its last ``last`` columns ``[B, last, V]`` (float32) and its
    keys and values (as :func:`prefix_cache`; ``None`` for other caches), for a caller that needs both."""
    _check_args(model, batch)
    with torch.inference_mode(), dense_unembed(model):
        out = model.hf(**batch.to(model.device).model_inputs, use_cache=True, logits_to_keep=last)
    cache = out.get("cache", None)
    if cache is None:
        cache = out.get("past_key_values", None)
    layers = getattr(cache, "layers", None)
    if not layers or any(type(la).__name__ != "DynamicLayer" or getattr(la, "keys", None) is None for la in layers):
        return out.logits.float(), None
    return out.logits.float(), [(la.keys, la.values) for la in layers]


def plain_states(model: Model, batch: Batch, layers: Sequence[int] = ()) -> tuple[KV | None, dict[int, torch.Tensor]]:
    """One plain forward of ``batch``: its keys and values of every column (as :func:`prefix_cache`) and the
    resid_pre ``[B, T, d]`` of ``layers``, so a pass under edits at or above a layer can resume there
    (:func:`resume_from`) with the keys and values of the blocks below taken from here."""
    got: dict[int, torch.Tensor] = {}
    with hooks(model, _resid_grabs(layers, got, stop=False)):
        _, kv = cached_forward(model, batch, 1)
    return kv, got


def _resid_grabs(layers: Sequence[int], got: dict[int, torch.Tensor], stop: bool) -> list[tuple[str, Any]]:
    """Hooks copying resid_pre of ``layers`` into ``got``; ``stop``: the pass ends after the last of them."""
    layers = sorted(set(int(x) for x in layers))

    def grab(layer: int) -> Any:
        def fn(x: torch.Tensor, ctx: Any) -> None:
            got[layer] = x.detach().clone()
            if stop and layer == layers[-1]:
                raise StopForward
        return fn
    return [(f"blocks.{layer}.hook_resid_pre", grab(layer)) for layer in layers]


def untouched_prefix(model: Model, batch: Batch, kv: KV | None = None) -> tuple[KV | None, int]:
    """The keys and values of ``batch``'s columns before its first post-instruction token (one plain forward) and
    that column: an edit at the post-instruction and generated tokens only leaves them as they are (a causal model),
    so a pass under it need recompute only the later columns (``forward(..., prefix=, start=)``,
    a ``steering.GenerationSession``'s generations). ``(None, 0)`` when there is nothing to reuse: no column before the
    post-instruction tokens, or a cache that is not a plain full-attention one. ``kv``: the keys and values of a
    plain pass of ``batch`` already run (:func:`plain_states`), sliced instead of running one."""
    pm = batch.post_mask.bool()
    if not bool(pm.any(1).all()):
        return None, 0
    start = int(pm.float().argmax(1).min())
    prefix = (kv if kv is not None else prefix_cache(model, batch)) if start > 0 else None
    if prefix is None:
        return None, 0
    return [(K[:, :, :start].clone(), V[:, :, :start].clone()) for K, V in prefix], start


def _after_prefix(model: Model, inputs: dict[str, torch.Tensor], prefix: KV, start: int
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Model inputs for columns ``start:`` with a cache holding the prefix's first ``start`` columns."""
    rows = inputs["input_ids"].shape[0]
    if prefix[0][0].shape[0] != rows:
        raise ValueError(f"the prefix holds {prefix[0][0].shape[0]} rows but the batch has {rows}; repeat the "
                         f"prefix's keys and values the way the batch is stacked")
    feed = {"input_ids": inputs["input_ids"][:, start:], "attention_mask": inputs["attention_mask"],
            "position_ids": inputs["position_ids"][:, start:], cache_kwarg(model): kv_cache(prefix, start)}
    return feed, {"use_cache": True}


def last_logits(model: Model, batch: Batch, hook_fns: Any = (), grad: bool = False, repeat: int = 1,
                prefix: KV | None = None, start: int = 0, from_layer: int = 0,
                resid: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token logits at every row's last prompt token, ``[B * repeat, vocab]`` float32 (model's device);
    ``prefix``/``start`` reuse the keys and values of columns before ``start``, ``from_layer``/``resid`` the
    residual stream below a block (see :func:`forward`)."""
    out = forward(model, batch, hook_fns, logits="last", grad=grad, repeat=repeat, prefix=prefix, start=start,
                  from_layer=from_layer, resid=resid)
    assert out is not None
    return out


def resid_pre_cache(model: Model, batch: Batch, layers: Sequence[int]) -> dict[int, torch.Tensor]:
    """resid_pre ``[B, T, d]`` of ``layers`` from one plain forward of ``batch`` (stopped after the last of them):
    the ``resid`` to resume from with ``forward(..., from_layer=layer, resid=...)``."""
    got: dict[int, torch.Tensor] = {}
    if layers:
        forward(model, batch, _resid_grabs(layers, got, stop=True), logits=None)
    return got


def _resume_rows(model: Model, from_layer: int, resid: torch.Tensor | None, rows: int, with_prefix: bool
                 ) -> torch.Tensor | None:
    """``resid`` checked and repeated to the forward's ``rows`` rows (``None`` without one)."""
    if resid is None:
        if from_layer:
            raise ValueError("from_layer needs resid=[B, T, d], the resid_pre to resume from (interp.forward."
                             "resid_pre_cache)")
        return None
    if with_prefix:
        raise ValueError("resume from a layer (from_layer=, resid=) or from cached columns (prefix=, start=), not both")
    if not 1 <= from_layer < model.n_layers:
        raise ValueError(f"from_layer must be in 1..{model.n_layers - 1} (block 0 has nothing below it to skip: run "
                         f"the batch plainly), got {from_layer}")
    if resid.dim() != 3 or rows % resid.shape[0]:
        raise ValueError(f"resid must be [B, T, d] with one row per batch row ({rows} rows here, repeats included), "
                         f"got {tuple(resid.shape)}")
    return resid.repeat(rows // resid.shape[0], 1, 1)


__all__ = ["SKIPPABLE", "Inputs", "batch_of", "can_skip", "batches", "encode_ids", "encodings", "forward", "last_logits",
           "length_order", "pad_id",
           "prefix_cache", "prepare", "resid_pre_cache", "skip_blocks",
           "untouched_prefix", "cache_kwarg", "kv_cache", "cached_forward", "plain_states",
           "resume_from"]
