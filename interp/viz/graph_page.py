"""A self-contained HTML page for an attribution graph: an SVG graph view in plain JavaScript (no server, no CDN).

Nodes are laid out by layer (rows: token embeddings at the bottom, the target at the top) and position (columns);
edges are drawn by sign (blue excites, red inhibits) and weight. The page prunes as the paper does and lets the
reader move both thresholds: nodes are kept by influence until they cover ``node`` of the total (embeddings and
targets always kept), then edges between kept nodes by score (an edge's influence when given, else |weight|)
until they cover ``edge`` of theirs; nodes left without an edge are hidden. Scores are computed once on the whole
graph, so the page's pruning equals ``patching.graph_result.AttributionGraph.prune`` up to that function's
recomputation of influence on the pruned graph. Supernodes (named groups of node ids) can be merged into one node, their edges summed. Clicking a node
shows its label, activation, influence, top-activating contexts and strongest edges.

The same pruning runs in Python (:func:`prune`), so a test can compare what the browser drew with it. The initial
controls can be set in the URL fragment: ``page.html#node=0.8&edge=0.98&group=1``.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

KINDS = ("embedding", "feature", "error", "target")


def _check(nodes: Sequence[Mapping[str, Any]], edges: Sequence[Sequence[Any]]) -> None:
    ids = [str(n["id"]) for n in nodes]
    if len(set(ids)) != len(ids):
        raise ValueError("graph_page: node ids must be unique")
    for n in nodes:
        if n.get("kind") not in KINDS:
            raise ValueError(f"graph_page: node {n.get('id')!r} has kind {n.get('kind')!r}; use one of {KINDS}")
    known = set(ids)
    for e in edges:
        if str(e[0]) not in known or str(e[1]) not in known:
            raise ValueError(f"graph_page: edge {e[0]!r} -> {e[1]!r} names a node that is not in the node list")


def cover(scores: Sequence[float], fraction: float) -> list[bool]:
    """Mask of the largest positive ``scores`` whose sum first reaches ``fraction`` of their total (ties kept)."""
    pos = sorted((x for x in scores if x > 0), reverse=True)
    total = sum(pos)
    if total <= 0:
        return [False] * len(scores)
    acc, k = 0.0, 0
    for x in pos:
        acc += x
        if acc / total >= fraction:
            break
        k += 1
    cut = pos[min(k, len(pos) - 1)]
    return [x >= cut and x > 0 for x in scores]


def prune(nodes: Sequence[Mapping[str, Any]], edges: Sequence[Sequence[Any]], node_threshold: float = 0.8,
          edge_threshold: float = 0.98) -> tuple[set[str], list[tuple[str, str, float]]]:
    """The page's pruning (mirrored in its JavaScript): kept node ids and kept edges ``(source, target, weight)``.

    Nodes: embeddings and targets always, the others while their influence covers ``node_threshold``; edges
    between kept nodes while their score (the 4th item of an edge, default ``|weight|``) covers
    ``edge_threshold``; nodes left without a kept edge are hidden (targets stay)."""
    free = [n for n in nodes if n["kind"] not in ("embedding", "target")]
    mask = cover([abs(float(n["influence"])) for n in free], node_threshold)
    keep = {str(n["id"]) for n, m in zip(free, mask) if m} | {str(n["id"]) for n in nodes
                                                               if n["kind"] in ("embedding", "target")}
    inner = [(str(e[0]), str(e[1]), float(e[2]), abs(float(e[3] if len(e) > 3 else e[2]))) for e in edges
             if str(e[0]) in keep and str(e[1]) in keep]
    kept = [(s, t, w) for (s, t, w, _), m in zip(inner, cover([e[3] for e in inner], edge_threshold)) if m]
    touched = {e[0] for e in kept} | {e[1] for e in kept}
    kind = {str(n["id"]): n["kind"] for n in nodes}
    shown = {i for i in keep if i in touched or kind[i] == "target"}
    return shown, kept


def grouped(shown: set[str], kept: list[tuple[str, str, float]], supernodes: Mapping[str, Sequence[str]]
            ) -> tuple[set[str], list[tuple[str, str, float]]]:
    """Merge each supernode's shown members into one node ``group:NAME``; edges summed, self-loops dropped."""
    where = {str(m): f"group:{name}" for name, members in supernodes.items() for m in members}
    nodes = {where.get(i, i) for i in shown}
    sums: dict[tuple[str, str], float] = {}
    for s, t, w in kept:
        a, b = where.get(s, s), where.get(t, t)
        if a != b:
            sums[(a, b)] = sums.get((a, b), 0.0) + w
    return nodes, [(a, b, w) for (a, b), w in sums.items()]


def graph_page(nodes: Sequence[Mapping[str, Any]], edges: Sequence[Sequence[Any]], title: str,
               tokens: Sequence[str] = (), supernodes: Mapping[str, Sequence[str]] | None = None,
               node_threshold: float = 0.8, edge_threshold: float = 0.98, notes: str = "") -> str:
    """The page as one HTML string. ``nodes``: dicts with ``id``, ``kind`` (embedding / feature / error / target),
    ``layer`` (-1 for embeddings; targets above the last layer), ``position``, ``influence``, and optionally
    ``label``, ``activation``, ``feature`` and ``contexts`` (a list of strings). ``edges``: ``(source, target,
    weight)`` direct effects, or ``(source, target, weight, score)`` with the score edges are pruned by (default
    ``|weight|``; an attribution graph passes its edge influence). ``tokens``: the prompt's tokens, one per position (column labels)."""
    _check(nodes, edges)
    for name, v in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if not 0.0 < v <= 1.0:
            raise ValueError(f"{name} must be in (0, 1], got {v}")
    clean = [{"id": str(n["id"]), "kind": n["kind"], "layer": int(n["layer"]), "position": int(n["position"]),
              "influence": _num(n["influence"]), "activation": _num(n.get("activation", 0.0)),
              "label": str(n.get("label", n["id"])), "feature": n.get("feature"),
              "contexts": [str(c) for c in n.get("contexts", [])][:10]} for n in nodes]
    data = {"nodes": clean, "edges": [[str(e[0]), str(e[1]), _num(e[2])] + ([_num(e[3])] if len(e) > 3 else [])
                                      for e in edges], "tokens": list(map(str, tokens)),
            "supernodes": {str(k): [str(m) for m in v] for k, v in (supernodes or {}).items()},
            "node": node_threshold, "edge": edge_threshold}
    blob = json.dumps(data).replace("</", "<\\/")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
            f"{f'<p class=note>{html.escape(notes)}</p>' if notes else ''}{_CONTROLS}"
            f"<div id='wrap'><svg id='graph' xmlns='http://www.w3.org/2000/svg'></svg><div id='panel'>"
            f"Click a node.</div></div><script type='application/json' id='graph-data'>{blob}</script>"
            f"<script>{_SCRIPT}</script></body></html>")


def _num(v: Any) -> float:
    f = float(v)
    if not math.isfinite(f):
        raise ValueError(f"graph_page: a weight, influence or activation is not finite ({f})")
    return f


_STYLE = ("body{font-family:system-ui,sans-serif;margin:1em 2em;color:#222}#wrap{display:flex;gap:1em}"
          "#graph{border:1px solid #ddd;background:#fff}#panel{min-width:320px;max-width:420px;font-size:13px}"
          ".note{background:#fff6d6;padding:6px}label{margin-right:1.5em}text{font-size:10px}"
          "#panel li{margin-bottom:3px}.ctx{font-family:monospace;background:#f4f4f4}")
_CONTROLS = ("<div id='controls'><label>node threshold (influence kept) <input id='node' type='range' min='0.05' "
             "max='1' step='0.01'><span id='node-v'></span></label><label>edge threshold (weight kept) <input "
             "id='edge' type='range' min='0.05' max='1' step='0.01'><span id='edge-v'></span></label><label><input "
             "id='group' type='checkbox'> merge supernodes</label><span id='counts'></span></div>")
_SCRIPT = r"""
(function(){
const D = JSON.parse(document.getElementById('graph-data').textContent);
const byId = {}; D.nodes.forEach(n => byId[n.id] = n);
const hash = new URLSearchParams(location.hash.slice(1));
const ctl = {node: document.getElementById('node'), edge: document.getElementById('edge'),
             group: document.getElementById('group')};
ctl.node.value = hash.get('node') || D.node; ctl.edge.value = hash.get('edge') || D.edge;
ctl.group.checked = hash.get('group') === '1';
function cover(scores, fraction){
  const pos = scores.filter(x => x > 0).sort((a, b) => b - a); const total = pos.reduce((a, b) => a + b, 0);
  if (total <= 0) return scores.map(() => false);
  let acc = 0, k = 0;
  for (const x of pos){ acc += x; if (acc / total >= fraction) break; k++; }
  const cut = pos[Math.min(k, pos.length - 1)];
  return scores.map(x => x >= cut && x > 0);
}
function prune(nt, et){
  const always = n => n.kind === 'embedding' || n.kind === 'target';
  const free = D.nodes.filter(n => !always(n));
  const m = cover(free.map(n => Math.abs(n.influence)), nt);
  const keep = new Set(D.nodes.filter(always).map(n => n.id));
  free.forEach((n, i) => { if (m[i]) keep.add(n.id); });
  const inner = D.edges.filter(e => keep.has(e[0]) && keep.has(e[1]));
  const em = cover(inner.map(e => Math.abs(e.length > 3 ? e[3] : e[2])), et);
  const kept = inner.filter((e, i) => em[i]).map(e => [e[0], e[1], e[2]]);
  const touched = new Set(); kept.forEach(e => { touched.add(e[0]); touched.add(e[1]); });
  const shown = [...keep].filter(i => touched.has(i) || byId[i].kind === 'target');
  return [shown, kept];
}
function group(shown, kept){
  const where = {};
  Object.entries(D.supernodes).forEach(([g, ms]) => ms.forEach(m => where[m] = 'group:' + g));
  const nodes = {};
  shown.forEach(i => { const k = where[i] || i; (nodes[k] = nodes[k] || []).push(byId[i]); });
  const sums = {};
  kept.forEach(([s, t, w]) => { const a = where[s] || s, b = where[t] || t; if (a === b) return;
    const k = a + '\u0000' + b; sums[k] = (sums[k] || 0) + w; });
  return [nodes, Object.entries(sums).map(([k, w]) => k.split('\u0000').concat([w]))];
}
const svg = document.getElementById('graph'); const NS = 'http://www.w3.org/2000/svg';
function el(tag, attrs, parent){ const e = document.createElementNS(NS, tag);
  Object.entries(attrs).forEach(([k, v]) => e.setAttribute(k, v)); parent.appendChild(e); return e; }
function layout(nodes){
  const layers = D.nodes.map(n => n.layer); const lo = Math.min(...layers), hi = Math.max(...layers);
  const npos = Math.max(D.tokens.length, 1 + Math.max(...D.nodes.map(n => n.position)));
  const colW = 110, rowH = 60, W = 80 + npos * colW, H = 60 + (hi - lo + 1) * rowH;
  svg.setAttribute('width', W); svg.setAttribute('height', H);
  const cells = {}, xy = {};
  Object.entries(nodes).forEach(([k, ms]) => {
    const L = ms.reduce((s, n) => s + n.layer, 0) / ms.length, P = ms.reduce((s, n) => s + n.position, 0) / ms.length;
    const c = Math.round(L) + ':' + Math.round(P); const slot = cells[c] = (cells[c] || 0) + 1;
    xy[k] = [60 + P * colW + ((slot - 1) % 6) * 14, H - 40 - (L - lo) * rowH - Math.floor((slot - 1) / 6) * 12]; });
  D.tokens.forEach((t, p) => { const e = el('text', {x: 60 + p * colW, y: H - 8}, svg); e.textContent = t; });
  for (let L = lo; L <= hi; L++) { const e = el('text', {x: 2, y: H - 36 - (L - lo) * rowH}, svg);
    e.textContent = L < 0 ? 'emb' : L === hi && D.nodes.some(n => n.kind === 'target' && n.layer === hi) ? 'target' : 'L' + L; }
  return xy;
}
function draw(){
  const nt = +ctl.node.value, et = +ctl.edge.value;
  document.getElementById('node-v').textContent = nt.toFixed(2);
  document.getElementById('edge-v').textContent = et.toFixed(2);
  let [shown, kept] = prune(nt, et); let nodes, edges;
  if (ctl.group.checked) { [nodes, edges] = group(shown, kept); }
  else { nodes = {}; shown.forEach(i => nodes[i] = [byId[i]]); edges = kept; }
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const xy = layout(nodes); const wmax = Math.max(1e-12, ...edges.map(e => Math.abs(e[2])));
  edges.forEach(([s, t, w]) => el('line', {x1: xy[s][0], y1: xy[s][1], x2: xy[t][0], y2: xy[t][1], class: 'edge',
    stroke: w > 0 ? '#1f77b4' : '#d62728', 'stroke-opacity': 0.25 + 0.6 * Math.abs(w) / wmax,
    'stroke-width': 0.5 + 3 * Math.abs(w) / wmax}, svg));
  const colour = {feature: '#ff7f0e', error: '#7f7f7f', embedding: '#2ca02c', target: '#9467bd'};
  Object.entries(nodes).forEach(([k, ms]) => {
    const n = ms[0], isGroup = k.startsWith('group:');
    const shape = isGroup ? el('rect', {x: xy[k][0] - 8, y: xy[k][1] - 8, width: 16, height: 16, rx: 4}, svg)
      : n.kind === 'error' ? el('rect', {x: xy[k][0] - 5, y: xy[k][1] - 5, width: 10, height: 10}, svg)
      : el('circle', {cx: xy[k][0], cy: xy[k][1], r: n.kind === 'feature' ? 5 : 7}, svg);
    shape.setAttribute('class', 'node'); shape.setAttribute('data-id', k);
    shape.setAttribute('fill', isGroup ? '#17becf' : colour[n.kind]);
    el('title', {}, shape).textContent = isGroup ? k : n.label;
    shape.addEventListener('click', () => show(k, ms, edges)); });
  const c = document.getElementById('counts');
  c.dataset.nodes = Object.keys(nodes).length; c.dataset.edges = edges.length;
  c.textContent = Object.keys(nodes).length + ' nodes, ' + edges.length + ' edges shown';
  if (hash.get('select')) { const ms = nodes[hash.get('select')]; if (ms) show(hash.get('select'), ms, edges); }
}
function esc(s){ const d = document.createElement('div'); d.textContent = s; return d.innerHTML; }
function show(k, ms, edges){
  const p = document.getElementById('panel'); const n = ms[0];
  const ins = edges.filter(e => e[1] === k).sort((a, b) => Math.abs(b[2]) - Math.abs(a[2])).slice(0, 8);
  const outs = edges.filter(e => e[0] === k).sort((a, b) => Math.abs(b[2]) - Math.abs(a[2])).slice(0, 8);
  const li = (es, j) => es.map(e => '<li>' + esc(e[j]) + ': ' + e[2].toPrecision(3) + '</li>').join('');
  p.innerHTML = '<h3 id="sel">' + esc(k.startsWith('group:') ? k : n.label) + '</h3>' +
    (k.startsWith('group:') ? '<p>' + ms.length + ' nodes: ' + ms.map(m => esc(m.label)).join(', ') + '</p>' :
     '<p>' + esc(n.kind) + ', layer ' + n.layer + ', position ' + n.position +
     (n.feature !== null && n.feature !== undefined ? ', feature ' + n.feature : '') +
     '<br>activation ' + n.activation.toPrecision(4) + ', influence ' + n.influence.toPrecision(4) + '</p>' +
     (n.contexts.length ? '<b>top contexts</b><ul>' + n.contexts.map(c => '<li class="ctx">' + esc(c) + '</li>').join('') + '</ul>' : '')) +
    '<b>strongest inputs</b><ul>' + li(ins, 0) + '</ul><b>strongest outputs</b><ul>' + li(outs, 1) + '</ul>';
}
[ctl.node, ctl.edge, ctl.group].forEach(c => c.addEventListener('input', draw));
draw();
})();
"""


__all__ = ["cover", "graph_page", "grouped", "prune"]
