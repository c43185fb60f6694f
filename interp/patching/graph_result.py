"""`AttributionGraph`: the adjacency of direct effects among a prompt's nodes, its pruning and its tables.

Nodes, in this order: selected features ``(layer, position, feature)``, error nodes (layer-major, one per layer
and position), token-embedding nodes (one per position), target nodes. ``adjacency[t, s]`` is the direct effect
of source ``s`` on target ``t`` (rows are targets, columns sources, as in circuit-tracer).

Influence (as in Ameisen et al. 2025): with ``B`` the row-normalised ``|adjacency|`` (each row divided by its
sum of absolute values) and ``w`` the targets' weights, a node's influence is ``(w @ (B + B^2 + ...))``, i.e.
``w @ ((I - B)^-1 - I)``, its share in the targets through every path. Pruning keeps the nodes that cover
``node_threshold`` of the total influence (tokens and targets always), then the edges whose scores
(``B[t, s] * (influence[t] + w[t])``, on the pruned graph) cover ``edge_threshold``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Provenance, Result, read_object, register_kind, save_object

if TYPE_CHECKING:
    import pandas as pd

KIND = "patching.AttributionGraph"


def normalized_abs(A: torch.Tensor) -> torch.Tensor:
    """Rows of ``|A|`` divided by their sums (rows summing to 0 stay 0)."""
    a = A.abs()
    return a / a.sum(1, keepdim=True).clamp_min(1e-30)


def influence(A: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``w @ (B + B^2 + ...)`` for ``B = normalized_abs(A)``; ``A`` is acyclic, so the series ends."""
    B = normalized_abs(A.double())
    cur = weights.double() @ B
    total = cur.clone()
    for _ in range(A.shape[0]):
        if not bool(cur.any()):
            break
        cur = cur @ B
        total += cur
    return total


def cover(scores: torch.Tensor, fraction: float) -> torch.Tensor:
    """Mask of the largest ``scores`` whose sum first reaches ``fraction`` of the total (ties kept)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"a pruning threshold is a fraction in [0, 1], got {fraction}")
    s = scores.flatten()
    s = s[s > 0]
    total = float(s.sum())
    if total <= 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    ordered = s.sort(descending=True).values
    k = int((ordered.cumsum(0) / total < fraction).sum())
    cut = ordered[min(k, len(ordered) - 1)]
    return (scores >= cut) & (scores > 0)


@dataclass
class AttributionGraph(Result):
    """Direct effects among the nodes of one prompt (see the module docstring for the node order).

    ``features [n_f, 3]`` (layer, position, feature id), ``activations [n_f]``. Per node row: ``values`` (a
    feature's pre-activation, a target's value, in the linearised model), ``bias`` (the same with every node set
    to zero: the constant terms, transcoder ``b_dec`` and the model's biases) and ``rest`` (contributions of
    active features left out by ``max_feature_nodes``). For every feature and target row, exactly:
    ``adjacency[row].sum() == values[row] - bias[row] - rest[row]`` (:meth:`completeness` is the largest gap).
    """

    adjacency: torch.Tensor
    features: torch.Tensor
    activations: torch.Tensor
    input_ids: torch.Tensor
    tokens: list[str]
    n_layers: int
    target_labels: list[str]
    target_kinds: list[str]
    target_sites: list[str]
    target_positions: list[int]
    target_weights: torch.Tensor
    target_vectors: torch.Tensor
    target_consts: list[float]
    values: torch.Tensor
    bias: torch.Tensor
    rest: torch.Tensor
    n_active: int = 0
    node_threshold: float = 0.8
    edge_threshold: float = 0.98
    model_id: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.n_features + self.n_layers * self.n_positions + self.n_positions + self.n_targets
        if tuple(self.adjacency.shape) != (n, n):
            raise ValueError(f"adjacency of shape {tuple(self.adjacency.shape)} does not match {n} nodes")
        self.prune(self.node_threshold, self.edge_threshold)

    # --- sizes and node layout ---------------------------------------------------------------
    @property
    def n_features(self) -> int:
        return int(self.features.shape[0])

    @property
    def n_positions(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def n_targets(self) -> int:
        return len(self.target_labels)

    @property
    def n_nodes(self) -> int:
        return int(self.adjacency.shape[0])

    @property
    def error_offset(self) -> int:
        return self.n_features

    @property
    def token_offset(self) -> int:
        return self.n_features + self.n_layers * self.n_positions

    @property
    def target_offset(self) -> int:
        return self.token_offset + self.n_positions

    def feature_node(self, layer: int, position: int, feature: int) -> int:
        """The node index of a feature (a clear error when it is not a node of this graph)."""
        hit = ((self.features[:, 0] == layer) & (self.features[:, 1] == position) &
               (self.features[:, 2] == feature)).nonzero()
        if hit.numel() == 0:
            raise KeyError(f"feature {feature} at layer {layer}, position {position} is not a node of this graph "
                           f"(inactive there, or left out by max_feature_nodes)")
        return int(hit[0, 0])

    def error_node(self, layer: int, position: int) -> int:
        return self.error_offset + layer * self.n_positions + position

    def token_node(self, position: int) -> int:
        return self.token_offset + position

    def target_node(self, j: int = 0) -> int:
        return self.target_offset + j

    def node_weights(self) -> torch.Tensor:
        w = torch.zeros(self.n_nodes, dtype=torch.float64)
        w[self.target_offset:] = self.target_weights.double()
        return w

    # --- checks, influence, pruning ----------------------------------------------------------
    def completeness(self) -> float:
        """Largest ``|adjacency[row].sum() - (values - bias - rest)[row]|`` over feature and target rows."""
        rows = torch.cat([torch.arange(self.n_features), torch.arange(self.target_offset, self.n_nodes)])
        gap = self.adjacency[rows].double().sum(1) - (self.values - self.bias - self.rest)[rows].double()
        return float(gap.abs().max()) if gap.numel() else 0.0

    def influence(self) -> torch.Tensor:
        """Each node's influence on the targets ``[n_nodes]`` (module docstring)."""
        return influence(self.adjacency, self.node_weights())

    def prune(self, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> AttributionGraph:
        """Set ``node_mask [n]`` and ``edge_mask [n, n]`` for the thresholds (fractions of influence); returns self."""
        w = self.node_weights()
        infl = self.influence()
        keep = cover(infl, node_threshold)
        keep[self.token_offset:] = True
        A = self.adjacency.double() * keep[:, None] * keep[None, :]
        B = normalized_abs(A)
        scores = B * (influence(A, w) + w)[:, None]
        edges = cover(scores, edge_threshold)
        for _ in range(self.n_layers + 2):  # drop nodes left without an edge out (features, errors) or in (features)
            before = keep.clone()
            keep[:self.token_offset] &= edges[:, :self.token_offset].any(0)
            keep[:self.n_features] &= edges[:self.n_features].any(1)
            edges &= keep[:, None] & keep[None, :]
            if torch.equal(keep, before):
                break
        self.node_threshold, self.edge_threshold = node_threshold, edge_threshold
        self.node_influence, self.node_mask, self.edge_mask = infl, keep, edges
        return self

    # --- tables, figure, files ---------------------------------------------------------------
    def node_rows(self) -> list[dict[str, Any]]:
        """One dict per node: ``node, kind, layer, position, feature, activation, label, influence, kept``."""
        rows: list[dict[str, Any]] = []
        for i, (layer, pos, f) in enumerate(self.features.tolist()):
            rows.append({"kind": "feature", "layer": layer, "position": pos, "feature": f,
                         "activation": float(self.activations[i]), "label": f"L{layer} f{f} @{pos}"})
        for layer in range(self.n_layers):
            rows += [{"kind": "error", "layer": layer, "position": p, "label": f"L{layer} error @{p}"}
                     for p in range(self.n_positions)]
        rows += [{"kind": "token", "layer": -1, "position": p, "label": self.tokens[p]} for p in range(self.n_positions)]
        rows += [{"kind": "target", "layer": self.n_layers, "position": self.target_positions[j],
                  "label": self.target_labels[j], "weight": float(self.target_weights[j])} for j in range(self.n_targets)]
        infl = self.node_influence.tolist()
        return [{"node": i, "feature": None, "activation": None, **r, "influence": infl[i],
                 "kept": bool(self.node_mask[i])} for i, r in enumerate(rows)]

    def to_frame(self, table: str = "nodes", pruned: bool = True) -> pd.DataFrame:
        """``"nodes"``: one row per node (:meth:`node_rows`); ``"edges"``: ``source, target, weight`` per non-zero
        edge (``source_label``, ``target_label`` beside). ``pruned``: only kept nodes / edges. pandas frames."""
        import pandas as pd

        if table not in ("nodes", "edges"):
            raise ValueError(f"table must be 'nodes' or 'edges', got {table!r}")
        nodes = self.node_rows()
        if table == "nodes":
            frame = pd.DataFrame(nodes).astype({"feature": "Int64"})
            return frame[frame["kept"]].reset_index(drop=True) if pruned else frame
        mask = (self.adjacency != 0) & (self.edge_mask if pruned else True)
        t, s = mask.nonzero(as_tuple=True)
        labels = [r["label"] for r in nodes]
        return pd.DataFrame({"source": s.tolist(), "target": t.tolist(), "weight": self.adjacency[t, s].tolist(),
                             "source_label": [labels[i] for i in s.tolist()],
                             "target_label": [labels[i] for i in t.tolist()]})

    def influence_grid(self) -> torch.Tensor:
        """Influence summed by layer x position ``[n_layers + 1, T]`` (row 0 the token embeddings)."""
        grid = torch.zeros(self.n_layers + 1, self.n_positions, dtype=torch.float64)
        infl = self.node_influence
        for i, (layer, pos, _) in enumerate(self.features.tolist()):
            grid[layer + 1, pos] += infl[i]
        for layer in range(self.n_layers):
            grid[layer + 1] += infl[self.error_node(layer, 0):self.error_node(layer, 0) + self.n_positions]
        grid[0] += infl[self.token_offset:self.target_offset]
        return grid

    def plot(self, title: str | None = None) -> Any:
        """Heatmap of node influence by layer x position (features and errors; row ``emb``: the tokens)."""
        from interp.viz.patching import grid_heatmap

        cols = [f"{p}:{t}" for p, t in enumerate(self.tokens)]
        rows = ["emb"] + [str(i) for i in range(self.n_layers)]
        return grid_heatmap(self.influence_grid(), cols, rows, "position", "layer", "influence",
                            title or f"attribution graph: influence on {', '.join(self.target_labels[:3])}")

    def edge_scores(self) -> torch.Tensor:
        """``B[t, s] * (influence[t] + w[t])`` on the whole graph ``[n, n]``: what an edge carries to the targets."""
        w = self.node_weights()
        return normalized_abs(self.adjacency.double()) * (self.node_influence + w)[:, None]

    def page(self, contexts: dict[tuple[int, int], list[str]] | None = None,
             supernodes: dict[str, list[tuple[int, int, int]]] | None = None, title: str | None = None) -> str:
        """A self-contained HTML page of the graph (``viz.graph_page``) with the thresholds as controls, starting
        at this graph's. ``contexts``: ``{(layer, feature): [text, ...]}`` (e.g. from ``sae.contexts.top_contexts``
        with the layer's transcoder); ``supernodes``: ``{name: [(layer, position, feature), ...]}``."""
        from interp.viz.graph_page import graph_page

        kind = {"token": "embedding"}
        rows = self.node_rows()
        ids = [f"n{r['node']}" for r in rows]
        nodes = [{"id": ids[i], "kind": kind.get(r["kind"], r["kind"]), "layer": r["layer"], "position": r["position"],
                  "influence": r["influence"], "activation": r["activation"] or 0.0, "label": r["label"],
                  "feature": r["feature"], "contexts": (contexts or {}).get((r["layer"], r["feature"]), [])}
                 for i, r in enumerate(rows)]
        sc = self.edge_scores()
        t, src = (self.adjacency != 0).nonzero(as_tuple=True)
        edges = [(ids[a], ids[b], float(self.adjacency[b, a]), float(sc[b, a])) for b, a in zip(t.tolist(), src.tolist())]
        groups = {name: [ids[self.feature_node(*f)] for f in members] for name, members in (supernodes or {}).items()}
        return graph_page(nodes, edges, title or f"attribution graph: {', '.join(self.target_labels[:3])}",
                          tokens=self.tokens, supernodes=groups, node_threshold=self.node_threshold or 0.8,
                          edge_threshold=self.edge_threshold or 0.98,
                          notes=f"{self.n_features} feature nodes of {self.n_active} active; model {self.model_id}")

    _TENSORS = ("adjacency", "features", "activations", "input_ids", "target_weights", "target_vectors", "values",
                "bias", "rest")
    _FIELDS = ("tokens", "n_layers", "target_labels", "target_kinds", "target_sites", "target_positions",
               "target_consts", "n_active", "node_threshold", "edge_threshold", "model_id", "meta")

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Save as a bundle folder (atomic; refuses to overwrite unless ``overwrite=True``)."""
        tensors = {k: getattr(self, k).detach().cpu().contiguous() for k in self._TENSORS}
        prov = Provenance("attribution_graph", sorted(set(self.target_sites)), self.model_id)
        return save_object(path, KIND, tensors, prov, {k: getattr(self, k) for k in self._FIELDS}, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike) -> AttributionGraph:
        """Load a graph saved by :meth:`save`."""
        b = read_object(Path(path), KIND)
        return cls(**{k: b.tensors[k] for k in cls._TENSORS}, **{k: b.fields[k] for k in cls._FIELDS})

    def summary(self) -> dict[str, Any]:
        """Headline numbers: targets, feature nodes (of active, kept at the thresholds), kept edges, the error
        nodes' share of the influence on the targets, completeness, and the five most influential features
        ``[layer, position, feature, influence]``."""
        infl = self.node_influence
        total = float(infl[:self.target_offset].sum())
        top = infl[:self.n_features].argsort(descending=True)[:5].tolist()
        return {"targets": list(self.target_labels), "n_positions": self.n_positions,
                "n_feature_nodes": self.n_features, "n_active": self.n_active,
                "n_kept": int(self.node_mask[:self.n_features].sum()), "n_edges_kept": int(self.edge_mask.sum()),
                "node_threshold": self.node_threshold, "edge_threshold": self.edge_threshold,
                "error_share": float(infl[self.error_offset:self.token_offset].sum()) / total if total else None,
                "completeness": self.completeness(),
                "top_features": [[*map(int, self.features[i].tolist()), float(infl[i])] for i in top]}

    def __repr__(self) -> str:
        kept = int(self.node_mask[:self.n_features].sum())
        return (f"AttributionGraph({self.n_features} feature nodes of {self.n_active} active, {kept} kept; "
                f"{self.n_positions} positions, {self.n_layers} layers; targets {self.target_labels[:3]})")


register_kind(KIND, AttributionGraph.load)

__all__ = ["AttributionGraph", "cover", "influence", "normalized_abs"]
