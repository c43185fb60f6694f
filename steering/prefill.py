"""What generations of the same prompts reuse, and the batch loop that uses it.

The plain prompt pass's keys and values before the post-instruction tokens (:func:`prompt_prefixes`) and its
block states (:func:`prompt_states`) stand in for the prompt columns / lower blocks under edits that leave them
as they are (exact for a causal model). :class:`steering.GenerationSession` decides when they apply; callers of
:func:`steering.generate` never pass them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from interp.forward import KV, batches, cache_kwarg, dense_unembed, kv_cache, plain_states, untouched_prefix
from interp.models import Model
from steering.applying import _flat
from steering.decode import greedy_rows, lowest_edited_layer
from steering.rows import RowGroups


def eos_ids(model: Model) -> set[int]:
    eos = getattr(model.hf.generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.tokenizer, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


def cut_at_eos(row: list[int], eos: set[int]) -> list[int]:
    """``row`` up to (not including) its first end-of-sequence token."""
    return row[:next((j for j, t in enumerate(row) if t in eos), len(row))] if eos else row



Prefixes = list[tuple[KV | None, int]]  # per batch: keys and values of its columns before ``start``, and ``start``


def prompt_prefixes(model: Model, encs: Sequence[Any], batch_size: int) -> Prefixes:
    """For each batch :func:`generate` runs on ``encs`` with ``batch_size``: the plain keys and values of its
    columns before the first post-instruction token (:func:`interp.forward.untouched_prefix`), reused by every
    generation of a :class:`~steering.GenerationSession` under edits that leave those columns as they are."""
    return [untouched_prefix(model, b) for b in batches(model, list(encs), batch_size)]


Resumes = list[tuple[KV | None, dict[int, torch.Tensor]]]  # per batch: every column's keys and values, resid_pre


def prompt_states(model: Model, encs: Sequence[Any], batch_size: int, layers: Sequence[int]
                  ) -> tuple[Prefixes, Resumes]:
    """:func:`prompt_prefixes` and, from the same plain pass of each batch, its keys and values of every column
    and resid_pre at ``layers`` (:func:`interp.forward.plain_states`), reused by a session's
    generations under edits at or above one of ``layers`` (an addition at a layer): their prompt pass then
    computes only the blocks from that layer on."""
    prefixes, resumes = [], []
    for b in batches(model, list(encs), batch_size):
        kv, resid = plain_states(model, b, layers)
        prefixes.append(untouched_prefix(model, b, kv) if kv is not None else (None, 0))  # no plain dynamic cache
        resumes.append((kv, resid))
    return prefixes, resumes


def leaves_prompt_prefix(model: Model, interventions: Sequence[Any]) -> bool:
    """Whether every intervention edits only post-instruction (``positions='post_instruction'``) or generated
    (``scope='generated'``) tokens, so the plain keys and values of the earlier prompt columns stay valid under
    them (none: a plain generation). Only steering's own edits (``site_edits``) can say so."""
    for iv in _flat(tuple(interventions)):
        if isinstance(iv, RowGroups):
            if not all(leaves_prompt_prefix(model, g) for g in iv.groups):
                return False
            continue
        if not hasattr(iv, "site_edits"):
            return False
        if any(e.positions != "post_instruction" and e.scope != "generated" for e in iv.site_edits(model).values()):
            return False
    return True



def resume_layer(model: Model, interventions: tuple, states: Resumes | None, encs: list, batch_size: int
                  ) -> tuple[int, Resumes] | None:
    """The layer each prompt pass may resume from under ``interventions`` (the highest of the states' layers at or
    below the lowest edited block, at least 1) and the states; ``None`` when none applies."""
    if states is None:
        return None
    shapes = [tuple(b.input_ids.shape) for b in batches(model, encs, batch_size)]
    if len(states) != len(shapes) or any(kv is not None and (kv[0][0].shape[0] != rows or kv[0][0].shape[2] != width)
                                         for (kv, _), (rows, width) in zip(states, shapes)):
        raise ValueError("prompt_resume does not match these prompts' batches; build it with "
                         "steering.prefill.prompt_states(model, encodings, batch_size, layers) for the same "
                         "encodings and batch_size")
    low = lowest_edited_layer(model, interventions)
    if low is None or any(kv is None for kv, _ in states):
        return None
    layers = set.intersection(*(set(r) for _, r in states)) if states else set()
    ok = [la for la in layers if 1 <= la <= low]
    return (max(ok), states) if ok else None


def check_prefix(model: Model, encs: list, batch_size: int, interventions: tuple, engine: str,
                 prompt_prefix: Prefixes) -> None:
    if engine != "hf":
        raise ValueError("prompt_prefix needs engine='hf' (vLLM keeps its own cache)")
    if not leaves_prompt_prefix(model, interventions):
        raise ValueError("prompt_prefix reuses the plain keys and values of the prompt columns before the "
                         "post-instruction tokens, so every intervention must act at positions='post_instruction' "
                         "or scope='generated' only; drop prompt_prefix for these interventions")
    shapes = [tuple(b.input_ids.shape) for b in batches(model, encs, batch_size)]
    if len(prompt_prefix) != len(shapes) or any(
            kv is not None and (kv[0][0].shape[0] != rows or not 0 < start < width or kv[0][0].shape[2] < start)
            for (kv, start), (rows, width) in zip(prompt_prefix, shapes)):
        raise ValueError("prompt_prefix does not match these prompts' batches; build it with "
                         "steering.prefill.prompt_prefixes(model, encodings, batch_size) for the same encodings "
                         "and batch_size")


def _run_batches(model: Model, encs: list, batch_size: int, kw: dict[str, Any], eos: set[int], seed: int,
                 firsts: list[torch.Tensor] | None, bar: Any, handle: Any, prompt_prefix: Prefixes | None = None,
                 drop: bool = False, resume: tuple[int, Resumes] | None = None) -> list[list[int]]:
    """HF ``generate`` batch by batch (each under its own seeded, forked RNG); the first step's logits into
    ``firsts`` when one is given; each batch's ``prompt_prefix`` entry, when given, as its starting cache.
    ``drop``: greedy decoding that drops finished rows (:func:`steering.decode.greedy_rows`) instead, where the
    cache allows; ``resume = (layer, per batch states)``: each prompt pass from that layer on."""
    dev = model.device
    out_ids: list[list[int]] = []
    for i, batch in enumerate(batches(model, encs, batch_size)):
        kv, start = prompt_prefix[i] if prompt_prefix is not None else (None, 0)
        if handle is not None:
            handle.set_batch(batch, cached=start if kv is not None else 0)
        inputs = {k: v.to(dev) for k, v in batch.model_inputs.items()}
        T = inputs["input_ids"].shape[1]
        prefix = None if kv is None else [(K.to(dev), V.to(dev)) for K, V in kv]
        at = None
        if resume is not None:
            (kv_all, resid), layer = resume[1][i], resume[0]
            at = (layer, resid[layer].to(dev), [(K.to(dev), V.to(dev)) for K, V in kv_all[:layer]])  # type: ignore[index]
        rows = greedy_rows(model, inputs, kw["max_new_tokens"], eos, handle, prefix, start, firsts,
                           at) if drop else None
        if rows is None:
            extra = {} if prefix is None else {cache_kwarg(model): kv_cache(prefix, start)}
            with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []), torch.no_grad(), \
                    dense_unembed(model):
                torch.manual_seed(seed + i)
                out = model.hf.generate(**inputs, **kw, **extra)
            if firsts is not None:
                firsts.append(out.logits[0].float().cpu())
                out = out.sequences
            rows = out[:, T:].tolist()
        out_ids.extend(cut_at_eos(row, eos) for row in rows)
        bar.update(len(batch.input_ids))
    return out_ids


def tiled(prefix: Prefixes | None, resume: Resumes | None, k: int) -> tuple[Prefixes | None, Resumes | None]:
    """``prefix`` and ``resume`` with every batch's rows repeated ``k`` times (the batch stacked once per
    condition, :class:`~steering.rows.RowGroups`)."""
    if k == 1:
        return prefix, resume
    wide = None if prefix is None else [
        (None if kv is None else [(K.repeat(k, 1, 1, 1), V.repeat(k, 1, 1, 1)) for K, V in kv], start)
        for kv, start in prefix]
    tall = None if resume is None else [
        (None if kv is None else [(K.repeat(k, 1, 1, 1), V.repeat(k, 1, 1, 1)) for K, V in kv],
         {la: x.repeat(k, 1, 1) for la, x in resid.items()}) for kv, resid in resume]
    return wide, tall
