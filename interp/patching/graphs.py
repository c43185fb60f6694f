"""Attribution graphs (Ameisen et al. 2025): direct effects among features, errors, tokens and targets.

In the linearised replacement model of one prompt (:meth:`patching.replacement.ReplacementModel.frozen`:
attention patterns, norm scales and feature activations fixed) every node writes a vector into the residual
stream (a feature: ``activation * W_dec[f]`` at its MLP's output, and with a cross-layer transcoder
``activation * D(l, L)[f]`` at every later MLP ``L`` too, its edges summed over those writes; an error node: the error term; a token: its
embedding), and every feature and target reads one linear function of it (a feature: its encoder pre-activation
``W_enc[:, f] . mlp_in + b_enc``; a target: :class:`patching.graph_targets.Readout`). The edge ``s -> t`` is
``activation_s * (d t / d written_s) . vector_s``: one backward pass per target row, batched: the linearised
model runs on ``batch_size`` copies of the prompt and each copy gets one row's gradient.

Because the linearised model is affine in the nodes and every other feature is held fixed, the edges into a
row sum to its value minus its constant part: ``sum_s A[t, s] = value_t - bias_t - rest_t`` exactly, where
``bias_t`` is the row's value with every node (features, errors, embeddings) set to zero and ``rest_t`` the
part of active features left out by ``max_feature_nodes`` (zero without a budget).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from interp.patching.graph_result import AttributionGraph
from interp.patching.graph_targets import Readout, Target, resolve_targets
from interp.patching.progress import progress_bar
from interp.patching.replacement import ReplacementModel, ReplacementRun
from interp.values import Prompts, Runtime, moved_keywords

Row = tuple[str, int]  # ("feature", index into the active features) or ("target", index into the readouts)


def active_features(run: ReplacementRun, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Every non-zero feature activation of a run at positions ``>= start``: ``(index [n, 3] (layer, position,
    feature), values [n])``, sorted by layer, position, feature."""
    idx, vals = [], []
    for layer, z in run.acts.items():
        nz = z.nonzero()
        nz = nz[nz[:, 0] >= start]
        idx.append(torch.cat([torch.full((nz.shape[0], 1), layer, dtype=torch.long), nz.cpu()], 1))
        vals.append(z[nz[:, 0], nz[:, 1]])
    return torch.cat(idx), torch.cat(vals)


class _Engine:
    """The linearised forward of ``batch_size`` copies (kept for every backward) and the edge read-out."""

    def __init__(self, rm: ReplacementModel, run: ReplacementRun, readouts: list[Readout], batch_size: int,
                 constant_positions: int = 0):
        self.rm, self.run, self.readouts, self.B = rm, run, readouts, batch_size
        self.c = constant_positions
        self.feats, self.acts = active_features(run, self.c)
        self.errors = {layer: torch.cat([torch.zeros_like(e[:self.c]), e[self.c:]]) for layer, e in run.errors.items()}
        self.sites = sorted({r.site for r in readouts})
        self.T, self.L = run.n_positions, rm.n_layers
        self.n_cols = len(self.feats) + self.L * self.T + self.T
        self.stash = rm.linear(run, batch=batch_size, grad=True, read=self.sites)
        self.by_layer = [(self.feats[:, 0] == layer).nonzero()[:, 0] for layer in range(self.L)]

    def _inject(self, rows: Sequence[Row]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        outs: dict[Any, torch.Tensor] = {}
        gos: dict[Any, torch.Tensor] = {}

        def add(key: Any, t: torch.Tensor, b: torch.Tensor, pos: torch.Tensor, vecs: torch.Tensor) -> None:
            outs[key] = t
            g = gos.setdefault(key, torch.zeros_like(t))
            g.index_put_((b.to(g.device), pos.to(g.device)), vecs.detach().to(g.dtype), accumulate=True)

        rows_b = torch.arange(len(rows))
        feat = torch.tensor([i if k == "feature" else -1 for k, i in rows], dtype=torch.long)
        is_feat = (feat >= 0).nonzero()[:, 0]
        layers = self.feats[feat[is_feat], 0]
        for layer in layers.unique().tolist():
            sel = is_feat[layers == layer]
            fi = self.feats[feat[sel]]
            add(("mlp_in", layer), self.stash["mlp_in"][layer], rows_b[sel], fi[:, 1],
                self.rm.transcoders[layer].W_enc[:, fi[:, 2]].T)
        for b, (kind, i) in enumerate(rows):
            if kind == "target":
                r = self.readouts[i]
                add(("site", r.site), self.stash["sites"][r.site], rows_b[b:b + 1], torch.tensor([r.position]),
                    r.vector[None])
        keys = list(outs)
        return [outs[k] for k in keys], [gos[k] for k in keys]

    def rows(self, rows: Sequence[Row]) -> torch.Tensor:
        """Edges into each row from every source ``[len(rows), n_cols]`` (columns: all active features, errors,
        tokens)."""
        outs, gos = self._inject(rows)
        sources = [self.stash["mlp_out"][layer] for layer in range(self.L)] + [self.stash["embed"]]
        grads = torch.autograd.grad(outs, sources, gos, retain_graph=True, allow_unused=True)
        n = len(rows)
        out = torch.zeros(n, self.n_cols, dtype=self.acts.dtype, device=self.acts.device)
        err0 = len(self.feats)
        for layer, g in enumerate(grads[:-1]):
            if g is None:
                continue
            g = g[:n].detach()
            for src in (range(layer + 1) if self.rm.clt is not None else [layer]):
                idx = self.by_layer[src]
                if idx.numel():
                    pos, f = self.feats[idx, 1], self.feats[idx, 2]
                    dec = self._decoder(src, layer)[f].detach()                      # [n_src_feats, d]
                    per = g.to(dec.dtype) @ dec.T                                     # [n, T, n_src_feats]
                    out[:, idx] += per[:, pos, torch.arange(idx.numel())].to(out.dtype) * self.acts[idx]
            out[:, err0 + layer * self.T: err0 + (layer + 1) * self.T] = (g * self.errors[layer]).sum(-1)
        if grads[-1] is not None:
            out[:, -self.T:] = (grads[-1][:n].detach() * self.run.embed).sum(-1)
        return out

    def _decoder(self, source: int, target: int) -> torch.Tensor:
        """How layer ``source``'s features write into MLP ``target`` ``[d_sae, d]`` (a CLT's cross-layer decoder)."""
        clt = self.rm.clt
        return self.rm.transcoders[source].W_dec if clt is None else clt.decoder(source, target)

    def values(self, stash: dict[str, Any], rows: Sequence[Row]) -> torch.Tensor:
        """Each row's value read from a pass's stash (row 0 of its batch)."""
        out = torch.zeros(len(rows), dtype=self.acts.dtype)
        feat = torch.tensor([i if k == "feature" else -1 for k, i in rows], dtype=torch.long)
        is_feat = (feat >= 0).nonzero()[:, 0]
        fi = self.feats[feat[is_feat]]
        for layer in fi[:, 0].unique().tolist():
            here = fi[:, 0] == layer
            tc, pos, f = self.rm.transcoders[layer], fi[here, 1], fi[here, 2]
            x = stash["mlp_in"][layer][0, pos].detach().to(tc.dtype)
            out[is_feat[here]] = ((x * tc.W_enc[:, f].T).sum(-1) + tc.b_enc[f]).detach().to(out.dtype)
        sites = {k: v[:1].detach() for k, v in stash["sites"].items()}
        for b, (kind, i) in enumerate(rows):
            if kind == "target":
                out[b] = self.readouts[i].value(sites)[0].detach().to(out.dtype)
        return out

    def zero_pass(self) -> dict[str, Any]:
        """The linearised model with every node at zero: what remains are the constant (bias) terms (with the MLP
        outputs at the constant positions, which are no nodes)."""
        run, c = self.run, self.c
        zeros = {layer: torch.cat([a[:c], torch.zeros_like(a[c:])])[None] for layer, a in run.acts.items()}
        errs = {layer: (e - self.errors[layer])[None] for layer, e in run.errors.items()}
        return self.rm.linear(run, zeros, errs, torch.zeros_like(run.embed)[None], read=self.sites)


def _partial_influence(R: torch.Tensor, row_feat: torch.Tensor, w: torch.Tensor, n_feats: int, depth: int
                       ) -> torch.Tensor:
    """Influence on the targets of every feature column, from the rows computed so far (``R [m, n_cols]``,
    ``row_feat [m]``: each row's feature index or -1 for a target row, ``w [m]`` the targets' weights)."""
    a = R.double().abs()
    Bn = a / a.sum(1, keepdim=True).clamp_min(1e-30)
    cur, total = w.double(), torch.zeros(R.shape[1], dtype=torch.float64)
    is_feat = row_feat >= 0
    for _ in range(depth):
        contrib = cur @ Bn
        total += contrib
        cur = torch.where(is_feat, contrib[row_feat.clamp_min(0)], torch.zeros_like(cur))
        if not bool(cur.any()):
            break
    return total[:n_feats]


def _feature_rows(eng: _Engine, R0: torch.Tensor, w: torch.Tensor, budget: int, progress: bool
                  ) -> tuple[list[int], torch.Tensor]:
    """Compute feature rows, all of them or (with a budget) the most influential ones, re-ranked per batch."""
    n_f = len(eng.feats)
    chosen: list[int] = []
    blocks: list[torch.Tensor] = []
    with progress_bar(budget, "attribution graph", progress, unit="feature") as bar:
        while len(chosen) < budget:
            if budget == n_f:
                nxt = list(range(len(chosen), min(len(chosen) + eng.B, n_f)))
            else:
                R = torch.cat([R0, *blocks])
                row_feat = torch.tensor([-1] * len(R0) + chosen, dtype=torch.long)
                ww = torch.cat([w, torch.zeros(len(chosen), dtype=w.dtype)])
                infl = _partial_influence(R, row_feat, ww, n_f, eng.L + 2)
                infl[chosen] = -1.0
                nxt = infl.argsort(descending=True)[:min(eng.B, budget - len(chosen))].tolist()
            blocks.append(eng.rows([("feature", i) for i in nxt]))
            chosen += nxt
            bar.update(len(nxt))
    return chosen, (torch.cat(blocks) if blocks else torch.zeros(0, eng.n_cols, dtype=R0.dtype))


@dataclass(frozen=True)
class GraphConfig:
    """The budget of :func:`attribution_graph`. ``max_positions``: the graph budget in tokens (a longer prompt is
    refused); ``max_feature_nodes``: at most this many feature nodes, the most influential ones (ranked from the rows
    computed so far); ``node_threshold`` / ``edge_threshold``: the influence fractions pruning keeps
    (:meth:`AttributionGraph.prune`); ``constant_positions``: the first this many positions' MLP outputs are
    constants, not nodes (no features there, their error nodes zero, their part in each row's ``bias``), as
    circuit-tracer holds position 0, the BOS attention sink, whose features are artifacts (pass 1 to match it)."""

    max_positions: int = 64
    max_feature_nodes: int | None = None
    node_threshold: float = 0.8
    edge_threshold: float = 0.98
    constant_positions: int = 0

    def __post_init__(self) -> None:
        if self.max_feature_nodes is not None and self.max_feature_nodes < 0:
            raise ValueError(f"max_feature_nodes must be >= 0, got {self.max_feature_nodes}")


GRAPH_MOVED = {"chat": "prompt=interp.Prompts([text], chat=...)",
               "batch_size": "runtime=interp.Runtime(batch_size=...)", "progress": "runtime=interp.Runtime(progress=...)",
               **{f.name: f"config=interp.patching.GraphConfig({f.name}=...)" for f in fields(GraphConfig)}}


@moved_keywords(GRAPH_MOVED)
def attribution_graph(rm: ReplacementModel, prompt: str | Prompts | Sequence[int] | torch.Tensor,
                      target: Target | Sequence[Target] | None = None, *, config: GraphConfig | None = None,
                      runtime: Runtime | None = None) -> AttributionGraph:
    """The attribution graph of ``prompt`` for ``target`` (default :class:`~patching.graph_targets.TopLogits`;
    also ``LogitDiff(a, b)``, ``Projection(vector, site)`` or a list of them).

    ``prompt``: a string (the chat template), ``interp.Prompts([text], chat=False)`` (raw text) or token ids;
    ``config``: the budget (:class:`GraphConfig`); ``runtime``: target rows per backward pass (``batch_size``,
    default 32) and a bar (default off). Exact identity: see :mod:`patching.graphs`."""
    cfg = config or GraphConfig()
    runtime = runtime if runtime is not None else Runtime(batch_size=32, progress=False)
    batch_size, progress, constant_positions = runtime.batch_size, runtime.progress, cfg.constant_positions
    t0 = time.perf_counter()
    run = rm.run(_one_prompt(prompt), max_positions=cfg.max_positions)
    readouts = resolve_targets(rm, run, target)
    if not 0 <= constant_positions < run.n_positions:
        raise ValueError(f"constant_positions must be in 0..{run.n_positions - 1} (the prompt has {run.n_positions} "
                         f"tokens), got {constant_positions}")
    eng = _Engine(rm, run, readouts, batch_size, constant_positions)
    n_f = len(eng.feats)
    t_rows = [("target", j) for j in range(len(readouts))]
    R0 = torch.cat([eng.rows(t_rows[i:i + batch_size]) for i in range(0, len(t_rows), batch_size)])
    w = torch.tensor([r.weight for r in readouts], dtype=torch.float64)
    budget = n_f if cfg.max_feature_nodes is None else min(cfg.max_feature_nodes, n_f)
    chosen, RF = _feature_rows(eng, R0, w, budget, progress)
    return _assemble(eng, readouts, chosen, RF, R0, time.perf_counter() - t0, cfg.node_threshold,
                     cfg.edge_threshold)


def _one_prompt(prompt: str | Prompts | Sequence[int] | torch.Tensor) -> Prompts | Sequence[int] | torch.Tensor:
    """One prompt as :meth:`ReplacementModel.run` reads it: a string as ``interp.Prompts([text])`` (chat template)."""
    if isinstance(prompt, str):
        return Prompts([prompt])
    if isinstance(prompt, Prompts) and len(prompt) != 1:
        raise ValueError(f"attribution_graph takes one prompt, got {len(prompt)}; loop over them")
    return prompt


def _assemble(eng: _Engine, readouts: list[Readout], chosen: list[int], RF: torch.Tensor, R0: torch.Tensor,
              seconds: float, node_threshold: float, edge_threshold: float) -> AttributionGraph:
    """The square adjacency over the chosen features (sorted), errors, tokens and targets, with values and biases."""
    n_f, T, L = len(eng.feats), eng.T, eng.L
    order = sorted(range(len(chosen)), key=lambda k: chosen[k])
    sel = torch.tensor([chosen[k] for k in order], dtype=torch.long)
    RF = RF[order] if len(order) else RF
    keep_cols = torch.cat([sel, torch.arange(n_f, eng.n_cols)])
    dropped = torch.ones(eng.n_cols, dtype=torch.bool)
    dropped[keep_cols] = False
    n_sel, n_t = len(sel), len(readouts)
    n = n_sel + L * T + T + n_t
    A = torch.zeros(n, n, dtype=R0.dtype)
    A[:n_sel, :n - n_t] = RF[:, keep_cols]
    A[n - n_t:, :n - n_t] = R0[:, keep_cols]
    rows = [("feature", int(i)) for i in sel] + [("target", j) for j in range(n_t)]
    node_rows = torch.cat([torch.arange(n_sel), torch.arange(n - n_t, n)])
    values, bias, rest = (torch.zeros(n, dtype=R0.dtype) for _ in range(3))
    values[node_rows] = eng.values(eng.stash, rows)
    bias[node_rows] = eng.values(eng.zero_pass(), rows)
    rest[node_rows] = torch.cat([RF, R0])[:, dropped].sum(1)
    tok = eng.rm.model.tokenizer
    ids = eng.run.ids.cpu()
    tokens = tok.convert_ids_to_tokens(ids.tolist()) if tok is not None else [str(i) for i in ids.tolist()]
    return AttributionGraph(
        A.detach(), eng.feats[sel], eng.acts[sel].detach(), ids, list(tokens), L, [r.label for r in readouts],
        [r.kind for r in readouts], [r.site for r in readouts], [r.position for r in readouts],
        torch.tensor([r.weight for r in readouts], dtype=torch.float64),
        torch.stack([r.vector.detach().to(R0.dtype) for r in readouts]), [r.const for r in readouts],
        values.detach(), bias.detach(), rest.detach(), n_active=n_f, node_threshold=node_threshold,
        edge_threshold=edge_threshold, model_id=getattr(eng.rm.model, "name", ""),
        meta={"seconds": round(seconds, 4), "batch_size": eng.B, "constant_positions": eng.c})


__all__ = ["active_features", "attribution_graph"]
