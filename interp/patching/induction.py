"""The causal check of induction heads: ablating the top-``k`` heads by induction score raises the loss on the
second copy of repeated random tokens far more than ablating as many random heads of the same layers.

Scores from :func:`interp.look.heads.head_scores`; ablation by :class:`interp.patching.edits.HeadAblation`;
controls by :func:`interp.evals.controls.matched_random` (several draws from one seeded stream); the interval is a
bootstrap over prompts (:mod:`interp.evals.bootstrap`). The loss prompts are drawn with ``seed + 1``, apart from
the scoring prompts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.evals.bootstrap import percentile_interval, resample_ids
from interp.evals.controls import as_rng, matched_random
from interp.evals.logits import cross_entropy
from interp.forward import batches, encode_ids, forward
from interp.look.heads import HeadScores, head_scores, repeated_tokens
from interp.models import Model
from interp.patching.edits import HeadAblation
from interp.values import Runtime

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go


@dataclass
class InductionAblation(Result):
    """Per-prompt mean loss on the second copy (``[n]``): ``clean``, ``ablated`` (the top-``k`` induction heads)
    and ``random [n_draws, n]`` (layer-matched random heads); ``heads`` / ``random_heads`` the units ablated."""

    clean: torch.Tensor
    ablated: torch.Tensor
    random: torch.Tensor
    heads: list[list[int]]
    random_heads: list[list[list[int]]]
    mode: str = "zero"
    n_tokens: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def summary(self, n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
        """Mean loss rises, the difference induction - random (mean over draws) with a 95% bootstrap interval over
        prompts and its one-sided bootstrap p-value, and the share of draws that rose at least as much."""
        rise = self.ablated - self.clean
        rise_r = self.random - self.clean                                    # [draws, n]
        diff = rise - rise_r.mean(0)
        idx = resample_ids(len(diff), n_boot, seed)
        boot = diff[idx].mean(1)
        lo, hi = percentile_interval(boot)
        p_boot = float((boot <= 0).double().mean().clamp_min(1 / n_boot))
        p_draws = (int((rise_r.mean(1) >= rise.mean()).sum()) + 1) / (len(rise_r) + 1)
        return {"k": len(self.heads), "heads": self.heads, "mode": self.mode, "n_prompts": len(self.clean),
                "n_draws": len(self.random), "clean_loss": float(self.clean.mean()),
                "rise_induction": float(rise.mean()), "rise_random": float(rise_r.mean()),
                "rise_random_per_draw": rise_r.mean(1).tolist(), "difference": float(diff.mean()),
                "ci95": [float(lo), float(hi)], "p_bootstrap": p_boot, "p_draws": p_draws}

    def to_frame(self) -> pd.DataFrame:
        """One row per prompt and condition: ``prompt``, ``condition`` (clean, induction, random_{i}), ``loss``."""
        import pandas as pd

        rows = [("clean", self.clean), ("induction", self.ablated)] + [(f"random_{i}", r) for i, r in
                                                                       enumerate(self.random)]
        return pd.DataFrame([{"prompt": j, "condition": c, "loss": float(v[j])} for c, v in rows
                             for j in range(len(v))])

    def plot(self, title: str | None = None) -> go.Figure:
        """Bars of the mean loss rise: the induction heads beside each random draw."""
        from interp.viz.looks import dla_figure

        s = self.summary()
        names = ["induction"] + [f"random {i}" for i in range(len(self.random))]
        return dla_figure(names, [s["rise_induction"]] + s["rise_random_per_draw"], None,
                          title or f"loss rise on the second copy, top-{s['k']} induction vs random heads")


def second_copy_loss(model: Model, tokens: torch.Tensor, n_tokens: int, edit: HeadAblation | None = None,
                     batch_size: int = 16) -> torch.Tensor:
    """``[n]`` mean next-token loss on the second copy's tokens after its first (those the first copy predicts)."""
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[:, n_tokens + 2:] = True
    out = []
    fns = {} if edit is None else edit.hook_fns(model)
    for i, b in enumerate(batches(model, encode_ids(tokens), batch_size)):
        with torch.no_grad():
            lg = forward(model, b, fns, logits="all")
        rows = mask[i * batch_size:i * batch_size + len(lg)]
        for r in range(len(lg)):
            s, c = cross_entropy(lg[r:r + 1], b.input_ids[r:r + 1], rows[r:r + 1])
            out.append(s / c)
    return torch.tensor(out)


def ablation_check(model: Model, scores: HeadScores | None = None, *, k: int = 5, n_draws: int = 5,
                   n_tokens: int = 50, n_prompts: int = 32, seed: int = 0, mode: str = "zero",
                   means: torch.Tensor | None = None, runtime: Runtime | None = None) -> InductionAblation:
    """Ablate the top-``k`` heads by induction score (``scores`` or :func:`head_scores` with these settings) and
    ``n_draws`` sets of layer-matched random heads; the second-copy loss of fresh repeated prompts under each."""
    run = Runtime.of(runtime)
    scores = scores or head_scores(model, n_tokens=n_tokens, n_prompts=n_prompts, seed=seed, runtime=run)
    chosen = [(la, h) for la, h, _ in scores.top("induction", k)]
    rng = as_rng(seed)
    draws = [matched_random(chosen, lambda u: [(u[0], h) for h in range(model.n_heads)], rng, what="head")
             for _ in range(n_draws)]
    tokens = repeated_tokens(model, n_tokens, n_prompts, seed + 1)

    def loss(heads: list[tuple[int, int]] | None) -> torch.Tensor:
        edit = None if heads is None else HeadAblation(heads, mode, means)
        return second_copy_loss(model, tokens, n_tokens, edit, run.batch_size)

    return InductionAblation(loss(None), loss(chosen), torch.stack([loss(d) for d in draws]),
                             [list(u) for u in chosen], [[list(u) for u in d] for d in draws], mode, n_tokens,
                             {"model_id": model.name, "seed": seed, "scores": scores.summary()["top_induction"]})


__all__ = ["InductionAblation", "ablation_check", "second_copy_loss"]
