"""Entrainment heads: learned head masks (:func:`interp.patching.masks.learn_mask`) over a sparsity sweep, the
found heads zeroed against as many layer-matched random heads (:func:`interp.evals.controls.matched_random`), and
their attention from the last prompt position (where the distracted token is predicted) to the context token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.capturing import capture
from interp.evals.bootstrap import mean_interval
from interp.evals.controls import as_rng, matched_random
from interp.forward import prepare
from interp.models import Model
from interp.patching.edits import HeadAblation
from interp.patching.masks import MaskConfig, MaskResult, learn_mask
from interp.patching.measures import logit_diff
from interp.studies.entrainment.config import EntrainmentConfig
from interp.studies.entrainment.data import ContextPairs, EntrainmentSet
from interp.studies.entrainment.effect import clean_correct, score_pairs
from interp.values import Prompts, Runtime

if TYPE_CHECKING:
    import pandas as pd

Head = tuple[int, int]


@dataclass
class HeadSweep(Result):
    """One learned mask per ``sparsities`` value (``masks``), and the ``heads`` kept at ``chosen`` sparsity (its
    heads above 0.5, the ``max_heads`` highest; the highest one when none is above)."""

    sparsities: list[float]
    masks: list[MaskResult]
    chosen: float
    heads: list[list[int]]
    meta: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Per sparsity the metric before / with its selected heads zeroed and their count; the heads kept."""
        return {"chosen": self.chosen, "heads": self.heads,
                "sweep": [{"sparsity": s, "n_selected": len(m.selected()), "baseline": m.baseline,
                           "selected_metric": m.selected_metric} for s, m in zip(self.sparsities, self.masks)]}

    def to_frame(self) -> pd.DataFrame:
        """One row per sparsity and head: ``sparsity``, ``layer``, ``head``, ``score``, ``selected``."""
        import pandas as pd

        return pd.concat([m.to_frame().assign(sparsity=s) for s, m in zip(self.sparsities, self.masks)],
                         ignore_index=True)

    def plot(self, k: int = 20, title: str | None = None) -> Any:
        """The chosen sparsity's mask scores (highest ``k``)."""
        return self.masks[self.sparsities.index(self.chosen)].plot(k=k, title=title)


def find_heads(model: Model, pairs: ContextPairs, config: EntrainmentConfig) -> HeadSweep:
    """Learn a head mask that decreases ``logit[tracked] - logit[answer]`` on ``pairs.present`` at each sparsity."""
    metric = logit_diff(pairs.token.to(model.device), pairs.answer.to(model.device))
    prompts, run = Prompts(tuple(pairs.present), chat=config.chat), Runtime(seed=config.seed, progress=False)
    masks = [learn_mask(model, prompts, metric, over="heads", runtime=run,
                        config=MaskConfig(objective="decrease", sparsity=s, steps=config.steps, lr=config.lr))
             for s in config.sparsities]
    chosen = masks[list(config.sparsities).index(config.chosen_sparsity)]
    k = min(config.max_heads, max(1, len(chosen.selected())))
    heads = [[la, h] for la, h, _ in chosen.ranking(k)]
    return HeadSweep(list(config.sparsities), masks, config.chosen_sparsity, heads,
                     {"model_id": model.name, "kind": pairs.kind, "metric": "logit[tracked] - logit[answer]"})


@dataclass
class HeadAblationCheck(Result):
    """Logit gains ``[m]`` of the mask kind's pairs and clean correctness ``[n]`` with nothing zeroed (``*_clean``),
    the found ``heads`` zeroed (``*_found``) and each of ``n_draws`` layer-matched random sets (``*_random [d, .]``)."""

    heads: list[list[int]]
    random_heads: list[list[list[int]]]
    gain_clean: torch.Tensor
    gain_found: torch.Tensor
    gain_random: torch.Tensor
    correct_clean: torch.Tensor
    correct_found: torch.Tensor
    correct_random: torch.Tensor
    n_boot: int = 2000
    seed: int = 0

    def summary(self) -> dict[str, Any]:
        """The entrainment drop (clean gain - ablated gain) of the found vs the random heads, paired by item (95%
        interval, one-sided p that found <= random; ``p_draws``: share of draws dropping at least as much), and the
        clean accuracy lost by the found heads beyond the random ones (interval; p that they cost no more)."""
        drop_f, drop_r = self.gain_clean - self.gain_found, self.gain_clean - self.gain_random   # [m], [d, m]
        diff = mean_interval(drop_f - drop_r.mean(0), self.n_boot, self.seed)
        p_draws = (int((drop_r.mean(1) >= drop_f.mean()).sum()) + 1) / (len(drop_r) + 1)
        cost = mean_interval(self.correct_random.mean(0) - self.correct_found, self.n_boot, self.seed)
        return {"heads": self.heads, "n_draws": len(self.random_heads), "gain_clean": float(self.gain_clean.mean()),
                "gain_found": float(self.gain_found.mean()), "gain_random": float(self.gain_random.mean()),
                "drop_found_minus_random": diff, "p_draws": p_draws,
                "accuracy_clean": float(self.correct_clean.mean()), "accuracy_found": float(self.correct_found.mean()),
                "accuracy_random": float(self.correct_random.mean()), "accuracy_cost_found_minus_random": cost}

    def to_frame(self) -> pd.DataFrame:
        """One row per condition (clean, found, random_i): mean logit gain and clean accuracy."""
        import pandas as pd

        rows = [("clean", self.gain_clean, self.correct_clean), ("found", self.gain_found, self.correct_found)]
        rows += [(f"random_{i}", g, c) for i, (g, c) in enumerate(zip(self.gain_random, self.correct_random))]
        return pd.DataFrame([{"condition": n, "logit_gain": float(g.mean()), "accuracy": float(c.mean())}
                             for n, g, c in rows])

    def plot(self, title: str | None = None) -> Any:
        """Bars of the mean entrainment gain with nothing, the found heads and each random set zeroed."""
        from interp.viz.finetune import method_rates

        f = self.to_frame()
        nan = float("nan")
        return method_rates({r.condition: (r.logit_gain, nan, nan) for r in f.itertuples()}, "logit gain",
                            title or "entrainment with the found vs random heads zeroed")


def random_head_sets(model: Model, heads: Sequence[Sequence[int]], n_draws: int, seed: int) -> list[list[Head]]:
    """``n_draws`` sets of heads, each head drawn in the layer of a found one (one seeded stream)."""
    chosen = [(int(la), int(h)) for la, h in heads]
    rng = as_rng(seed)
    return [matched_random(chosen, lambda u: [(u[0], h) for h in range(model.n_heads)], rng, what="head")
            for _ in range(n_draws)]


def ablation_check(model: Model, data: EntrainmentSet, pairs: ContextPairs, heads: Sequence[Sequence[int]],
                   config: EntrainmentConfig, runtime: Runtime | None = None) -> HeadAblationCheck:
    """Zero ``heads`` and ``config.n_draws`` layer-matched random sets; entrainment gains and clean accuracy."""
    bs = Runtime.of(runtime).batch_size
    draws = random_head_sets(model, heads, config.n_draws, config.seed)

    def run(edits: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        return (score_pairs(model, pairs, edits, config.chat, bs).logit_gain,
                clean_correct(model, data, edits, config.chat, bs))

    clean, found = run([]), run([HeadAblation([tuple(u) for u in heads])])
    rand = [run([HeadAblation(d)]) for d in draws]
    return HeadAblationCheck([list(u) for u in heads], [[list(u) for u in d] for d in draws], clean[0], found[0],
                             torch.stack([r[0] for r in rand]), clean[1], found[1], torch.stack([r[1] for r in rand]),
                             config.n_boot, config.seed)


@dataclass
class ContextAttention(Result):
    """``weights [m, k]``: attention of each head (``heads``) from the last prompt position to the context token,
    on the mask kind's present prompts; ``random [m, k]`` the same for one layer-matched random set; ``patterns
    [k, T, T]``: each found head's full pattern (query rows, key columns) on the ``example`` prompt, its ``tokens``."""

    heads: list[list[int]]
    random_heads: list[list[int]]
    weights: torch.Tensor
    random: torch.Tensor
    example: str = ""
    tokens: list[str] = field(default_factory=list)
    patterns: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0, 0))

    def summary(self) -> dict[str, Any]:
        """Mean attention to the context token per found head and per random head."""
        return {"found": {f"L{la}H{h}": float(w) for (la, h), w in zip(self.heads, self.weights.mean(0))},
                "random": {f"L{la}H{h}": float(w) for (la, h), w in zip(self.random_heads, self.random.mean(0))},
                "mean_found": float(self.weights.mean()), "mean_random": float(self.random.mean())}

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([{"set": s, "layer": la, "head": h, "attention": float(w[:, j].mean())}
                             for s, hs, w in (("found", self.heads, self.weights), ("random", self.random_heads,
                                                                                    self.random))
                             for j, (la, h) in enumerate(hs)])

    def plot(self, kind: str = "bars", title: str | None = None) -> Any:
        """``"bars"``: each head's mean attention from the last position to the context token; ``"pattern"``: the
        found heads' patterns on the example prompt (:func:`interp.viz.looks.pattern_heatmaps`, one per head)."""
        from interp.viz.finetune import method_rates

        if kind not in ("bars", "pattern"):
            raise ValueError(f"kind must be 'bars' or 'pattern', got {kind!r}")
        if kind == "pattern":
            return self.pattern_plot(title)
        nan = float("nan")
        return method_rates({f"{r.set} L{r.layer}H{r.head}": (r.attention, nan, nan)
                             for r in self.to_frame().itertuples()}, "attention to the context token",
                            title or "attention from the predicted position to the context token")

    def pattern_plot(self, title: str | None = None) -> Any:
        """The found heads' attention patterns on the example prompt, titled ``L{layer}H{head}``."""
        from interp.viz.looks import pattern_heatmaps

        if not self.patterns.numel():
            raise ValueError("this result holds no patterns (saved before they were kept); rerun context_attention")
        fig = pattern_heatmaps(self.patterns, self.tokens, [h for _, h in self.heads], 0)
        for ann, (la, h) in zip(fig.layout.annotations, self.heads):
            ann.text = f"L{la}H{h}"
        fig.update_layout(title=title or f"found heads' attention on: {self.example!r}")
        return fig


def context_attention(model: Model, pairs: ContextPairs, heads: Sequence[Sequence[int]], chat: bool = False,
                      seed: int = 0, batch_size: int = 16) -> ContextAttention:
    """Pattern rows at the last prompt token (``interp.capture(..., "pattern", "last")``), read at each present
    prompt's tracked token (its first occurrence); the found heads' full patterns on the first present prompt."""
    rand = random_head_sets(model, heads, 1, seed)[0]
    layers = sorted({int(la) for la, _ in [*heads, *rand]})
    _, encs = prepare(model, pairs.present, chat=chat)
    key = torch.tensor([e.ids.index(int(t)) for e, t in zip(encs, pairs.token)])
    acts = capture(model, Prompts(tuple(pairs.present), chat=chat), "pattern", "last", layers=layers,
                   runtime=Runtime(batch_size=batch_size))
    p = acts.tensor.float().view(len(encs), len(layers), model.n_heads, -1)       # [m, L, H, keys]
    rows = torch.arange(len(encs))

    def read(hs: Sequence[Sequence[int]]) -> torch.Tensor:
        return torch.stack([p[rows, layers.index(int(la)), int(h), key] for la, h in hs], 1)

    ex = capture(model, Prompts(tuple(pairs.present[:1]), chat=chat), "pattern", "all", layers=layers,
                 runtime=Runtime(batch_size=1, progress=False)).tensor.float()       # [1, L, T, H * T]
    T = len(encs[0].ids)
    full = ex[0].view(len(layers), T, model.n_heads, T)                                 # [L, query, H, key]
    patterns = torch.stack([full[layers.index(int(la)), :, int(h)] for la, h in heads])  # [k, T, T]
    tokens = model.tokenizer.convert_ids_to_tokens(list(encs[0].ids))
    return ContextAttention([list(u) for u in heads], [list(u) for u in rand], read(heads), read(rand),
                            pairs.present[0], tokens, patterns)


__all__ = ["ContextAttention", "HeadAblationCheck", "HeadSweep", "ablation_check", "context_attention", "find_heads",
           "random_head_sets"]
