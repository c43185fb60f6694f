"""Content identities: prompt ids from the formatted text, a cheap hash of a model's weights, and the run
fingerprint that decides whether an unfinished :class:`~interp.store.ActivationStore` may be resumed."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch

from interp.io import content_hash
from interp.models import Model

_SAMPLES = 32  # values read per parameter tensor: enough to tell two trainings or seeds apart, cheap on 70B


def content_ids(texts: Sequence[str], responses: Sequence[str] | None = None) -> list[str]:
    """One id per prompt from its content: a hash of the formatted text (and of the response when given).

    The same prompt captured twice, in two runs, gets the same id, so a leakage check compares prompts,
    not list positions. A prompt repeated inside one list gets ``#2``, ``#3``, ... after its hash."""
    out: list[str] = []
    seen: dict[str, int] = {}
    for i, t in enumerate(texts):
        h = hashlib.sha256(t.encode())
        if responses is not None:
            h.update(b"\0response\0" + responses[i].encode())
        key = h.hexdigest()[:16]
        seen[key] = seen.get(key, 0) + 1
        out.append(key if seen[key] == 1 else f"{key}#{seen[key]}")
    return out


def weights_hash(model: Model) -> str:
    """A hash over every parameter's name, shape, dtype, ``_SAMPLES`` evenly spaced values and the wrapping
    integer sum of all its values' bits.

    It tells apart two seeds, a fine-tune, a bf16 copy and an edit of a single value (the sum: one pass over the
    weights as 32-bit words, less than one forward pass reads; exact, so the same on any device and thread
    count). Parameters on the ``meta`` device (offloaded) contribute their name, shape and dtype only."""
    h = hashlib.sha256()
    with torch.no_grad():
        for name, p in model.hf.named_parameters():
            h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
            if p.device.type == "meta" or p.numel() == 0:
                continue
            flat = p.detach().reshape(-1)
            idx = torch.linspace(0, flat.numel() - 1, steps=min(flat.numel(), _SAMPLES), device=flat.device).long()
            idx.clamp_(max=flat.numel() - 1)  # float32 rounds n - 1 up to n past 2**24 elements (SmolLM2's embedding)
            h.update(flat[idx].to(torch.float64).cpu().numpy().tobytes())
            h.update(_bits_sum(flat))
    return h.hexdigest()[:16]


def _bits_sum(flat: torch.Tensor) -> bytes:
    """The sum, modulo 2**32, of a contiguous tensor's bytes read as int32 words (the last few bytes as they are):
    order-free integer arithmetic, so exact anywhere, and any one changed value changes it."""
    try:
        raw = flat.contiguous().view(torch.uint8)
    except (RuntimeError, TypeError):  # a tensor subclass without plain storage (some quantised weights)
        return b""
    n = raw.numel() // 4 * 4
    words = int(raw[:n].view(torch.int32).sum(dtype=torch.int32)) if n else 0
    return f"{words}:{raw[n:].tolist()}".encode()


def _hash_seq(items: Sequence[Any] | None) -> str | None:
    return None if items is None else content_hash(list(items))


def run_parts(model: Model, texts: Sequence[str], site_names: Sequence[str], positions: str, batch_size: int,
              dtype: torch.dtype, labels: Sequence[Any] | None, prompt_ids: Sequence[str],
              sort_by_length: bool = False) -> dict[str, Any]:
    """What a store's contents depend on, part by part (so a refused resume can say which part differs).
    Length sorting changes which prompts share a shard, so it is a part (only when on: older stores keep their
    fingerprints); the number of processes that write the store is not (their shards are identical)."""
    order = {"order": "length"} if sort_by_length else {}
    return {**order, "model_id": model.name, "weights": weights_hash(model), "model_dtype": str(model.dtype),
            "sites": list(site_names), "positions": positions, "batch_size": batch_size, "dtype": str(dtype),
            "texts": _hash_seq(list(texts)), "labels": _hash_seq(None if labels is None else list(labels)),
            "prompt_ids": _hash_seq(list(prompt_ids))}


def fingerprint(parts: dict[str, Any]) -> str:
    """One hash of :func:`run_parts`."""
    return content_hash(parts, length=None)


__all__ = ["content_ids", "fingerprint", "run_parts", "weights_hash"]
