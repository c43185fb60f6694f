"""Path patching: the effect of a sender (head, attention or MLP block) on a receiver (a head's q/k/v input, an
attention or MLP block's input, or the logits) through the residual stream only.

The sender's change ``delta = sender_out(source) - sender_out(target)`` is added to the receiver's *input*
while the residual stream itself is left alone, so every other component still reads the target run; what
the receiver then writes flows on normally. Many senders are batched per forward (stacked along the batch).
Path patching a sender into every downstream reader at once equals activation patching the sender (exactly,
except for single heads under a post-attention norm, Gemma-2/3 and OLMo-2, where a head's share of the normed
output is a linear split, not what patching its ``z`` alone would give).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from interp.arch import has_module
from interp.forward import last_logits
from interp.hooking import _input_of, _with_input, module_hooks
from interp.models import Model, onloaded
from interp.patching.heads import split_heads
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
from interp.sites import Site
from interp.values import Runtime, moved_keywords


@dataclass(frozen=True)
class Component:
    """A sender or receiver: ``kind`` in ``head``, ``attn``, ``mlp``, ``logits``; ``which`` names a head
    receiver's inputs (a subset of ``qkv``)."""

    kind: str
    layer: int | None = None
    head: int | None = None
    which: str = "qkv"

    @property
    def name(self) -> str:
        if self.kind == "logits":
            return "logits"
        base = f"{self.kind}.{self.layer}" + (f".{self.head}" if self.head is not None else "")
        return base + (f".{self.which}" if self.kind == "head" and self.which != "qkv" else "")


def parse_component(spec: str | Component, model: Model, receiver: bool) -> Component:
    """``head.L.H`` (receivers: ``head.L.H.q`` / ``.k`` / ``.v`` / ``.qk``...), ``attn.L``, ``mlp.L``, ``logits``."""
    if isinstance(spec, Component):
        c = spec
    else:
        parts = str(spec).strip().split(".")
        try:
            if parts[0] == "logits" and len(parts) == 1:
                c = Component("logits")
            elif parts[0] == "head" and len(parts) in (3, 4):
                c = Component("head", int(parts[1]), int(parts[2]), parts[3] if len(parts) == 4 else "qkv")
            elif parts[0] in ("attn", "mlp") and len(parts) == 2:
                c = Component(parts[0], int(parts[1]))
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"cannot read component {spec!r}: use 'head.LAYER.HEAD', 'attn.LAYER', 'mlp.LAYER'"
                             + (", 'head.LAYER.HEAD.q|k|v' or 'logits'" if receiver else "")) from None
    if c.kind == "logits":
        if not receiver:
            raise ValueError("'logits' can only be a receiver")
        return c
    L = model.n_layers
    layer = c.layer + L if c.layer is not None and c.layer < 0 else c.layer
    if layer is None or not 0 <= layer < L:
        raise ValueError(f"component {c.name}: layer out of range; this model has layers 0..{L - 1}")
    if c.kind == "head":
        if c.head is None or not 0 <= c.head < model.n_heads:
            raise ValueError(f"component {c.name}: head out of range; this model has heads 0..{model.n_heads - 1}")
        if not c.which or set(c.which) - set("qkv"):
            raise ValueError(f"component {c.name}: a head receiver's inputs are a subset of 'qkv', got {c.which!r}")
        if not receiver and c.which != "qkv":
            raise ValueError(f"sender {c.name}: q/k/v only apply to receivers")
    return Component(c.kind, layer, c.head, c.which)


def _stages(model: Model, c: Component) -> tuple[float, float]:
    """(read, write) points on the residual stream: block ``l`` spans ``[l, l+1]``."""
    if c.kind == "logits":
        return float(model.n_layers), float("inf")
    assert c.layer is not None
    if c.kind == "mlp" and not model.spec.parallel_residual:
        return c.layer + 0.5, c.layer + 1.0
    return float(c.layer), (c.layer + 1.0 if model.spec.parallel_residual else c.layer + 0.5)


def check_order(model: Model, sender: Component, receiver: Component) -> None:
    if _stages(model, sender)[1] > _stages(model, receiver)[0]:
        raise ValueError(f"sender {sender.name} is not upstream of receiver {receiver.name}: the receiver reads the "
                         f"residual stream before the sender writes to it")


def _branch_in(model: Model, c: Component) -> str:
    """Block-relative module whose input is the receiver's view of the residual stream."""
    spec = model.spec
    if c.kind in ("attn", "head"):
        return spec.resid_pre_in
    if spec.parallel_residual or spec.resid_mid_in is None:
        return spec.extra.get("mlp_in", spec.norms[-1])
    return spec.resid_mid_in


def _qkv(model: Model, layer: int, which: str, head: int) -> tuple[nn.Module, torch.Tensor, bool]:
    """(projection module, output columns of ``which`` for ``head``, Conv1D?)."""
    attn = model.module(model.spec.attn, layer)
    H, KV, dh = model.n_heads, model.n_kv_heads, model.d_head
    g = head // max(1, H // KV)
    if all(has_module(attn, f"{w}_proj") for w in "qkv"):
        if model.spec.family == "olmo2" and which in "qk":
            raise ValueError("olmo2 normalises q and k across all heads, so one head's q/k input cannot be isolated; "
                             "use the receiver 'attn.L' or the head's v")
        start = head * dh if which == "q" else g * dh
        return getattr(attn, f"{which}_proj"), torch.arange(start, start + dh), False
    if has_module(attn, "c_attn"):                                       # GPT-2: [q | k | v], Conv1D
        start = "qkv".index(which) * H * dh + head * dh
        return attn.c_attn, torch.arange(start, start + dh), True
    if has_module(attn, "qkv_proj"):                                     # Phi-3: [q (H) | k (KV) | v (KV)]
        start = {"q": head * dh, "k": H * dh + g * dh, "v": H * dh + KV * dh + g * dh}[which]
        return attn.qkv_proj, torch.arange(start, start + dh), False
    if has_module(attn, "query_key_value"):                              # GPT-NeoX: per head [q k v]
        start = head * 3 * dh + "qkv".index(which) * dh
        return attn.query_key_value, torch.arange(start, start + dh), False
    raise ValueError(f"{model.spec.family}: cannot locate q/k/v projections for head receivers; use 'attn.L'")


def _linear_cols(mod: nn.Module, x: torch.Tensor, cols: torch.Tensor, conv1d: bool) -> torch.Tensor:
    W, b = mod.weight, getattr(mod, "bias", None)
    c = cols.to(W.device)
    out = x @ W[:, c] if conv1d else x @ W[c].T
    return out if b is None else out + b[c]


def receiver_hooks(model: Model, receivers: Sequence[Component], delta: dict[str, torch.Tensor]) -> list:
    """Hooks adding ``delta['d'] [B, T, d]`` into each receiver's input (and nowhere else)."""
    out: list = []

    def add_pre(mod: nn.Module, args: tuple, kwargs: dict) -> Any:
        x = _input_of(args, kwargs)
        return _with_input(args, kwargs, x + delta["d"].to(x.dtype))

    heads_by_layer: dict[int, list[Component]] = {}
    for r in receivers:
        if r.kind == "logits":
            out.append((model.module(model.spec.final_norm), "pre", add_pre))
        elif r.kind in ("attn", "mlp"):
            out.append((model.module(_branch_in(model, r), r.layer), "pre", add_pre))
        else:
            heads_by_layer.setdefault(int(r.layer), []).append(r)
    for layer, rs in heads_by_layer.items():
        entry = model.module(model.spec.resid_pre_in, layer)
        stash: dict[str, torch.Tensor] = {}

        def grab(mod: nn.Module, args: tuple, kwargs: dict, stash=stash, entry=entry, layer=layer) -> None:
            x = _input_of(args, kwargs)
            alt = x + delta["d"].to(x.dtype)
            stash["alt"] = alt if entry is model.module(model.spec.attn, layer) else entry.forward(alt)

        out.append((entry, "pre", grab))
        by_mod: dict[int, tuple[nn.Module, bool, list[torch.Tensor]]] = {}
        for r in rs:
            for w in r.which:
                mod, cols, conv = _qkv(model, layer, w, int(r.head))
                by_mod.setdefault(id(mod), (mod, conv, []))[2].append(cols)
        for mod, conv, col_list in by_mod.values():
            cols = torch.unique(torch.cat(col_list))

            def swap(m: nn.Module, args: tuple, o: torch.Tensor, cols=cols, conv=conv, stash=stash) -> torch.Tensor:
                o = o.clone()
                with onloaded(m):                                        # offloaded weights: back after the call
                    o[..., cols.to(o.device)] = _linear_cols(m, stash["alt"], cols, conv).to(o.dtype)
                return o

            out.append((mod, "post", swap))
    return out


def _sender_site(c: Component) -> Site:
    return Site("attn_z" if c.kind == "head" else f"{c.kind}_out", c.layer)


def _sender_outputs(model: Model, pairs: PromptPairs, senders: Sequence[Component], source: str, target: str
                    ) -> tuple[dict[Component, torch.Tensor], float, float]:
    """Aligned ``source - target`` output of each sender ``[n, P, d]`` and both runs' metrics (via logits)."""
    sites = list(dict.fromkeys(_sender_site(c) for c in senders))
    out = {}
    src, src_logits = run_with_capture(model, pairs.batch(source), sites)
    tgt, tgt_logits = run_with_capture(model, pairs.batch(target), sites)
    split_cache: dict[tuple[str, int], torch.Tensor] = {}
    for c in senders:
        site = _sender_site(c)
        a = gather_aligned(src[site], pairs.cols[source]).float()
        b = gather_aligned(tgt[site], pairs.cols[target]).float()
        if c.kind == "head":
            for run, z in (("s", a), ("t", b)):
                if (run, c.layer) not in split_cache:
                    split_cache[(run, c.layer)] = split_heads(model, c.layer, z)[0]
            out[c] = (split_cache[("s", c.layer)][:, :, c.head] - split_cache[("t", c.layer)][:, :, c.head]).cpu()
        else:
            out[c] = (a - b).cpu()
    return out, src_logits, tgt_logits


def _run(model: Model, pairs: PromptPairs, variants: Sequence[Sequence[Component]], receivers: Sequence[Component],
         diffs: dict[Component, torch.Tensor], target: str, metric: Metric, batch_size: int,
         progress: bool = False) -> torch.Tensor:
    batch = pairs.batch(target)
    n, T = batch.input_ids.shape
    cols = pairs.cols[target]
    k = max(1, batch_size // n)
    values = torch.empty(len(variants))
    delta: dict[str, torch.Tensor] = {}
    dev = model.device
    with torch.no_grad(), module_hooks(receiver_hooks(model, receivers, delta)), \
            progress_bar(-(-len(variants) // k), "path patching", progress) as bar:
        for start in range(0, len(variants), k):
            chunk = variants[start:start + k]
            d = torch.zeros(len(chunk) * n, T, model.d_model)
            for j, senders in enumerate(chunk):
                rows = torch.arange(j * n, (j + 1) * n)[:, None]
                d[rows, cols] = sum(diffs[s] for s in senders)
            delta["d"] = d.to(dev)
            logits = last_logits(model, batch, repeat=len(chunk))
            for j in range(len(chunk)):
                values[start + j] = call_metric(metric, logits[j * n:(j + 1) * n]).cpu()
            bar.update(1)
    return values


def _prepare(model: Model, pairs: PromptPairs, senders: Sequence, receivers: Any, source: str, target: str):
    check_run(source)
    check_run(target)
    check_pairs(pairs)
    recv = [parse_component(r, model, True) for r in ([receivers] if isinstance(receivers, (str, Component))
                                                      else receivers)]
    if not recv:
        raise ValueError("no receivers given; e.g. receivers='logits' or ['head.3.1.q', 'mlp.3']")
    send = [parse_component(s, model, False) for s in senders]
    for s in send:
        for r in recv:
            check_order(model, s, r)
    return send, recv


@moved_keywords(MOVED)
def path_patch(model: Model, pairs: PromptPairs, metric: Metric, senders: str | Component | Sequence,
               receivers: str | Component | Sequence, runs: tuple[str, str] = ("clean", "corrupted")) -> float:
    """Metric of the target run when the senders' change (``source - target``, summed over senders; ``runs =
    (source, target)``) reaches only the receivers' inputs."""
    source, target = check_runs(runs)
    send_list = [senders] if isinstance(senders, (str, Component)) else list(senders)
    send, recv = _prepare(model, pairs, send_list, receivers, source, target)
    diffs, _, _ = _sender_outputs(model, pairs, send, source, target)
    return float(_run(model, pairs, [send], recv, diffs, target, metric, batch_size=pairs.n_pairs)[0])


@moved_keywords(MOVED)
def path_patch_sweep(model: Model, pairs: PromptPairs, metric: Metric, receivers: Any = "logits",
                     senders: str = "heads", layers: Sequence[int] | None = None,
                     runs: tuple[str, str] = ("clean", "corrupted"), runtime: Runtime | None = None) -> Sweep:
    """Each sender alone into ``receivers``: ``senders='heads'`` gives ``[L, H]``, ``'blocks'`` ``[L, 2]``
    (attention, MLP). Layers default to those upstream of every receiver; ``runs``: (source, target);
    ``runtime``: rows per forward (default 64) and a bar over the forwards."""
    source, target = check_runs(runs)
    runtime = patch_runtime(runtime)
    if senders not in ("heads", "blocks"):
        raise ValueError(f"senders must be 'heads' or 'blocks', got {senders!r}")
    _, recv = _prepare(model, pairs, [], receivers, source, target)
    cols = [str(h) for h in range(model.n_heads)] if senders == "heads" else ["attn", "mlp"]

    def make(layer: int, c: str) -> Component:
        return Component("head", layer, int(c)) if senders == "heads" else Component(c, layer)

    def ok(comp: Component) -> bool:
        return all(_stages(model, comp)[1] <= _stages(model, r)[0] for r in recv)

    layer_list = list(range(model.n_layers)) if layers is None else [int(x) % model.n_layers for x in layers]
    layer_list = [la for la in layer_list if ok(make(la, cols[0]))]
    if not layer_list:
        raise ValueError("no sender layer is upstream of every receiver; choose later receivers or earlier layers")
    grid = [[make(la, c) for c in cols] for la in layer_list]
    flat = [c for row in grid for c in row if ok(c)]          # an MLP sender may sit after a same-layer receiver
    diffs, src_logits, tgt_logits = _sender_outputs(model, pairs, flat, source, target)
    got = dict(zip(flat, _run(model, pairs, [[c] for c in flat], recv, diffs, target, metric, runtime.batch_size,
                                  runtime.progress).tolist(), strict=True))
    vals = torch.tensor([[got.get(c, float("nan")) for c in row] for row in grid])
    return Sweep(vals, float(call_metric(metric, tgt_logits)), float(call_metric(metric, src_logits)),
                 [str(la) for la in layer_list], cols, col_name="head" if senders == "heads" else "block",
                 site="path:" + ",".join(r.name for r in recv), method="path", metric=metric_name(metric),
                 meta={"receivers": [r.name for r in recv], "source": source, "target": target})


__all__ = ["Component", "parse_component", "check_order", "path_patch", "path_patch_sweep", "receiver_hooks"]
