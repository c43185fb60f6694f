"""Behaviour vs steering strength, with the two references an effect needs: no intervention, and a random
direction of the same strength.

    def make(alpha):
        return steering.AddVector(d, layers=range(10, 20), alpha=alpha, unit="residual", norms=norms)
    sweep = steering.alpha_sweep(model, prompts, make, [0, 0.25, 0.5, 1], evals.refusal_rate)
    sweep.to_frame(); sweep.plot()

A text metric takes the generated texts (``list[str]``, from :func:`steering.generate`); a logit metric
(``on="logits"``) takes the next-token logits at each prompt's last token ``[n_prompts, vocab]`` (from
``interp.forward.last_logits``). Either returns one number.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float
from tqdm.auto import tqdm

from interp.forward import batches, last_logits, prepare
from interp.models import Model
from steering._args import check_finite
from steering.apply import apply
from steering.generate import generate

ON = ("text", "logits")


@dataclass
class AlphaSweep:
    """``steered [n_alphas]`` and ``random [n_random, n_alphas]`` (random directions of the same strength) of
    ``metric`` at each of ``alphas``, and its ``baseline`` with no intervention, on ``n_prompts`` prompts."""

    alphas: list[float]
    steered: Float[torch.Tensor, " n_alphas"]
    random: Float[torch.Tensor, "n_random n_alphas"]
    baseline: float
    metric: str
    on: str
    n_prompts: int
    model_id: str
    seeds: list[int] = field(default_factory=list)
    intervention: str = ""

    @property
    def effect(self) -> Float[torch.Tensor, " n_alphas"]:
        """Steered minus the mean of the random controls, per alpha (what the direction adds over any direction)."""
        return self.steered - self.random.mean(0)

    def to_frame(self) -> Any:
        """Long table: one row per (alpha, condition[, seed]), with the baseline as ``condition='baseline'``."""
        import pandas as pd

        rows = [{"alpha": a, "condition": "steered", "seed": None, "value": float(v)}
                for a, v in zip(self.alphas, self.steered.tolist(), strict=True)]
        for seed, row in zip(self.seeds, self.random.tolist(), strict=True):
            rows += [{"alpha": a, "condition": "random", "seed": seed, "value": float(v)}
                     for a, v in zip(self.alphas, row, strict=True)]
        rows.append({"alpha": None, "condition": "baseline", "seed": None, "value": self.baseline})
        df = pd.DataFrame(rows)
        df["metric"], df["on"], df["n_prompts"], df["model_id"] = self.metric, self.on, self.n_prompts, self.model_id
        return df

    def plot(self) -> Any:
        from viz.steering import alpha_curve

        return alpha_curve(self.alphas, self.steered, self.random, self.baseline, metric=self.metric,
                           title=f"{self.metric} vs alpha ({self.model_id}, {self.n_prompts} prompts)")

    def __repr__(self) -> str:
        pairs = ", ".join(f"{a:g}: {s:.3g} (random {r:.3g})" for a, s, r in
                          zip(self.alphas, self.steered.tolist(), self.random.mean(0).tolist(), strict=True))
        return f"AlphaSweep({self.metric}, baseline {self.baseline:.3g}; {pairs})"


def _evaluator(model: Model, prompts: list[str], metric: Callable[[Any], Any], on: str, max_new_tokens: int,
               batch_size: int, chat: bool, system: str | None, generate_kwargs: dict[str, Any]
               ) -> Callable[[tuple], float]:
    """``ivs -> metric value`` for a text or a logit metric (prompts prepared once for logits)."""
    if on == "logits":
        encs = prepare(model, prompts, chat=chat, system=system)[1]
        prompt_batches = batches(model, encs, batch_size)

    def run(ivs: tuple) -> float:
        if on == "text":
            gens = generate(model, prompts, *ivs, max_new_tokens=max_new_tokens, batch_size=batch_size, chat=chat,
                            system=system, progress=False, **generate_kwargs)
            value = metric(list(gens.texts))
        else:
            with apply(model, *ivs) as handle:
                rows = []
                for b in prompt_batches:
                    handle.set_batch(b)
                    rows.append(last_logits(model, b).cpu())
            value = metric(torch.cat(rows))
        if isinstance(value, torch.Tensor):
            value = value.item() if value.numel() == 1 else value
        return check_finite(value, f"metric {getattr(metric, '__name__', 'metric')}")
    return run


def _control(make_intervention: Callable[[float], Any], make_control: Callable[[float, int], Any] | None,
             model: Model, alpha: float, seed: int) -> Any:
    if make_control is not None:
        return make_control(alpha, seed)
    iv = make_intervention(alpha)
    if not hasattr(iv, "random_like"):
        raise TypeError(f"{type(iv).__name__} has no random_like(model, seed) to build the random-direction control;"
                        f" pass make_control=lambda alpha, seed: ... (the same edit along a random direction)")
    return iv.random_like(model, seed=seed)


def alpha_sweep(model: Model, prompts: Sequence[str], make_intervention: Callable[[float], Any],
                alphas: Sequence[float], metric: Callable[[Any], Any], *, on: str = "text", n_random: int = 1,
                seed: int = 0, make_control: Callable[[float, int], Any] | None = None, max_new_tokens: int = 32,
                batch_size: int = 16, chat: bool = True, system: str | None = None, progress: bool = True,
                **generate_kwargs: Any) -> AlphaSweep:
    """``metric`` at each alpha for ``make_intervention(alpha)``, for ``n_random`` same-strength random controls
    (``intervention.random_like(model, seed)``, or ``make_control(alpha, seed)``), and with no intervention.

    ``on="text"``: ``metric(texts: list[str])`` over greedy generations (``max_new_tokens``; extra keyword
    arguments go to :func:`steering.generate`); ``on="logits"``: ``metric(logits [n_prompts, vocab])``.
    """
    if on not in ON:
        raise ValueError(f"on must be one of {ON}: 'text' for a metric of generated texts (e.g. "
                         f"evals.refusal_rate), 'logits' for a metric of last-token logits; got {on!r}")
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of strings, not a single string; wrap it in a list")
    alpha_list = [check_finite(a, "alpha") for a in alphas]
    if not alpha_list:
        raise ValueError("alphas is empty; give e.g. [0, 0.25, 0.5, 1]")
    if n_random < 0:
        raise ValueError(f"n_random must be >= 0, got {n_random}")
    prompts = list(prompts)
    run = _evaluator(model, prompts, metric, on, max_new_tokens, batch_size, chat, system, generate_kwargs)
    seeds = [seed + j for j in range(n_random)]
    bar = tqdm(total=1 + len(alpha_list) * (1 + n_random), desc="alpha sweep", disable=not progress, leave=False)
    try:
        baseline = run(())
        bar.update()
        steered, random = [], [[math.nan] * len(alpha_list) for _ in seeds]
        for i, a in enumerate(alpha_list):
            steered.append(run((make_intervention(a),)))
            bar.update()
            for j, s in enumerate(seeds):
                random[j][i] = run((_control(make_intervention, make_control, model, a, s),))
                bar.update()
    finally:
        bar.close()
    return AlphaSweep(alpha_list, torch.tensor(steered), torch.tensor(random).reshape(n_random, len(alpha_list)),
                      baseline, getattr(metric, "__name__", type(metric).__name__), on, len(prompts), model.name,
                      seeds, _describe(make_intervention(alpha_list[-1])))


def _describe(iv: Any) -> str:
    """A short label for an intervention (its class, layers, sites and unit; no tensors)."""
    parts = [f"{k}={getattr(iv, k)!r}" for k in ("layers", "sites", "unit") if hasattr(iv, k)]
    return f"{type(iv).__name__}({', '.join(parts)})"


__all__ = ["AlphaSweep", "alpha_sweep"]
