"""Which transcoder features make a model refuse? Attribution graphs of refused harmful prompts with the refusal
direction as target, the features they find checked by ablation against random features.

1. one graph per prompt (``patching.attribution_graph``), target: the projection of the residual at ``resid_pre``
   of ``layer``, last prompt token, on the unit refusal direction;
2. features ranked by their influence on that target summed over the prompts (the paper's measure: a share of the
   target through every path, whatever its sign), with how many prompts they appear in, their summed direct edge to
   the target and their decoder's cosine with the direction; the features chosen for the test are the most
   influential of those whose direct effect pushes the projection up (``promoting``: ablating one that pushes it
   down would add refusal);
3. the chosen ``n_features`` ablated at every position in the real model (``sae.edits.TranscoderAblation``, error
   terms kept, the attention sink left alone) on held-out harmful prompts, against as many random features of the
   same layers drawn among those active in the graphs: refusal rates with 95% Wilson intervals, and Fisher's exact
   test of top against the pooled random draws;
4. optionally, the overlap with SAE model-diff latents (``interp.studies.finetune.diffing``): for each top feature the
   largest |cosine| between its decoder vector and those latents' decoder vectors.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.evals.controls import matched_random
from interp.evals.judge import Judge
from interp.evals.rates import fisher_greater, rate_cells
from interp.models import Model
from interp.patching import GraphConfig, ReplacementModel, attribution_graph
from interp.patching.graph_result import AttributionGraph
from interp.patching.graph_targets import Projection
from interp.studies.kit.moved import moved
from interp.studies.kit.runs import refusal_rate
from interp.values import Runtime, moved_keywords
from sae.edits import TranscoderAblation
from sae.model import SAE

if TYPE_CHECKING:
    import pandas as pd

Feature = tuple[int, int]


@dataclass
class RefusalCircuit(Result):
    """``features``: one row per ranked feature (``layer``, ``feature``, ``influence`` summed over prompts,
    ``prompts`` it is a node in, ``cos_direction``, ``direct`` (summed direct edge to the target), ``chosen`` (one
    of the features ablated) and, when diff latents were given, ``cos_diff``); ``rates``: one row per condition; ``test``: Fisher's exact p of the top
    features' refusal exceeding the random draws' (one-sided: random refuses more); ``graphs``: the graphs."""

    features: list[dict[str, Any]]
    rates: list[dict[str, Any]]
    test: dict[str, Any]
    graphs: list[AttributionGraph]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def top(self) -> list[Feature]:
        return [(r["layer"], r["feature"]) for r in self.features if r["chosen"]]

    def summary(self) -> dict[str, Any]:
        """Headline numbers: refusal (rate, k, n, 95% interval) with nothing, the top features and random
        features ablated, Fisher's p, the top features and the number of prompts graphed."""
        return {"rates": rate_cells(self.rates), **self.test, "top": [f"L{la}f{f}" for la, f in self.top],
                "n_ranked": len(self.features), "n_graphs": len(self.graphs)}

    def to_frame(self, which: str = "features") -> pd.DataFrame:
        """``which='features'`` (the ranking) or ``'rates'`` (the ablation test)."""
        import pandas as pd

        if which not in ("features", "rates"):
            raise ValueError(f"which must be 'features' or 'rates', got {which!r}")
        return pd.DataFrame(self.features if which == "features" else self.rates)

    def plot(self, title: str | None = None) -> Any:
        """Refusal with the top features ablated, with random features ablated, and with nothing ablated."""
        from interp.viz.refusal import refusal_rates

        names = [r["condition"] for r in self.rates]
        fig = refusal_rates(dict(zip(names, (r["rate"] for r in self.rates))),
                            dict(zip(names, (r["ci95"] for r in self.rates))))
        return fig.update_layout(title=title or "Refusal on held-out harmful prompts, transcoder features ablated")

    def page(self, i: int = 0, contexts: dict[tuple[int, int], list[str]] | None = None) -> str:
        """The ``i``-th prompt's graph as a self-contained page, the top features grouped as one supernode."""
        g = self.graphs[i]
        keys = {(int(la), int(f)) for la, f in self.top}
        members = [tuple(x) for x in g.features.tolist() if (x[0], x[2]) in keys]
        return g.page(contexts=contexts, supernodes={"top refusal features": members} if members else None)


def _rank(graphs: list[AttributionGraph], direction: torch.Tensor, tcs: dict[int, Any],
          keep: list[set[int]] | None = None) -> list[dict[str, Any]]:
    """Features summed over the graphs' nodes (at the positions ``keep[i]`` of graph ``i`` only, when given)."""
    agg: dict[Feature, dict[str, Any]] = {}
    for gi, g in enumerate(graphs):
        infl = g.node_influence
        direct = g.adjacency[g.target_node(0), : g.n_features]
        for i, (la, pos, f) in enumerate(g.features.tolist()):
            if keep is not None and pos not in keep[gi]:
                continue
            row = agg.setdefault((la, f), {"layer": la, "feature": f, "influence": 0.0, "direct": 0.0, "prompts": set()})
            row["influence"] += float(infl[i])
            row["direct"] += float(direct[i])
            row["prompts"].add(id(g))
    r = direction.float() / direction.float().norm()
    rows = sorted(agg.values(), key=lambda x: -x["influence"])
    for row in rows:
        w = tcs[row["layer"]].W_dec[row["feature"]].detach().float()
        row["cos_direction"] = float(w @ r.to(w.device) / w.norm().clamp_min(1e-12))
        row["prompts"] = len(row["prompts"])
    return rows


def _post_positions(rm: ReplacementModel, prompts: list[str], max_positions: int) -> list[set[int]]:
    """Each prompt's post-instruction token positions, as its graph numbers them."""
    return [set(rm.batch(p, max_positions).post_mask[0].nonzero().flatten().tolist()) for p in prompts]


def _random_features(top: list[Feature], pool: list[Feature], rng: random.Random) -> list[Feature]:
    """For each top feature, one drawn among the pool's features of the same layer (none of the top ones)."""
    try:
        return matched_random(top, lambda f: [p for p in pool if p[0] == f[0]], rng, what="feature")
    except ValueError as e:
        raise ValueError(f"{e}; no other active feature at that layer: graph more prompts or raise "
                         f"max_feature_nodes") from None


def _cos_diff(rows: list[dict[str, Any]], tcs: dict[int, Any], sae: SAE, latents: list[int]) -> None:
    d = sae.W_dec[latents].detach().float()
    d = d / d.norm(dim=1, keepdim=True).clamp_min(1e-12)
    for row in rows:
        w = tcs[row["layer"]].W_dec[row["feature"]].detach().float()
        row["cos_diff"] = float((d.to(w.device) @ (w / w.norm().clamp_min(1e-12))).abs().max())


@dataclass(frozen=True)
class CircuitConfig:
    """The study's knobs: the top ``n_features`` promoting features against ``n_random`` layer-matched random draws;
    the graphs' ``max_feature_nodes`` and ``max_positions``; ``max_new_tokens`` of the judged generations;
    ``rank_by``: the most influential features (``"influence"``, the paper's measure) or those with the largest
    summed direct effect on the target (``"direct"``); ``positions``: the feature nodes ranked and the random
    controls drawn from, at every position (``"all"``) or the post-instruction tokens only (the chosen features are
    ablated at every position either way); ``diff``: ``(sae, latents)`` to compare with; ``sinks``: the ablation
    leaves attention sinks out (``"exclude"``, the house default) or acts on them (``"keep"``)."""

    n_features: int = 10
    n_random: int = 3
    max_feature_nodes: int = 512
    max_positions: int = 64
    max_new_tokens: int = 24
    rank_by: str = "influence"
    positions: str = "all"
    diff: tuple[SAE, list[int]] | None = None
    sinks: str = "exclude"

    def __post_init__(self) -> None:
        if self.rank_by not in ("influence", "direct"):
            raise ValueError(f"rank_by must be 'influence' or 'direct', got {self.rank_by!r}")
        if self.positions not in ("all", "post_instruction"):
            raise ValueError(f"positions must be 'all' or 'post_instruction' (the feature nodes ranked), got "
                             f"{self.positions!r}")
        if self.sinks not in ("exclude", "keep"):
            raise ValueError(f"sinks must be 'exclude' (leave attention sinks out of the ablation) or 'keep', "
                             f"got {self.sinks!r}")
        if min(self.n_features, self.max_feature_nodes, self.max_positions, self.max_new_tokens) < 1 \
                or self.n_random < 0:
            raise ValueError("n_features, max_feature_nodes, max_positions and max_new_tokens must be >= 1 and "
                             "n_random >= 0")


_KNOBS = ("n_features", "n_random", "max_feature_nodes", "max_positions", "max_new_tokens", "rank_by", "positions",
          "diff")


@moved_keywords({**moved(runtime=("seed", "batch_size"), config="CircuitConfig", knobs=_KNOBS),
                 "skip_sink": 'config=CircuitConfig(sinks="exclude" | "keep")'})
def refusal_circuit(rm: ReplacementModel, prompts: list[str], direction: torch.Tensor, layer: int,
                    eval_harmful: list[str], judge: Judge | None = None, config: CircuitConfig | None = None,
                    runtime: Runtime | None = None) -> RefusalCircuit:
    """Graphs of ``prompts`` (refused harmful ones) with the refusal ``direction [d]`` at ``resid_pre.{layer}``,
    last token, as target; the top ``config.n_features`` by summed influence ablated on ``eval_harmful`` against
    ``config.n_random`` layer-matched random draws (module docstring; the other knobs: :class:`CircuitConfig`).
    ``runtime``: the graphs' ``batch_size`` and the draws' ``seed`` (default: 32, 0)."""
    c = config if config is not None else CircuitConfig()
    rt = runtime if runtime is not None else Runtime(batch_size=32)
    n_features, n_random, max_feature_nodes, max_positions = c.n_features, c.n_random, c.max_feature_nodes, \
        c.max_positions
    max_new_tokens, rank_by, positions, diff, seed, batch_size = c.max_new_tokens, c.rank_by, c.positions, c.diff, \
        rt.seed, rt.batch_size
    model: Model = rm.model
    if direction.shape[-1] != model.d_model:
        raise ValueError(f"the direction has width {direction.shape[-1]} but {model.name} has d_model={model.d_model}")
    if not 0 < layer <= model.n_layers:
        raise ValueError(f"layer {layer}: the target reads resid_pre of a layer 1..{model.n_layers} (features of "
                         f"earlier layers write into it)")
    if not prompts or not eval_harmful:
        raise ValueError("give at least one prompt to graph and one held-out harmful prompt to evaluate on")
    r = direction.detach().float() / direction.float().norm()
    site = f"blocks.{layer}.hook_resid_pre" if layer < model.n_layers else "ln_final.hook_out"
    target = Projection(r, site, -1, label=f"refusal direction @ {site}")
    graphs = [attribution_graph(rm, p, target, runtime=Runtime(batch_size, progress=False), config=GraphConfig(
        max_feature_nodes=max_feature_nodes, max_positions=max_positions)) for p in prompts]
    keep = None if positions == "all" else _post_positions(rm, prompts, max_positions)
    rows = [x for x in _rank(graphs, r, rm.transcoders, keep) if x["layer"] < layer]  # later ones cannot write there
    if diff is not None:
        _cos_diff(rows, rm.transcoders, *diff)
    promoting = [x for x in rows if x["direct"] > 0]
    if rank_by == "direct":
        promoting.sort(key=lambda x: -x["direct"])
    if len(promoting) < n_features:
        raise ValueError(f"the graphs hold {len(promoting)} features that push the target up, fewer than "
                         f"n_features={n_features}; graph more prompts or raise max_feature_nodes")
    top = [(x["layer"], x["feature"]) for x in promoting[:n_features]]
    for x in rows:
        x["chosen"] = (x["layer"], x["feature"]) in top
    pool = [(x["layer"], x["feature"]) for x in rows]
    rng = random.Random(seed)
    conds = [("no ablation", []), (f"top {n_features} features ablated", top)]
    conds += [(f"random features ablated (draw {i})", _random_features(top, pool, rng)) for i in range(n_random)]
    rates = []
    for name, feats in conds:
        edits = [TranscoderAblation(rm.transcoders, feats, sinks=c.sinks)] if feats else []
        rates.append({"condition": name, "features": [f"L{la}f{f}" for la, f in feats],
                      **refusal_rate(model, eval_harmful, judge, max_new_tokens, edits)})
    k_rand = sum(x["k"] for x in rates[2:])
    n_rand = sum(x["n"] for x in rates[2:])
    test = {"fisher_p_random_refuses_more": fisher_greater(k_rand, n_rand, rates[1]["k"], rates[1]["n"])
            if n_rand else None, "top_rate": rates[1]["rate"], "random_rate": k_rand / n_rand if n_rand else None}
    return RefusalCircuit(rows, rates, test, graphs, meta={"layer": layer, "site": site, "n_features": n_features,
                                                            "n_prompts": len(prompts), "seed": seed,
                                                            "max_feature_nodes": max_feature_nodes,
                                                            "rank_by": rank_by, "positions": positions})


__all__ = ["CircuitConfig", "RefusalCircuit", "refusal_circuit"]
