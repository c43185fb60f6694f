"""`capture`: run prompts through the model and keep the requested sites at the requested positions.

Positions are selected inside the hook and moved off the device as the run goes, the forward pass stops
as soon as every requested site has been seen, and with ``out=PATH`` each batch is streamed to an
:class:`~interp.store.ActivationStore` so memory stays bounded by one batch.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any, overload

import torch
from tqdm.auto import tqdm

from interp.activations import Activations
from interp.chat import Batch
from interp.forward import batches, forward, prepare
from interp.hooks import HookContext, StopForward
from interp.models import Model
from interp.positions import PositionSpec, describe, plan
from interp.sites import Site, SiteSpec, expand_sites
from interp.store import ActivationStore


def run_batch(model: Model, batch: Batch, sites: list[Site], rule: PositionSpec, out_dtype: torch.dtype,
              need_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """One forward pass keeping ``sites`` at ``rule``; returns ``([b, S, (P,) d], mask, logits)`` on the CPU."""
    p = plan(rule, batch)
    n = len(sites)
    buf: list[torch.Tensor] = []  # [b, S, (P,) d] on the CPU, allocated at the first hook
    seen: set[int] = set()

    def make(i: int):
        def fn(x: torch.Tensor, ctx: HookContext) -> None:
            y = p.apply(x)
            if not buf:
                with torch.inference_mode(False):  # a normal tensor, so users can edit it in place later
                    buf.append(torch.empty((y.shape[0], n, *y.shape[1:]), dtype=out_dtype))
            buf[0][:, i].copy_(y, non_blocking=True)
            seen.add(i)
            if len(seen) == n and not need_logits:
                raise StopForward
        return fn

    logits = forward(model, batch, [(s, make(i)) for i, s in enumerate(sites)], logits="all" if need_logits else None)
    logits = None if logits is None else logits.to("cpu")
    missing = [sites[i].name for i in range(n) if i not in seen]
    if missing:
        raise RuntimeError(f"sites {missing} never fired during the forward pass; is the ArchSpec right for this model?")
    acts = buf[0]
    mask = p.mask if p.n_positions is not None else None
    if mask is not None and not mask.all():
        keep = mask.view(mask.shape[0], 1, mask.shape[1], *([1] * (acts.dim() - 3)))
        acts.mul_(keep.to(acts.dtype))  # padding positions hold zeros, not garbage
    return acts, mask, logits


def _fingerprint(model: Model, texts: list[str], sites: list[Site], rule: PositionSpec, batch_size: int, dtype: torch.dtype) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([model.name, [s.name for s in sites], describe(rule), batch_size, str(dtype)]).encode())
    for t in texts:
        h.update(t.encode())
        h.update(b"\0")
    return h.hexdigest()


@overload
def capture(model: Model, prompts: Sequence[str], sites: SiteSpec = ..., positions: PositionSpec = ...,
            batch_size: int = ..., chat: bool = ..., responses: Sequence[str] | None = ...,
            labels: Sequence[Any] | None = ..., prompt_ids: Sequence[str] | None = ...,
            dtype: torch.dtype = ..., layers: Sequence[int] | None = ..., system: str | None = ...,
            out: None = ..., overwrite: bool = ..., progress: bool = ...) -> Activations: ...


@overload
def capture(model: Model, prompts: Sequence[str], sites: SiteSpec = ..., positions: PositionSpec = ...,
            batch_size: int = ..., chat: bool = ..., responses: Sequence[str] | None = ...,
            labels: Sequence[Any] | None = ..., prompt_ids: Sequence[str] | None = ...,
            dtype: torch.dtype = ..., layers: Sequence[int] | None = ..., system: str | None = ...,
            *, out: str | os.PathLike, overwrite: bool = ..., progress: bool = ...) -> ActivationStore: ...


def capture(model: Model, prompts: Sequence[str], sites: SiteSpec = "resid_post", positions: PositionSpec = "last",
            batch_size: int = 16, chat: bool = True, responses: Sequence[str] | None = None,
            labels: Sequence[Any] | None = None, prompt_ids: Sequence[str] | None = None,
            dtype: torch.dtype = torch.float32, layers: Sequence[int] | None = None, system: str | None = None,
            out: str | os.PathLike | None = None, overwrite: bool = False,
            progress: bool = True) -> Activations | ActivationStore:
    """Capture activations of ``prompts`` at ``sites`` and ``positions``.

    ``sites``: names like ``"blocks.3.hook_resid_post"`` / ``"resid_post.3"``, or a kind (``"resid_post"``)
    meaning every layer (or ``layers``). ``positions``: ``last``, ``post_instruction``, ``all``,
    ``prompt_mean``, ``response_mean`` (needs ``responses``) or explicit ints. ``chat``: wrap prompts in the
    chat template. Returns :class:`Activations` ``[n_prompts, n_sites, (n_positions,) d_model]``, or with
    ``out=PATH`` an :class:`ActivationStore` written batch by batch (resumable; refuses to overwrite).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    texts, encs = prepare(model, prompts, chat=chat, responses=responses, system=system)
    site_list = expand_sites(sites, model.n_layers, layers)
    n = len(texts)
    if labels is not None and len(labels) != n:
        raise ValueError(f"{len(labels)} labels for {n} prompts")
    ids = [str(i) for i in (prompt_ids if prompt_ids is not None else range(n))]
    if len(ids) != n:
        raise ValueError(f"{len(ids)} prompt ids for {n} prompts")
    meta = {"chat": chat, "batch_size": batch_size, "model_dtype": str(model.dtype), "family": model.spec.family}
    all_batches = batches(model, encs, batch_size)
    store = None
    if out is not None:
        manifest = {"kind": "interp.ActivationStore", "version": 1, "sites": [s.name for s in site_list],
                    "positions": describe(positions), "model_id": model.name, "d_model": model.d_model,
                    "prompt_ids": ids, "labels": list(labels) if labels is not None else None,
                    "batch_size": batch_size, "n_shards": len(all_batches), "dtype": str(dtype), "meta": meta,
                    "fingerprint": _fingerprint(model, texts, site_list, positions, batch_size, dtype)}
        store = ActivationStore.open_for_writing(out, manifest, overwrite=overwrite)

    acts_or_store = capture_batches(model, all_batches, site_list, positions, dtype=dtype, store=store,
                                    progress=progress, desc=f"capture {model.name}")
    if store is not None:
        return store
    tensor, mask = acts_or_store
    return Activations(tensor=tensor, sites=[s.name for s in site_list], positions=describe(positions),
                       model_id=model.name, prompt_ids=ids, labels=list(labels) if labels is not None else None,
                       mask=mask, meta=meta)


def capture_batches(model: Model, all_batches: list[Batch], sites: list[Site], positions: PositionSpec,
                    dtype: torch.dtype = torch.float32, store: ActivationStore | None = None, progress: bool = False,
                    desc: str = "capture") -> Any:
    """The capture loop over prepared batches: ``(tensor, mask)`` in memory, or shards written to ``store``."""
    results: list[torch.Tensor] = []
    masks: list[torch.Tensor | None] = []
    bar = tqdm(total=sum(b.input_ids.shape[0] for b in all_batches), desc=desc, unit="prompt",
               disable=not progress, leave=False)
    try:
        for k, batch in enumerate(all_batches):
            if store is not None and store.has_shard(k):
                bar.update(batch.input_ids.shape[0])
                continue
            acts, mask, _ = run_batch(model, batch, sites, positions, dtype)
            _check_finite(acts, k)
            if store is not None:
                store.write_shard(k, acts, mask)
            else:
                results.append(acts)
                masks.append(mask)
            bar.update(acts.shape[0])
    finally:
        bar.close()
    if store is not None:
        store.finish()
        return store
    return _join(results, masks)


def _check_finite(acts: torch.Tensor, k: int) -> None:
    if not torch.isfinite(acts).all():
        raise FloatingPointError(f"non-finite activations in batch {k}: the model produced NaN/Inf (try float32 "
                                 f"or check the weights)")


def _join(results: list[torch.Tensor], masks: list[torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor | None]:
    if results[0].dim() == 3:
        return torch.cat(results), None
    width = max(r.shape[2] for r in results)
    n, S, d = sum(r.shape[0] for r in results), results[0].shape[1], results[0].shape[-1]
    tensor = torch.zeros(n, S, width, d, dtype=results[0].dtype)
    mask = torch.zeros(n, width, dtype=torch.bool)
    i = 0
    for r, m in zip(results, masks, strict=False):
        b, P = r.shape[0], r.shape[2]
        tensor[i:i + b, :, width - P:] = r
        mask[i:i + b, width - P:] = m
        i += b
    return tensor, mask

