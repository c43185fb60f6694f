"""What the methods study measures on one model: behaviour, refusal concentration, capability cost, steerability.

Concentration is read on the model's own refusal direction ``r`` (difference of means at the last
post-instruction token, the layer chosen by the refusal job's filters) and the refusal tokens its method trained
(first tokens of its training refusals): the first-token
refusal score on the harmful val prompts drops by how much when ``r`` is projected out of one layer's writers
(attention and MLP outputs of that layer) alone, of one writer group at every layer, of one head or one MLP neuron
(mean-ablated); a seeded random unit direction orthogonal to ``r`` (and random neurons) are the controls.
"""

from __future__ import annotations

import math
from typing import Any

import torch

import steering
from interp.evals.judge import Judge
from interp.evals.logits import cross_entropy, refusal_score
from interp.forward import batches, forward, prepare
from interp.models import Model
from interp.patching.heads import head_ablation_sweep, head_means
from interp.patching.measures import refusal_score as refusal_metric
from interp.patching.neurons import neuron_ablation_effect, neuron_contrast, neuron_means
from interp.studies.kit.direction import OwnDirection, own_direction
from interp.studies.kit.prompt_sets import RefusalData
from interp.studies.kit.runs import refusal_rate
from interp.studies.kit.scoring import prompt_logits
from interp.studies.kit.writer_sites import writer_groups
from interp.tune.stats import cumulative_shares, gini
from interp.values import Runtime
from probes.directions import random_orthogonal


def behaviour(model: Model, data: RefusalData, max_new_tokens: int, batch_size: int, judge: Judge | None
              ) -> dict[str, dict[str, Any]]:
    """Refusal rate (95% Wilson interval) of greedy generations on the held-out harmful and harmless test prompts."""
    out = {}
    for split in ("harmful", "harmless"):
        out[split] = refusal_rate(model, getattr(data, split)["test"].instructions, judge, max_new_tokens,
                                  batch_size=batch_size)
    return out


def capability_cost(model: Model, prompts: list[str], answers: list[str], batch_size: int) -> float:
    """Mean next-token cross-entropy (nats per token) of the ``answers`` given their ``prompts`` (answer tokens
    only), :func:`evals.logits.cross_entropy`."""
    _, encs = prepare(model, prompts, responses=answers)
    total, count = 0.0, 0
    with torch.no_grad():
        for b in batches(model, encs, batch_size):
            lg = forward(model, b, logits="all")
            s, n = cross_entropy(lg, b.input_ids.to(lg.device), b.response_mask.to(lg.device))
            total, count = total + s, count + n
    return total / max(count, 1)


def _score(model: Model, encs: list, tokens: list[int], ivs: list, batch_size: int) -> float:
    return float(refusal_score(prompt_logits(model, encs, *ivs, batch_size=batch_size), tokens).mean())


def layer_effects(model: Model, encs: list, tokens: list[int], r: torch.Tensor, u: torch.Tensor, batch_size: int
                  ) -> dict[str, list[float]]:
    """Per layer, the refusal score drop with ``r`` projected out of that layer's attention output, MLP output,
    both, and both along the orthogonal control ``u``."""
    base = _score(model, encs, tokens, [], batch_size)
    out: dict[str, list[float]] = {"attention": [], "MLP": [], "both": [], "control": []}
    for i in range(model.n_layers):
        for key, d, sites in (("attention", r, "attn_out"), ("MLP", r, "mlp_out"), ("both", r, ("attn_out", "mlp_out")),
                              ("control", u, ("attn_out", "mlp_out"))):
            out[key].append(base - _score(model, encs, tokens, [steering.Ablate(d, layers=i, sites=sites)], batch_size))
    return out


def group_effects(model: Model, encs: list, tokens: list[int], r: torch.Tensor, u: torch.Tensor, batch_size: int
                  ) -> dict[str, dict[str, float]]:
    """Per writer group (attention, MLP, embedding, all writers: :func:`interp.studies.refusal.writers.writer_groups`),
    the refusal score drop with ``r`` (and the control ``u``) projected out of that group at every layer."""
    groups, _ = writer_groups(model)
    base = _score(model, encs, tokens, [], batch_size)
    return {name: {"effect": base - _score(model, encs, tokens, make(r), batch_size),
                   "control": base - _score(model, encs, tokens, make(u), batch_size)}
            for name, (_, make) in groups.items()}


def concentration_index(per_layer: list[float], top: int) -> dict[str, float]:
    """Share of the total absolute per-layer effect held by the ``top`` layers, and the Gini index of the absolute
    per-layer effects (:mod:`tune.stats`): absolute, since ablating ``r`` from one layer may raise the score too."""
    x = torch.tensor(per_layer, dtype=torch.float64).abs()
    shares = cumulative_shares(x)
    return {f"top{top}_share": shares[min(top, len(shares)) - 1], "gini": gini(x)}


def holders(model: Model, harmful: list[str], harmless: list[str], tokens: list[int], layers: list[int],
            n_neurons: int, seed: int, batch_size: int) -> dict[str, Any]:
    """Heads of ``layers`` and the ``n_neurons`` MLP neurons most contrasting harmful vs harmless, each mean-ablated
    alone (means over both prompt sets): the refusal score drop (``patching.heads`` / ``patching.neurons``)."""
    metric = refusal_metric(tokens)
    both = harmful + harmless
    sweep = head_ablation_sweep(model, harmful, metric, mode="mean", means=head_means(model, both, layers),
                                layers=layers, batch_size=batch_size, progress=False)
    drop = sweep.baseline - sweep.values
    heads = sorted(((int(sweep.rows[i]), j, float(drop[i, j])) for i in range(drop.shape[0])
                    for j in range(drop.shape[1])), key=lambda t: -t[2])
    out: dict[str, Any] = {"heads": heads, "neurons": [], "neurons_joint": math.nan, "neuron_control": math.nan}
    if model.spec.mlp_proj is not None and model.d_mlp:
        chosen = [(la, i) for la, i, _ in neuron_contrast(model, harmful, harmless, batch_size=batch_size).top(n_neurons)]
        eff = neuron_ablation_effect(model, harmful, metric, chosen, mode="mean", means=neuron_means(model, both),
                                     n_control=n_neurons, runtime=Runtime(batch_size=batch_size, seed=seed, progress=False))
        out["neurons"] = sorted(((la, i, -float(d)) for (la, i), d in zip(eff.neurons, eff.delta)), key=lambda t: -t[2])
        out["neurons_joint"] = eff.baseline - eff.joint
        out["neuron_control"] = float(-eff.control_delta.mean()) if eff.control_delta is not None else math.nan
    return out


def steerability(model: Model, data: RefusalData, d: OwnDirection, strengths: tuple[float, ...], max_new_tokens: int,
                 batch_size: int, seed: int, judge: Judge | None) -> list[dict[str, Any]]:
    """Refusal rate of greedy generations: harmless test prompts with ``alpha * raw`` added at resid_pre of the
    direction's layer, harmful test prompts with it subtracted, and with ``r`` ablated from every writer; each
    beside the same edit along a seeded random direction of the same norm (orthogonal unit for the ablation)."""
    rows: list[dict[str, Any]] = []

    def add(split: str, edit: str, alpha: float, direction: str, ivs: list) -> None:
        r = refusal_rate(model, getattr(data, split)["test"].instructions, judge, max_new_tokens, ivs, batch_size)
        rows.append({"split": split, "edit": edit, "alpha": alpha, "direction": direction, **r.columns()})

    for split, edit, sign in (("harmless", "addition", 1.0), ("harmful", "subtraction", -1.0)):
        for a in strengths:
            iv = steering.AddVector(d.raw, layers=d.layer, alpha=sign * a, sites="resid_pre")
            add(split, edit, a, "refusal direction", [iv])
            add(split, edit, a, "random direction", [iv.random_like(model, seed=seed)])
    u = random_orthogonal(d.unit[None], 1, seed=seed)[0].vectors[0]
    add("harmful", "ablation", 1.0, "refusal direction", [steering.DirectionalAblation(d.unit)])
    add("harmful", "ablation", 1.0, "random direction", [steering.DirectionalAblation(u)])
    return rows


__all__ = ["OwnDirection", "behaviour", "capability_cost", "concentration_index", "group_effects", "holders",
           "layer_effects", "own_direction", "steerability"]
