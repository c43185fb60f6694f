"""Safety neurons across languages (after MLS-neurons): MLP neurons (``mlp_post``) found per language by activation
contrast (harmful vs harmless train prompts, effect size at the last prompt token) and then by downstream effect
(each candidate zero-ablated alone on that language's harmful val prompts, the drop of the first-token refusal
score), intersected across languages, and checked by ablating each language's set, and the set common to all,
on every language's harmful test prompts beside random neuron sets of the same size from the same layers.

The refusal score is the log-odds that the answer opens with a refusal token
(:func:`patching.measures.refusal_score`); its tokens are the first tokens of the English refusal openings and of
the other languages' declines (:mod:`evals.judge_languages`), so a refusal in any of them counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.evals.judge import refusal_openings
from interp.evals.judge_languages import DECLINES
from interp.forward import batch_of, last_logits
from interp.models import Model
from interp.patching.measures import call_metric, refusal_score, refusal_token_ids
from interp.patching.neurons import (
    Neuron,
    NeuronOverlap,
    ablate_neurons,
    intersect_neurons,
    neuron_ablation_effect,
    neuron_contrast,
    random_neurons,
)
from interp.studies.kit.moved import moved
from interp.studies.multilingual.data import ParallelSafety
from interp.values import Runtime, moved_keywords

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class SafetyNeurons(Result):
    """``sets[lang]``: the language's neurons; ``overlap``; ``effects[(set, lang)]``: change of the mean refusal score
    on ``lang``'s harmful test prompts when ``set`` is ablated (``set`` a language or ``common``), and
    ``random[(set, lang)]``: the same for ``n_random`` random sets of that size (list)."""

    langs: list[str]
    k: int
    n_candidates: int
    sets: dict[str, set[Neuron]]
    overlap: NeuronOverlap
    chance_pairwise: float
    baseline: dict[str, float]
    effects: dict[tuple[str, str], float]
    random: dict[tuple[str, str], list[float]]
    meta: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Headline numbers: per (set, prompt language) ablation the refusal-score change against the random
        sets' mean and whether it is below every random one; the sets' sizes and overlaps, chance and baselines."""
        rows = self.to_frame().to_dict("records")
        return {"k": self.k, "n_candidates": self.n_candidates, "baseline": dict(self.baseline),
                "effects": {f"{r['neurons']} on {r['prompts']}": {x: r[x] for x in ("size", "delta", "random_mean",
                                                                                    "beats_random")} for r in rows},
                "overlap": self.overlap.summary(), "chance_pairwise": self.chance_pairwise,
                "n_random": max((len(v) for v in self.random.values()), default=0)}

    def to_frame(self) -> pd.DataFrame:
        """One row per (neuron set, prompt language): the ablation's change of the refusal score against random sets."""
        import pandas as pd

        out = []
        for (name, lang), v in self.effects.items():
            rnd = torch.tensor(self.random[(name, lang)])
            out.append({"neurons": name, "size": len(self.sets.get(name, self.overlap.common)), "prompts": lang,
                        "baseline": self.baseline[lang], "delta": v, "random_mean": float(rnd.mean()),
                        "random_lo": float(rnd.quantile(0.025)), "random_hi": float(rnd.quantile(0.975)),
                        "beats_random": bool(v < float(rnd.min()))})
        return pd.DataFrame(out)

    def plot(self) -> Any:
        """The refusal-score change of each (set, prompt language) ablation beside random sets of the same size."""
        from interp.viz.multilingual import neuron_effects

        fr = self.to_frame()
        return neuron_effects([f"{n} on {p}" for n, p in zip(fr.neurons, fr.prompts)], fr.delta.tolist(),
                              fr.random_mean.tolist(), fr.random_lo.tolist(), fr.random_hi.tolist())


def refusal_ids(model: Model) -> list[int]:
    """First token ids of refusal openings in English and of the other languages' declines."""
    starts = list(refusal_openings()) + [p[:1].upper() + p[1:] for v in DECLINES.values() for p in v]
    return refusal_token_ids(model.tokenizer, starts)


def _joint(model: Model, batch: Any, metric: Any, neurons: list[Neuron]) -> float:
    with torch.no_grad(), ablate_neurons(model, neurons):
        return float(call_metric(metric, last_logits(model, batch)))


@moved_keywords(moved())
def language_neurons(model: Model, data: ParallelSafety, lang: str, metric: Any, k: int, n_candidates: int,
                     runtime: Runtime | None = None) -> set[Neuron]:
    """Top ``n_candidates`` by contrast effect size, then the ``k`` whose ablation lowers the refusal score most
    (``runtime``: default batch size 32)."""
    batch_size = runtime.batch_size if runtime is not None else 32
    con = neuron_contrast(model, data.get("harmful", "train", lang), data.get("harmless", "train", lang),
                          batch_size=batch_size)
    cand = [(la, i) for la, i, _ in con.top(n_candidates, by="effect", sign="pos")]
    eff = neuron_ablation_effect(model, data.get("harmful", "val", lang), metric, cand,
                                 runtime=Runtime(batch_size=batch_size, progress=False))
    order = eff.delta.argsort()[:k].tolist()     # most negative change first
    return {cand[i] for i in order}


@moved_keywords(moved())
def safety_neurons(model: Model, data: ParallelSafety, k: int = 16, n_candidates: int = 64, n_random: int = 20,
                   runtime: Runtime | None = None) -> SafetyNeurons:
    """The study of the module docstring on ``model`` with the parallel prompts ``data`` (``runtime``: the random
    neurons' seed, default batch size 32)."""
    rt = runtime if runtime is not None else Runtime(batch_size=32, progress=False)
    seed = rt.seed
    if not 1 <= k <= n_candidates:
        raise ValueError(f"need 1 <= k <= n_candidates, got k={k}, n_candidates={n_candidates}")
    ids = refusal_ids(model)
    metric = refusal_score(ids)
    sets = {lang: language_neurons(model, data, lang, metric, k, n_candidates, rt) for lang in data.langs}
    overlap = intersect_neurons(sets)
    n_total = model.n_layers * int(model.d_mlp)
    named = {**sets, "common": overlap.common}
    baseline, effects, random = {}, {}, {}
    for lang in data.langs:
        batch = batch_of(model, data.get("harmful", "test", lang))
        with torch.no_grad():
            baseline[lang] = float(call_metric(metric, last_logits(model, batch)))
        for name, neurons in named.items():
            if not neurons:
                continue
            chosen = sorted(neurons)
            effects[(name, lang)] = _joint(model, batch, metric, chosen) - baseline[lang]
            random[(name, lang)] = [_joint(model, batch, metric, random_neurons(chosen, int(model.d_mlp), len(chosen),
                                                                                 seed + j)) - baseline[lang]
                                    for j in range(n_random)]
    return SafetyNeurons(list(data.langs), k, n_candidates, sets, overlap, k * k / n_total, baseline, effects, random,
                         meta={"refusal_token_ids": ids, "n_random": n_random, "seed": seed})


__all__ = ["SafetyNeurons", "language_neurons", "refusal_ids", "safety_neurons"]
