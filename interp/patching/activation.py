"""Exact activation patching, batched: many patched variants share one forward, stacked along the batch.

A variant is a set of edits; each edit overwrites one site (residual, attention/MLP output, one head's ``z``,
one neuron, or a site inside attention: q / k / v / rot_q / rot_k per head, scores / pattern per head and query
row) at some aligned positions of the target run with values from the source run (or with zeros / means for
ablations). Variants patching different layers run in the same forward, so a layer x position sweep
costs ``n_cells * n_pairs / batch_size`` forwards instead of ``n_cells``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int

from interp.chat import Batch
from interp.forward import KV, last_logits, prefix_cache
from interp.hooking import HookContext, hooks
from interp.models import Model
from interp.patching.measures import Metric, call_metric, metric_name
from interp.patching.progress import progress_bar
from interp.patching.results import Sweep
from interp.patching.runs import (
    MOVED,
    PromptPairs,
    check_pairs,
    check_run,
    check_runs,
    gather_aligned,
    patch_runtime,
    run_with_capture,
)
from interp.sites import WRITERS, Site, expand_sites, parse_site, resolve_layers
from interp.values import Runtime, moved_keywords

HEAD_KINDS = ("attn_z", "q", "k", "v", "rot_q", "rot_k", "scores", "pattern")  # sites with a head axis
KV_KINDS = ("k", "v", "rot_k")  # per key-value head
TABLES = ("scores", "pattern")  # [batch, heads, query, key] in a hook


@dataclass(frozen=True)
class Patch:
    """What to patch: ``site`` at aligned ``position`` (an index, a list, or ``None`` for every aligned
    position), optionally only ``head`` (``attn_z``, ``q``, ``rot_q``, ``scores``, ``pattern``; a key-value head for
    ``k``, ``v``, ``rot_k``) or ``neuron`` (site ``mlp_post``). For ``scores`` / ``pattern`` the positions are
    query rows; each row's keys follow the alignment (:func:`aligned_values`)."""

    site: str | Site
    position: int | tuple[int, ...] | None = None
    head: int | None = None
    neuron: int | None = None


@dataclass(frozen=True)
class Edit:
    """A resolved patch: canonical site, aligned position indices ``[P']`` and component (head / neuron)."""

    site: Site
    pos: torch.Tensor
    comp: int | None = None


def resolve(model: Model, p: Patch, n_positions: int) -> Edit:
    """Validate a :class:`Patch` against the model and the alignment."""
    if not isinstance(p, Patch):
        raise TypeError(f"expected a Patch, got {type(p).__name__}; build one with Patch('resid_pre.3', position=2)")
    site = parse_site(p.site, model.n_layers)
    if p.head is not None and p.neuron is not None:
        raise ValueError("a Patch takes a head or a neuron, not both")
    comp = None
    if p.head is not None:
        if site.kind not in HEAD_KINDS:
            raise ValueError(f"head={p.head} needs a per-head site ({', '.join(HEAD_KINDS)}), not {site.name}")
        kv = site.kind in KV_KINDS
        n_heads = model.n_kv_heads if kv else model.n_heads
        if not 0 <= p.head < n_heads:
            raise ValueError(f"head {p.head} is out of range; {site.name} has {'key-value ' if kv else ''}heads "
                             f"0..{n_heads - 1}")
        comp = int(p.head)
    if p.neuron is not None:
        if site.kind != "mlp_post":
            raise ValueError(f"neuron={p.neuron} needs the site mlp_post (MLP hidden units), not {site.name}")
        d_mlp = int(model.d_mlp or 0)
        if not 0 <= p.neuron < d_mlp:
            raise ValueError(f"neuron {p.neuron} is out of range; this model's MLP has neurons 0..{d_mlp - 1}")
        comp = int(p.neuron)
    if p.position is None:
        pos = list(range(n_positions))
    else:
        pos = [p.position] if isinstance(p.position, int) else list(p.position)
        for q in pos:
            if not -n_positions <= q < n_positions:
                raise ValueError(f"aligned position {q} is out of range: the pairs align {n_positions} positions "
                                 f"(0..{n_positions - 1}, or negative from the end)")
        pos = [q % n_positions for q in pos]
    return Edit(site, torch.tensor(pos, dtype=torch.long), comp)


def _hook(rows: torch.Tensor, cols: torch.Tensor, comps: torch.Tensor | None, vals: torch.Tensor, keys: bool = False):
    """``x[rows, cols(, comps)] = vals``; ``keys`` (rot_k): ``x`` spans the keys, a cached prefix's too, and
    ``cols`` are absolute, so they are shifted by the columns before ``x``'s first key."""
    def fn(x: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        dev = x.device
        x = x.clone()
        tok = ctx.tokens
        at = (cols - (tok.past + tok.seq - x.shape[1]) if keys and tok is not None else cols).to(dev)
        v = vals.to(dev, x.dtype)
        if comps is None:
            x[rows.to(dev), at] = v
        else:
            x[rows.to(dev), at, comps.to(dev)] = v
        return x
    return fn


def _table_hook(rows: torch.Tensor, cols: torch.Tensor, comps: torch.Tensor | None, keys: torch.Tensor,
                vals: torch.Tensor, kind: str):
    """Replace query rows of ``scores`` / ``pattern`` ``x [b, H, T', S]``: ``vals [N, (H,) P]`` at key columns
    ``keys [N, P]`` (absolute: a cached prefix's keys are in ``S``); other keys get 0 (pattern) or masked (scores)."""
    def fn(x: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        dev = x.device
        x = x.clone()
        v, k = vals.to(dev, x.dtype), keys.to(dev)
        fill = torch.finfo(x.dtype).min if kind == "scores" else 0.0
        if comps is None:
            new = torch.full((v.shape[0], x.shape[1], x.shape[3]), fill, dtype=x.dtype, device=dev)
            x[rows.to(dev), :, cols.to(dev)] = new.scatter_(2, k[:, None, :].expand_as(v), v)
        else:
            new = torch.full((v.shape[0], x.shape[3]), fill, dtype=x.dtype, device=dev)
            x[rows.to(dev), comps.to(dev), cols.to(dev)] = new.scatter_(1, k, v)
        return x
    return fn


def _edit_values(e: Edit, values: dict[Site, torch.Tensor], dst_cols: torch.Tensor, n: int
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """An edit's source values ``[n * P', ...]`` and, for scores / pattern, their target key columns ``[n * P', P]``."""
    P = e.pos.numel()
    v = values[e.site][:, e.pos]                       # [n, P', *shape]
    if e.comp is not None:
        v = v[:, :, e.comp]
    if e.site.kind not in TABLES:
        return v.reshape(n * P, *v.shape[2:]), None
    if torch.isnan(v).any():
        raise ValueError(f"{e.site.name}: a patched query row of the source run attends keys that are not aligned "
                         f"with the target (tokens before the alignment, or an alignment out of order), so its row "
                         f"has no place in the target; align every position up to the patched queries (prompts of "
                         f"equal token length, or a source no longer than the target with align='end'), or patch "
                         f"rot_q / rot_k / attn_z instead")
    keys = dst_cols[:, None, :].expand(n, P, dst_cols.shape[1]).reshape(n * P, -1)
    return v.reshape(n * P, *v.shape[2:]), keys


def chunk_hooks(chunk: Sequence[Sequence[Edit]], values: dict[Site, torch.Tensor], dst_cols: torch.Tensor,
                n: int, offset: int = 0) -> list:
    """Hooks for ``k`` variants stacked pair-major in one forward: variant ``j`` of pair ``i`` is row ``i*k + j``.
    ``offset``: columns before it are not in this forward (they come from a cached prefix)."""
    k = len(chunk)
    groups: dict[tuple[Site, bool], list[tuple[torch.Tensor, ...]]] = {}
    base = torch.arange(n)[:, None] * k
    for j, variant in enumerate(chunk):
        for e in variant:
            P = e.pos.numel()
            rows = (base + j).expand(n, P).reshape(-1)
            cols = dst_cols[:, e.pos].reshape(-1) - (0 if e.site.kind == "rot_k" else offset)  # rot_k: every key
            v, keys = _edit_values(e, values, dst_cols, n)
            comps = None if e.comp is None else torch.full_like(rows, e.comp)
            groups.setdefault((e.site, e.comp is not None), []).append((rows, cols, comps, v, keys))
    out = []
    for (site, has_comp), items in groups.items():
        rows, cols, vals = (torch.cat([i[x] for i in items]) for x in (0, 1, 3))
        comps = torch.cat([i[2] for i in items]) if has_comp else None
        if site.kind in TABLES:
            out.append((site, _table_hook(rows, cols, comps, torch.cat([i[4] for i in items]), vals, site.kind)))
        else:
            out.append((site, _hook(rows, cols, comps, vals, keys=site.kind == "rot_k")))
    return out


def _forward_chunk(model: Model, batch: Batch, k: int, start: int, prefix: KV | None) -> torch.Tensor:
    """Last-position logits of the batch stacked ``k`` times pair-major, recomputing only columns ``start:``
    (earlier columns are untouched by the patches, so their keys/values come from the target run)."""
    stacked = Batch(*(t.repeat_interleave(k, 0) for t in (batch.input_ids, batch.attention_mask, batch.position_ids,
                                                          batch.post_mask, batch.response_mask)))
    if prefix is None or start <= 0:
        return last_logits(model, stacked)
    rep = [(K.repeat_interleave(k, 0), V.repeat_interleave(k, 0)) for K, V in prefix]
    return last_logits(model, stacked, prefix=rep, start=start)


@moved_keywords(MOVED)
def run_variants(model: Model, batch: Batch, variants: Sequence[Sequence[Edit]], values: dict[Site, torch.Tensor],
                 dst_cols: torch.Tensor, metric: Metric, runtime: Runtime | None = None, reuse_prefix: bool = True,
                 desc: str = "patching") -> Float[torch.Tensor, "n_variants"]:  # noqa: F821
    """The metric of every variant (a list of edits) on ``batch``, stacking ``runtime.batch_size // n`` variants a
    forward (default 64 rows).

    Variants are grouped by their first patched column; with ``reuse_prefix`` the columns before it are not
    recomputed (a patch cannot change earlier positions of a causal model), which roughly halves the work of a
    position sweep. ``runtime.progress``: a bar over the forwards, named ``desc`` (off by default here).
    """
    runtime = patch_runtime(runtime, progress=False)
    batch_size, progress = runtime.batch_size, runtime.progress
    n = batch.input_ids.shape[0]
    k = max(1, batch_size // n)
    starts = [min(int(dst_cols[:, e.pos].min()) for e in v) if v else dst_cols.shape[1] for v in variants]
    order = sorted(range(len(variants)), key=lambda i: -starts[i])
    prefix = prefix_cache(model, batch) if reuse_prefix and max(starts, default=0) > 0 else None
    out = torch.empty(len(variants))
    with torch.no_grad(), progress_bar(-(-len(order) // k), desc, progress) as bar:
        for c0 in range(0, len(order), k):
            idx = order[c0:c0 + k]
            chunk = [variants[i] for i in idx]
            start = max(0, min(starts[i] for i in idx)) if prefix is not None else 0
            with hooks(model, chunk_hooks(chunk, values, dst_cols, n, offset=start)):
                logits = _forward_chunk(model, batch, len(chunk), start, prefix)
            for j, i in enumerate(idx):
                out[i] = call_metric(metric, logits[j::len(chunk)]).detach().cpu()
            bar.update(1)
    return out


def aligned_values(site: Site, x: torch.Tensor, src_cols: Int[torch.Tensor, "n P"],
                   dst_cols: Int[torch.Tensor, "n P"], src: Batch) -> torch.Tensor:
    """A source run's ``x [n, T, ...]`` at the aligned columns ``[n, P, ...]``; ``scores`` / ``pattern``
    (``[n, H, T, T]``) -> ``[n, P, H, P]``, queries and keys both aligned. A query row whose earlier source keys
    are not all aligned, or whose aligned keys would land after the target's query, is NaN (refused if patched)."""
    if site.kind not in TABLES:
        return gather_aligned(x, src_cols)
    n, T = x.shape[0], x.shape[-1]
    c = src_cols.to(x.device)
    rows = torch.arange(n, device=x.device)[:, None, None]
    out = x.permute(0, 2, 3, 1)[rows, c[:, :, None], c[:, None, :]].permute(0, 1, 3, 2).clone()  # [n, Pq, H, Pk]
    covered = torch.zeros(n, T, dtype=torch.bool, device=x.device)
    covered[rows[:, :, 0], c] = True
    start = (T - src.attention_mask.sum(1)).to(x.device)[:, None]
    gaps = ((~covered) & (torch.arange(T, device=x.device)[None] >= start)).cumsum(1)  # unaligned keys so far
    bad = torch.gather(gaps, 1, c) > 0  # [n, Pq]
    d = dst_cols.to(x.device)
    earlier = c[:, None, :] <= c[:, :, None]  # [n, Pq, Pk]: key at or before the query in the source
    bad |= (earlier & (d[:, None, :] > d[:, :, None])).any(-1)
    out[bad] = float("nan")
    return out


@dataclass
class _Prepared:
    values: dict[Site, torch.Tensor]
    dst_cols: torch.Tensor
    baseline: float
    reference: float


def prepare_patching(model: Model, pairs: PromptPairs, sites: Sequence[Site], metric: Metric, source: str,
                     target: str) -> _Prepared:
    """Capture the source run at ``sites`` (aligned) and measure both runs' metrics."""
    check_run(source)
    check_run(target)
    check_pairs(pairs)
    uniq = list(dict.fromkeys(sites))
    acts, src_logits = run_with_capture(model, pairs.batch(source), uniq)
    values = {s: aligned_values(s, a, pairs.cols[source], pairs.cols[target], pairs.batch(source)).cpu()
              for s, a in acts.items()}
    with torch.no_grad():
        tgt_logits = last_logits(model, pairs.batch(target))
    return _Prepared(values, pairs.cols[target], float(call_metric(metric, tgt_logits)),
                     float(call_metric(metric, src_logits)))


@moved_keywords(MOVED)
def patch(model: Model, pairs: PromptPairs, variants: Sequence[Patch | Sequence[Patch]], metric: Metric,
          runs: tuple[str, str] = ("clean", "corrupted"), reuse_prefix: bool = True,
          runtime: Runtime | None = None) -> Float[torch.Tensor, "n_variants"]:  # noqa: F821
    """Metric of the target run with each variant (one :class:`Patch` or several at once) taken from the source
    run, ``runs = (source, target)``. Default: clean activations into the corrupted run (denoising)."""
    source, target = check_runs(runs)
    check_pairs(pairs)
    if isinstance(variants, Patch):
        variants = [variants]
    edits = [[resolve(model, p, pairs.n_positions) for p in ([v] if isinstance(v, Patch) else v)] for v in variants]
    prep = prepare_patching(model, pairs, [e.site for v in edits for e in v], metric, source, target)
    return run_variants(model, pairs.batch(target), edits, prep.values, prep.dst_cols, metric,
                        patch_runtime(runtime, progress=False), reuse_prefix)


def _layers(model: Model, layers: Sequence[int] | None) -> list[int]:
    return resolve_layers(layers, model.n_layers, what="patching", keep_order=layers is not None)


@moved_keywords(MOVED)
def sweep_positions(model: Model, pairs: PromptPairs, metric: Metric, site: str = "resid_pre",
                    layers: Sequence[int] | None = None, runs: tuple[str, str] = ("clean", "corrupted"),
                    reuse_prefix: bool = True, runtime: Runtime | None = None) -> Sweep:
    """Patch ``site`` (a kind: ``resid_pre``, ``attn_out``, ...) at each layer x aligned position: ``[L, P]``.
    ``runs``: (source, target); ``reuse_prefix``: skip recomputing unpatched columns; ``runtime``: rows per forward
    (variants x pairs, default 64) and a bar over the forwards."""
    source, target = check_runs(runs)
    check_pairs(pairs)
    layer_list = _layers(model, layers)
    sites = expand_sites(site, model.n_layers, layer_list)
    if any(s.layer is None for s in sites) or len({s.kind for s in sites}) != 1:
        raise ValueError(f"sweep_positions takes one per-layer site kind such as 'resid_pre' or 'attn_out', got {site!r}")
    P = pairs.n_positions
    variants = [[Edit(s, torch.tensor([p]))] for s in sites for p in range(P)]
    prep = prepare_patching(model, pairs, sites, metric, source, target)
    vals = run_variants(model, pairs.batch(target), variants, prep.values, prep.dst_cols, metric,
                        patch_runtime(runtime), reuse_prefix, f"patching {sites[0].kind} by position")
    return Sweep(vals.view(len(sites), P), prep.baseline, prep.reference, [str(s.layer) for s in sites],
                 list(pairs.labels), site=sites[0].kind, metric=metric_name(metric),
                 meta={"source": source, "target": target})


@moved_keywords(MOVED)
def sweep_heads(model: Model, pairs: PromptPairs, metric: Metric, layers: Sequence[int] | None = None,
                positions: int | Sequence[int] | None = None, runs: tuple[str, str] = ("clean", "corrupted"),
                runtime: Runtime | None = None) -> Sweep:
    """Patch each head's output (its ``z``) at ``positions`` (default every aligned position): ``[L, H]``.
    ``runs``: (source, target)."""
    source, target = check_runs(runs)
    check_pairs(pairs)
    layer_list = _layers(model, layers)
    P = pairs.n_positions
    edits = [[resolve(model, Patch(Site("attn_z", layer), _pos(positions), head=h), P)]
             for layer in layer_list for h in range(model.n_heads)]
    prep = prepare_patching(model, pairs, [Site("attn_z", layer) for layer in layer_list], metric, source, target)
    vals = run_variants(model, pairs.batch(target), edits, prep.values, prep.dst_cols, metric,
                        patch_runtime(runtime), desc="patching heads")
    return Sweep(vals.view(len(layer_list), model.n_heads), prep.baseline, prep.reference,
                 [str(x) for x in layer_list], [str(h) for h in range(model.n_heads)], col_name="head", site="attn_z",
                 metric=metric_name(metric), meta={"source": source, "target": target, "positions": positions})


@moved_keywords(MOVED)
def sweep_layers(model: Model, pairs: PromptPairs, metric: Metric,
                 sites: Sequence[str] = WRITERS, layers: Sequence[int] | None = None,
                 positions: int | Sequence[int] | None = None, runs: tuple[str, str] = ("clean", "corrupted"),
                 runtime: Runtime | None = None) -> Sweep:
    """Patch each site kind at every aligned position (or ``positions``), one layer at a time: ``[L, kinds]``.
    ``runs``: (source, target)."""
    source, target = check_runs(runs)
    check_pairs(pairs)
    layer_list = _layers(model, layers)
    P = pairs.n_positions
    grid = [[Site(parse_site(f"{k}.0").kind, layer) for k in sites] for layer in layer_list]
    edits = [[resolve(model, Patch(s, _pos(positions)), P)] for row in grid for s in row]
    prep = prepare_patching(model, pairs, [s for row in grid for s in row], metric, source, target)
    vals = run_variants(model, pairs.batch(target), edits, prep.values, prep.dst_cols, metric,
                        patch_runtime(runtime), desc="patching layers")
    return Sweep(vals.view(len(layer_list), len(sites)), prep.baseline, prep.reference, [str(x) for x in layer_list],
                 [grid[0][i].kind for i in range(len(sites))], col_name="site", site=",".join(sites),
                 metric=metric_name(metric), meta={"source": source, "target": target, "positions": positions})


def _pos(positions: int | Sequence[int] | None) -> int | tuple[int, ...] | None:
    if positions is None or isinstance(positions, int):
        return positions
    return tuple(int(p) for p in positions)


__all__ = ["Patch", "Edit", "resolve", "patch", "run_variants", "chunk_hooks", "prepare_patching", "aligned_values",
           "sweep_positions",
           "sweep_heads", "sweep_layers"]
