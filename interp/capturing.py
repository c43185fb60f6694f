"""`capture`: run prompts through the model and keep the requested sites at the requested positions.

Positions are selected inside the hook and moved off the device as the run goes, the forward pass stops
as soon as every requested site has been seen, and with ``out=PATH`` each batch is streamed to an
:class:`~interp.store.ActivationStore` so memory stays bounded by one batch.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, overload

import torch
from tqdm.auto import tqdm

from interp import distributed as dist
from interp.activations import Activations
from interp.attention import check_pattern_memory
from interp.capture_pass import WIDTH_HELP, Part, run_groups
from interp.chat import Batch
from interp.fingerprint import content_ids, fingerprint, run_parts
from interp.forward import batches, encode_ids, length_order
from interp.hooking import site_shape
from interp.models import Model
from interp.positions import Positions, PositionSpec, describe, sink_note
from interp.sites import Site, SiteSpec, expand_sites
from interp.store import ActivationStore
from interp.values import Prompts, Runtime, moved_keywords


def run_batch(model: Model, batch: Batch, sites: list[Site], rule: PositionSpec, out_dtype: torch.dtype,
              need_logits: bool = False, skip_special: bool = True, pin: bool = False, sinks: str = "exclude",
              n_keys: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """One forward pass keeping ``sites`` at ``rule``; returns ``([b, S, (P,) width], mask, logits)`` on the CPU
    (:func:`run_batch_flagged` adds the sink flags)."""
    return run_batch_flagged(model, batch, sites, rule, out_dtype, need_logits, skip_special, pin, sinks, n_keys)[:3]


def run_batch_flagged(model: Model, batch: Batch, sites: list[Site], rule: PositionSpec, out_dtype: torch.dtype,
                      need_logits: bool = False, skip_special: bool = True, pin: bool = False, sinks: str = "exclude",
                      n_keys: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """:func:`run_batch` and ``flags``: the massive-activation positions (:func:`interp.positions.massive`),
    ``[b, S, P]`` bool where positions are kept, else ``[b, S]`` counts (left out of a mean unless
    ``sinks='keep'``); ``None`` when unknown.

    Per-head sites arrive ``[.., n_heads, d_head]`` and are kept flattened to ``n_heads * d_head`` (the
    concatenated head outputs, as the output projection reads them); every site of one call shares one width
    (sites of several widths in one pass: :func:`interp.capture_pass.run_groups`).
    Scores / pattern are kept per query row as ``n_heads * n_keys`` (default: the batch's width), keys left-aligned
    (key ``j`` is the prompt's own token ``j``, zero past its length; :func:`interp.attention.keys_aligned`).
    Copies off a GPU are non-blocking; ``pin`` puts the CPU buffer in pinned memory so they really overlap (for
    a buffer that is written out and freed, e.g. a store shard: torch's host allocator recycles it)."""
    (got,), logits = run_groups(model, batch, [sites], rule, out_dtype, need_logits, skip_special, pin, sinks, n_keys)
    return got[0], got[1], logits, got[2]


def site_widths(model: Model, sites: list[Site], n_keys: int | None = None) -> tuple[int, dict[str, list[int]]]:
    """The common width of ``sites`` and the shapes of the multi-dimensional ones (``attn_z``: heads, d_head;
    ``pattern``: heads, ``n_keys``); a clear error when the widths differ."""
    shapes = {s.name: site_shape(model, s, n_keys) for s in sites}
    widths = {name: math.prod(sh) for name, sh in shapes.items()}
    if len(set(widths.values())) > 1:
        groups: dict[int, list[str]] = {}
        for name, w in widths.items():
            groups.setdefault(w, []).append(name)
        listed = "; ".join(f"width {w}: {', '.join(ns[:3])}{' ...' if len(ns) > 3 else ''}" for w, ns in groups.items())
        raise ValueError(f"sites of different widths in one capture ({listed}): {WIDTH_HELP}")
    return next(iter(widths.values())), {k: list(v) for k, v in shapes.items() if len(v) > 1}


MOVED = {**{k: f"runtime=interp.Runtime({k}=...)" for k in ("batch_size", "dtype", "progress", "sort_by_length",
                                                               "distributed")},
         **{k: f"prompts=interp.Prompts(texts, {k}=...)" for k in ("chat", "responses", "labels", "system")},
         "prompt_ids": "prompts=interp.Prompts(texts, ids=...)",
         "mean_skip_special": "positions=interp.Positions(rule, skip_special=...)",
         "sinks": "positions=interp.Positions(rule, sinks=...)"}
"""The keywords :func:`capture` took before its value types, and where each went."""


@overload
def capture(model: Model, prompts: Prompts | Sequence[str], sites: SiteSpec = ...,
            positions: Positions | PositionSpec = ..., layers: Sequence[int] | None = ..., out: None = ...,
            overwrite: bool = ..., runtime: Runtime | None = ...) -> Activations: ...


@overload
def capture(model: Model, prompts: Prompts | Sequence[str], sites: SiteSpec = ...,
            positions: Positions | PositionSpec = ..., layers: Sequence[int] | None = ..., *,
            out: str | os.PathLike, overwrite: bool = ..., runtime: Runtime | None = ...) -> ActivationStore: ...


@moved_keywords(MOVED)
def capture(model: Model, prompts: Prompts | Sequence[str], sites: SiteSpec = "resid_post",
            positions: Positions | PositionSpec = "last", layers: Sequence[int] | None = None,
            out: str | os.PathLike | None = None, overwrite: bool = False,
            runtime: Runtime | None = None) -> Activations | ActivationStore:
    """Capture activations of ``prompts`` at ``sites`` and ``positions``.

    ``prompts``: strings or an :class:`interp.Prompts` (with its responses, labels, ids, chat formatting and
    system prompt; ids default to content ids, :func:`interp.fingerprint.content_ids`), or token ids (lists of
    ints or an integer tensor ``[n, T]``: every token real, no chat template). ``sites``: names like
    ``"blocks.3.hook_resid_post"`` / ``"resid_post.3"``, or a kind (``"resid_post"``) meaning every layer (or
    ``layers``). ``positions``: a rule of :data:`interp.positions.RULES` (``response_mean`` needs responses),
    explicit ints, or an :class:`interp.Positions` (``sinks``: massive positions, flagged in ``.sinks [n, S, P]``,
    are left out of means unless ``"keep"``, counts in ``meta["sinks"]``; ``skip_special=False``: means include
    BOS and template tokens). Returns :class:`Activations` ``[n_prompts, n_sites, (n_positions,) width]``
    (``d_model``; ``n_heads * d_head`` for ``attn_z``; ``d_mlp`` for ``mlp_post``; one width per call), or with
    ``out=PATH`` an :class:`ActivationStore` written batch by batch (resumable only by the same run: weights and
    dtype, sites, positions, texts, labels; refuses to overwrite).

    ``runtime`` (:class:`interp.Runtime`): ``batch_size``, ``dtype`` of the results, ``progress``,
    ``sort_by_length`` (longest first, little padding; results stay in the caller's order, a store's manifest
    holds the order) and ``distributed`` (split batches round robin over an initialised process group, e.g. under
    torchrun: with ``out=`` (the default there) each rank writes its shards of one store, byte-identical to one
    process; in memory (``True``) every rank gets all; ``False``: this rank captures everything itself).
    """
    run, pos = Runtime.of(runtime), Positions.of(positions)
    par = _parallel(run.distributed, out)
    site_list = expand_sites(sites, model.n_layers, layers)
    job = _Job(model, prompts, [site_list], pos, run)
    width, shapes = site_widths(model, site_list, job.n_keys)
    meta = job.meta(site_list, shapes)
    rule = pos.describe()
    store = None
    if out is not None:
        parts = run_parts(model, job.texts, [s.name for s in site_list], rule, run.batch_size, run.dtype, job.labels,
                          job.ids, sort_by_length=run.sort_by_length)
        manifest = {"kind": "interp.ActivationStore", "version": 1, "sites": [s.name for s in site_list],
                    "positions": rule, "model_id": model.name, "d_model": width, "prompt_ids": job.ids,
                    "labels": job.labels, "batch_size": run.batch_size, "n_shards": len(job.batches),
                    "dtype": str(run.dtype), "meta": meta, "fingerprint": fingerprint(parts),
                    "fingerprint_parts": parts, **({} if job.order is None else {"order": job.order})}
        store = _open_store(out, manifest, overwrite, par)

    acts_or_store = capture_batches(model, job.batches, site_list, pos, store=store,
                                    runtime=replace(run, distributed=par), desc=f"capture {model.name}",
                                    n_keys=job.n_keys)
    if store is not None:
        return store
    return job.activations(acts_or_store, site_list, meta)


def capture_groups(model: Model, prompts: Prompts | Sequence[str], groups: Mapping[str, SiteSpec],
                   positions: Positions | PositionSpec = "last", *, layers: Sequence[int] | None = None,
                   runtime: Runtime | None = None) -> dict[str, Activations]:
    """Capture several groups of sites, each of its own width (``{"pattern": "pattern", "resid": "resid_post"}``),
    in one forward pass per batch: ``{name: Activations}``, each equal to what :func:`capture` of that group alone
    returns (its ``[n, S, (P,) width]``, mask, sink flags and meta). ``groups`` maps a name to anything
    :func:`capture` takes as ``sites``; the other arguments are :func:`capture`'s (in memory only: for a store,
    capture each group with ``out=``)."""
    if not isinstance(groups, Mapping) or not groups:
        raise TypeError(f"groups must be a non-empty dict {{name: sites}}, e.g. {{'resid': 'resid_post', "
                        f"'pattern': 'pattern'}}; got {groups!r}")
    run, pos = Runtime.of(runtime), Positions.of(positions)
    par = _parallel(run.distributed, None)
    lists = [expand_sites(spec, model.n_layers, layers) for spec in groups.values()]
    job = _Job(model, prompts, lists, pos, run)
    metas = [job.meta(sl, site_widths(model, sl, job.n_keys)[1]) for sl in lists]
    got = _group_batches(model, job.batches, lists, pos.rule, run.dtype, None, run.progress,
                         f"capture {model.name}", pos.skip_special, par, pos.sinks, job.n_keys)
    return {name: job.activations(g, sl, meta) for name, g, sl, meta in zip(groups, got, lists, metas, strict=True)}


class _Job:
    """What one capture call prepares once for all its sites: encodings, ids, labels, key width, batches."""

    def __init__(self, model: Model, prompts: Any, lists: list[list[Site]], pos: Positions, run: Runtime) -> None:
        self.model, self.pos, self.run = model, pos, run
        self.texts, self.encs, self.given = _encode(model, prompts)
        self.n_keys = max((len(e.ids) for e in self.encs), default=0)
        check_pattern_memory([s for sl in lists for s in sl], len(self.encs), self.n_keys, pos.rule,
                             run.dtype.itemsize, model.n_heads)
        self.labels = list(self.given.labels) if self.given.labels is not None else None
        self.ids = _ids(self.texts, self.given.responses, self.labels, self.given.ids)
        self.order = length_order(self.encs) if run.sort_by_length else None
        encs = self.encs if self.order is None else [self.encs[i] for i in self.order]
        self.batches = batches(model, encs, run.batch_size)

    def meta(self, site_list: list[Site], shapes: dict[str, list[int]]) -> dict[str, Any]:
        m = self.model
        meta = {"chat": self.given.chat, "batch_size": self.run.batch_size, "model_dtype": str(m.dtype),
                "family": m.spec.family, "site_shapes": shapes, "model": {"n_layers": m.n_layers, "d_model": m.d_model}}
        if any(s.kind in ("scores", "pattern") for s in site_list):  # keys left-aligned, zero past each length
            meta["key_lengths"] = [len(e.ids) for e in self.encs]
        return meta

    def activations(self, got: tuple, site_list: list[Site], meta: dict[str, Any]) -> Activations:
        """One group's joined ``(tensor, mask, flags, counts)`` as :class:`Activations` in the caller's order."""
        names = [s.name for s in site_list]
        tensor, mask, flags = _in_order(got, self.order, meta, names, self.pos.sinks, self.pos.mean)
        return Activations(tensor=tensor, sites=names, positions=self.pos.describe(), model_id=self.model.name,
                           prompt_ids=self.ids, labels=self.labels, mask=mask, meta=meta, sinks=flags)


def _in_order(got: tuple, order: list[int] | None, meta: dict[str, Any], names: list[str], sinks: str, mean: bool
              ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """An in-memory capture's ``(tensor, mask, sink flags)`` in the caller's order; the sink note into ``meta``."""
    tensor, mask, flags, tally = got
    if order is not None:
        tensor, mask, flags = _unsort(tensor, mask, flags, order)
    meta["sinks"] = sink_note(names, tally, sinks, mean)
    return tensor, mask, flags if flags is not None and flags.dtype == torch.bool else None


def _encode(model: Model, prompts: Any) -> tuple[list[str], list[Any], Prompts]:
    """Strings or :class:`Prompts` through :meth:`Prompts.encode`; token ids (lists or an integer tensor
    ``[n, T]``, every token real, e.g. pretokenised SAE data) as they are, each described by its ids for content
    ids and fingerprint. Returns ``(texts, encodings, the prompts' options)``."""
    items = prompts.tolist() if isinstance(prompts, torch.Tensor) else prompts
    if isinstance(items, Prompts) or isinstance(items, str) or not items or all(isinstance(p, str) for p in items):
        given = Prompts.of(prompts)
        texts, encs = given.encode(model)
        return texts, encs, given
    encs = encode_ids(items)
    return [json.dumps(e.ids) for e in encs], encs, Prompts((), chat=False)  # no template on token ids


def _ids(texts: list[str], responses: Sequence[str] | None, labels: Sequence[Any] | None,
         prompt_ids: Sequence[str] | None) -> list[str]:
    """The prompt ids (content ids unless given), after checking labels and ids match the prompts in number."""
    n = len(texts)
    if labels is not None and len(labels) != n:
        raise ValueError(f"{len(labels)} labels for {n} prompts")
    ids = [str(i) for i in prompt_ids] if prompt_ids is not None else content_ids(texts, responses)
    if len(ids) != n:
        raise ValueError(f"{len(ids)} prompt ids for {n} prompts")
    return ids


def _parallel(distributed: bool | None, out: Any) -> bool:
    """Whether this capture is split over the ranks (see :func:`capture`'s ``distributed``)."""
    if distributed is None:
        if out is not None and dist.launched() and int(os.environ["WORLD_SIZE"]) > 1 and not dist.active():
            raise ValueError(f"launched with WORLD_SIZE={os.environ['WORLD_SIZE']} but no process group is "
                             f"initialised, so every process would write the whole store: call "
                             f"interp.distributed.init_from_env() first (or pass distributed=False)")
        return out is not None and dist.active()
    if distributed and not dist.active():
        raise ValueError("distributed=True needs an initialised process group of more than one process: launch with "
                         "torchrun and call interp.distributed.init_from_env() first")
    return bool(distributed)


def _open_store(out: str | os.PathLike, manifest: dict[str, Any], overwrite: bool, parallel: bool) -> ActivationStore:
    """Create or resume the store; split over ranks, rank 0 does it and the others open it once it is there."""
    if not parallel:
        return ActivationStore.open_for_writing(out, manifest, overwrite=overwrite)
    store = dist.on_main(lambda: ActivationStore.open_for_writing(out, manifest, overwrite=overwrite))
    return store if store is not None else ActivationStore(out)


def _unsort(tensor: torch.Tensor, mask: torch.Tensor | None, flags: torch.Tensor | None, order: list[int]
            ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Rows captured in ``order`` put back in the caller's order."""
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
    return tensor[inverse], None if mask is None else mask[inverse], None if flags is None else flags[inverse]


_BATCHES_MOVED = {"dtype": "runtime=interp.Runtime(dtype=...)", "progress": "runtime=interp.Runtime(progress=...)",
                  "parallel": "runtime=interp.Runtime(distributed=...)",
                  "skip_special": "positions=interp.Positions(rule, skip_special=...)",
                  "sinks": "positions=interp.Positions(rule, sinks=...)"}


@moved_keywords(_BATCHES_MOVED)
def capture_batches(model: Model, all_batches: list[Batch], sites: list[Site], positions: Positions | PositionSpec,
                    store: ActivationStore | None = None, runtime: Runtime | None = None,
                    desc: str = "capture", n_keys: int | None = None) -> Any:
    """The capture loop over prepared batches: ``(tensor, mask, sink flags, sink counts per site)`` in memory, or
    shards written to ``store`` (with their sink flags). ``positions``: the rule with its ``sinks`` and
    ``skip_special``; ``runtime``: the ``dtype`` kept, a ``progress`` bar named ``desc`` (default off), and
    ``distributed`` (as the caller resolved it; ``None`` counts as ``False``); ``n_keys``: the key axis of
    scores / pattern sites (the longest prompt; :func:`interp.attention.keys_aligned`).

    Distributed: this rank runs only its own batches (:func:`interp.distributed.owns`); a failure on any rank
    stops every rank; rank 0 finishes the store after all shards are written, in memory every rank gets all."""
    pos, run = Positions.of(positions), runtime if runtime is not None else Runtime(progress=False)
    got = _group_batches(model, all_batches, [sites], pos.rule, run.dtype, store, run.progress, desc,
                         pos.skip_special, bool(run.distributed), pos.sinks, n_keys)
    return got if store is not None else got[0]


def _group_batches(model: Model, all_batches: list[Batch], groups: list[list[Site]], positions: PositionSpec,
                   dtype: torch.dtype, store: ActivationStore | None, progress: bool, desc: str, skip_special: bool,
                   parallel: bool, sinks: str, n_keys: int | None) -> Any:
    """:func:`capture_batches` for ``groups`` of sites filled by one pass per batch: in memory one
    ``(tensor, mask, sink flags, sink counts)`` per group; a ``store`` takes one group."""
    if store is not None and len(groups) != 1:
        raise ValueError(f"a store holds one group of sites, got {len(groups)}")
    mine = [k for k in range(len(all_batches)) if not parallel or dist.owns(k)]
    results: dict[int, list[Part]] = {}
    err = None
    try:
        results = _run_batches(model, all_batches, mine, groups, positions, dtype, store, progress and dist.is_main(),
                               desc, skip_special, sinks, n_keys)
    except Exception as e:  # every rank must reach the agreement below
        if not parallel:
            raise
        err = e
    if parallel:
        dist.agree(err)
    if store is not None:
        tally = results[-1][0][2] if -1 in results else None
        sink_note([x.name for x in groups[0]], tally, sinks, "mean" in describe(positions))  # the warning
        if parallel:
            dist.on_main(lambda: store.finish(dist.process_info()))
            return store.reload()
        store.finish()
        return store
    if parallel:
        for part in dist.gather_objects(results):
            results.update({k: v for k, v in part.items() if k >= 0})
    return [_joined([results[k][g] for k in range(len(all_batches))]) for g in range(len(groups))]


def _joined(got: list[Part]) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """One group's batches joined: ``(tensor, mask, sink flags, sink counts per site)``."""
    flags = [f for _, _, f in got]
    counts = None if any(f is None for f in flags) else sum((f.sum(-1) if f.dim() == 3 else f).sum(0) for f in flags)
    keep = flags if all(f is not None and f.dtype == torch.bool for f in flags) else None
    tensor, mask, sink_flags = _join([a for a, _, _ in got], [m for _, m, _ in got], keep)
    return tensor, mask, sink_flags, counts


def _run_batches(model: Model, all_batches: list[Batch], mine: list[int], groups: list[list[Site]],
                 positions: PositionSpec, dtype: torch.dtype, store: ActivationStore | None, progress: bool, desc: str,
                 skip_special: bool, sinks: str = "exclude", n_keys: int | None = None) -> dict[int, list[Part]]:
    """Batches ``mine``: written to ``store`` (one group; skipping shards already there; key ``-1`` then holds the
    sink counts per site of the batches run) or returned by index as ``(acts, mask, sink flags)`` per group."""
    pin = store is not None and model.device.type == "cuda"
    out: dict[int, list[Part]] = {}
    tally = torch.zeros(len(groups[0]), dtype=torch.long)
    bar = tqdm(total=sum(all_batches[k].input_ids.shape[0] for k in mine), desc=desc, unit="prompt",
               disable=not progress, leave=False)
    try:
        for k in mine:
            batch = all_batches[k]
            if store is not None and store.has_shard(k):
                bar.update(batch.input_ids.shape[0])
                continue
            parts, _ = run_groups(model, batch, groups, positions, dtype, skip_special=skip_special, pin=pin,
                                  sinks=sinks, n_keys=n_keys)
            for acts, _, _ in parts:
                _check_finite(acts, k)
            if store is not None:
                acts, mask, flags = parts[0]
                store.write_shard(k, acts, mask, sinks=flags if flags is not None and flags.dim() == 3 else None,
                                  counts=flags if flags is not None and flags.dim() == 2 else None)
                if flags is not None:
                    tally += (flags.sum(-1) if flags.dim() == 3 else flags).sum(0)
            else:
                out[k] = parts
            bar.update(batch.input_ids.shape[0])
    finally:
        bar.close()
    if store is not None:
        out[-1] = [(torch.empty(0), None, tally)]
    return out


def _check_finite(acts: torch.Tensor, k: int) -> None:
    if not torch.isfinite(acts).all():
        raise FloatingPointError(f"non-finite activations in batch {k}: the model produced NaN/Inf (try float32 "
                                 f"or check the weights)")


def _join(results: list[torch.Tensor], masks: list[torch.Tensor | None], flags: list[torch.Tensor] | None = None
          ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Batches stacked, left-padded to the widest; ``flags [b, S, P]`` padded alike (or ``None``)."""
    if masks[0] is None:
        return torch.cat(results), None, None
    width = max(r.shape[2] for r in results)
    n, S, d = sum(r.shape[0] for r in results), results[0].shape[1], results[0].shape[-1]
    tensor = torch.zeros(n, S, width, d, dtype=results[0].dtype)
    mask = torch.zeros(n, width, dtype=torch.bool)
    sink = torch.zeros(n, S, width, dtype=torch.bool) if flags is not None else None
    i = 0
    for j, (r, m) in enumerate(zip(results, masks, strict=False)):
        b, P = r.shape[0], r.shape[2]
        tensor[i:i + b, :, width - P:] = r
        mask[i:i + b, width - P:] = m
        if sink is not None:
            sink[i:i + b, :, width - P:] = flags[j]
        i += b
    return tensor, mask, sink
