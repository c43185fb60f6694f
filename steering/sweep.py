"""Behaviour vs steering strength, with the two references an effect needs: no intervention, and a random
direction of the same strength.

    def make(alpha):
        return steering.AddVector(d, layers=range(10, 20), alpha=alpha, unit="residual", norms=norms)
    sweep = steering.alpha_sweep(model, prompts, make, [0, 0.25, 0.5, 1], evals.refusal_rate,
                                 config=steering.SweepConfig(n_random=2), runtime=interp.Runtime(seed=0))
    sweep.to_frame(); sweep.plot()

A text metric takes the generated texts (``list[str]``, from :func:`steering.generate`); a logit metric
(``on="logits"``) takes the next-token logits at each prompt's last token ``[n_prompts, vocab]`` (from
``interp.forward.last_logits``). Either returns one number.

Every sweep also reports what the strength costs, per alpha, for the steered edit and each random control:
``kl``, the mean over prompts of KL(steered || unsteered) of the next-token distributions at each prompt's last
token (``evals.kl_div``), and, with ``SweepConfig(reference_texts=)``, ``ce``, the cross-entropy (nats / token) of those texts
under the edit (``evals.cross_entropy``; ``baseline_ce`` without it). ``.plot()`` shows behaviour and cost together.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from tqdm.auto import tqdm

from interp.bundle import Result
from interp.evals.logits import cross_entropy, kl_div
from interp.forward import batches, forward, last_logits, prepare
from interp.models import Model
from interp.values import Prompts, Runtime, moved_keywords
from steering._args import check_finite
from steering.applying import apply
from steering.generation import Sampling, generate

if TYPE_CHECKING:
    import pandas as pd

ON = ("text", "logits")


@dataclass
class AlphaSweep(Result):
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
    kl: Float[torch.Tensor, " n_alphas"] | None = None
    random_kl: Float[torch.Tensor, "n_random n_alphas"] | None = None
    ce: Float[torch.Tensor, " n_alphas"] | None = None
    random_ce: Float[torch.Tensor, "n_random n_alphas"] | None = None
    baseline_ce: float | None = None

    @property
    def effect(self) -> Float[torch.Tensor, " n_alphas"]:
        """Steered minus the mean of the random controls, per alpha (what the direction adds over any direction)."""
        return self.steered - self.random.mean(0)

    def _cost(self, name: str, row: int | None, i: int) -> float | None:
        """Cost ``name`` ('kl' / 'ce') of the steered edit (``row=None``) or random control ``row`` at alpha ``i``."""
        t = getattr(self, name if row is None else f"random_{name}")
        return None if t is None else float(t[i] if row is None else t[row, i])

    def summary(self) -> dict[str, Any]:
        """The metric at each strength, steered and random (mean), the baseline, and the largest effect over random."""
        eff = self.effect
        i = int(eff.abs().argmax())
        return {"metric": self.metric, "on": self.on, "n_prompts": self.n_prompts, "baseline": self.baseline,
                "alphas": list(self.alphas), "steered": self.steered.tolist(), "random": self.random.mean(0).tolist(),
                "largest_effect": float(eff[i]), "at_alpha": self.alphas[i]}

    def to_frame(self) -> pd.DataFrame:
        """Long table: one row per (alpha, condition[, seed]), with the baseline as ``condition='baseline'``;
        ``kl`` (mean KL(steered || unsteered), nats) and ``ce`` (nats / token on the reference texts) columns."""
        import pandas as pd

        rows = [{"alpha": a, "condition": "steered", "seed": None, "value": float(v), "kl": self._cost("kl", None, i),
                 "ce": self._cost("ce", None, i)} for i, (a, v) in enumerate(zip(self.alphas, self.steered.tolist(),
                                                                                 strict=True))]
        for j, (seed, row) in enumerate(zip(self.seeds, self.random.tolist(), strict=True)):
            rows += [{"alpha": a, "condition": "random", "seed": seed, "value": float(v), "kl": self._cost("kl", j, i),
                      "ce": self._cost("ce", j, i)} for i, (a, v) in enumerate(zip(self.alphas, row, strict=True))]
        rows.append({"alpha": None, "condition": "baseline", "seed": None, "value": self.baseline,
                     "kl": 0.0 if self.kl is not None else None, "ce": self.baseline_ce})
        df = pd.DataFrame(rows)
        df["metric"], df["on"], df["n_prompts"], df["model_id"] = self.metric, self.on, self.n_prompts, self.model_id
        return df

    def plot(self) -> Any:
        """Behaviour vs alpha against its controls; with costs measured, the KL (and CE) curves beneath it."""
        title = f"{self.metric} vs alpha ({self.model_id}, {self.n_prompts} prompts)"
        if self.kl is None:
            from interp.viz.steering import alpha_curve

            return alpha_curve(self.alphas, self.steered, self.random, self.baseline, metric=self.metric, title=title)
        from interp.viz.steering import alpha_cost_curve

        return alpha_cost_curve(self, title=title + " and its cost")

    def __repr__(self) -> str:
        pairs = ", ".join(f"{a:g}: {s:.3g} (random {r:.3g})" for a, s, r in
                          zip(self.alphas, self.steered.tolist(), self.random.mean(0).tolist(), strict=True))
        return f"AlphaSweep({self.metric}, baseline {self.baseline:.3g}; {pairs})"


def logits_under(model: Model, prompt_batches: list, ivs: Sequence[Any]) -> torch.Tensor:
    """Next-token logits ``[n_prompts, vocab]`` at each prompt's last token with the interventions ``ivs``
    attached (each batch declared, so ``positions='post_instruction'`` edits work)."""
    with apply(model, *ivs) as handle:
        rows = []
        for b in prompt_batches:
            handle.set_batch(b)
            rows.append(last_logits(model, b).cpu())
    return torch.cat(rows)


def _ce_under(model: Model, text_batches: list, ivs: tuple) -> float:
    """Cross-entropy (nats / token) of plain texts with ``ivs`` attached; each row's first real token (predicted
    from padding) is left out."""
    total, count = 0.0, 0
    with apply(model, *ivs) as handle:
        for b in text_batches:
            handle.set_batch(b)
            logits = forward(model, b, logits="all").cpu()
            m = b.attention_mask.bool()
            keep = m & torch.cat([torch.zeros_like(m[:, :1]), m[:, :-1]], 1)
            s, n = cross_entropy(logits, b.input_ids, keep)
            total, count = total + s, count + n
    if count == 0:
        raise ValueError("the reference texts give no token to predict; pass texts of two tokens or more")
    return total / count


def _evaluator(model: Model, texts: Prompts, metric: Callable[[Any], Any], on: str, cfg: SweepConfig,
               batch_size: int) -> tuple[Callable[[tuple], float], list]:
    """``ivs -> metric value`` for a text or a logit metric, and the prompt batches (prepared once)."""
    prompt_batches = batches(model, texts.encode(model)[1], batch_size)   # encoded once, for every generation

    def run(ivs: tuple) -> float:
        if on == "text":
            gens = generate(model, texts, *ivs, max_new_tokens=cfg.max_new_tokens, sampling=cfg.sampling,
                            runtime=Runtime(batch_size=batch_size, progress=False))
            value = metric(list(gens.texts))
        else:
            value = metric(logits_under(model, prompt_batches, ivs))
        if isinstance(value, torch.Tensor):
            value = value.item() if value.numel() == 1 else value
        return check_finite(value, f"metric {getattr(metric, '__name__', 'metric')}")
    return run, prompt_batches


def _coster(model: Model, prompt_batches: list, reference_texts: Sequence[str] | None, batch_size: int
            ) -> tuple[Callable[[tuple], tuple[float, float]], float]:
    """``ivs -> (mean KL(steered || unsteered) over the prompts, CE on the reference texts or NaN)``, and the
    unsteered CE (NaN without reference texts)."""
    plain = logits_under(model, prompt_batches, ())
    refs = None
    if reference_texts is not None:
        refs = batches(model, prepare(model, list(reference_texts), chat=False)[1], batch_size)

    def cost(ivs: tuple) -> tuple[float, float]:
        kl = float(kl_div(logits_under(model, prompt_batches, ivs), plain).mean()) if ivs else 0.0
        return kl, math.nan if refs is None else _ce_under(model, refs, ivs)
    return cost, math.nan if refs is None else _ce_under(model, refs, ())


def _control(make_intervention: Callable[[float], Any], make_control: Callable[[float, int], Any] | None,
             model: Model, alpha: float, seed: int) -> Any:
    if make_control is not None:
        return make_control(alpha, seed)
    iv = make_intervention(alpha)
    if not hasattr(iv, "random_like"):
        raise TypeError(f"{type(iv).__name__} has no random_like(model, seed) to build the random-direction control;"
                        f" pass make_control=lambda alpha, seed: ... (the same edit along a random direction)")
    return iv.random_like(model, seed=seed)


@dataclass(frozen=True)
class SweepConfig:
    """The knobs of :func:`alpha_sweep`: ``n_random`` same-strength random controls (``make_control(alpha, seed)``
    builds one; default ``intervention.random_like(model, seed)``), ``max_new_tokens`` and ``sampling`` of the
    generations (``on="text"``), and the ``cost`` measured per edit (KL; CE on ``reference_texts``, plain text)."""

    n_random: int = 1
    make_control: Callable[[float, int], Any] | None = None
    max_new_tokens: int = 32
    sampling: Sampling | None = None
    cost: bool = True
    reference_texts: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.n_random, bool) or not isinstance(self.n_random, int) or self.n_random < 0:
            raise ValueError(f"n_random must be an int >= 0, got {self.n_random!r}")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {self.max_new_tokens!r}")
        refs = self.reference_texts
        if refs is not None:
            if isinstance(refs, str) or not list(refs):
                raise ValueError("reference_texts must be a non-empty list of strings (plain text, no chat template)")
            object.__setattr__(self, "reference_texts", tuple(refs))


MOVED = {**{k: f"runtime=interp.Runtime({k}=...)" for k in ("batch_size", "seed", "progress")},
         **{k: f"prompts=interp.Prompts(texts, {k}=...)" for k in ("chat", "system")},
         **{k: f"config=steering.SweepConfig({k}=...)" for k in ("n_random", "make_control", "max_new_tokens", "cost",
                                                                 "reference_texts")},
         **{k: f"config=steering.SweepConfig(sampling=steering.Sampling({k}=...))"
            for k in ("do_sample", "temperature", "top_p", "top_k", "stop_at_eos")}}
"""The keywords :func:`alpha_sweep` took before its value types, and where each went."""


def _check_sweep(on: str, alphas: Sequence[float]) -> list[float]:
    if on not in ON:
        raise ValueError(f"on must be one of {ON}: 'text' for a metric of generated texts (e.g. "
                         f"interp.evals.refusal_rate), 'logits' for a metric of last-token logits; got {on!r}")
    alpha_list = [check_finite(a, "alpha") for a in alphas]
    if not alpha_list:
        raise ValueError("alphas is empty; give e.g. [0, 0.25, 0.5, 1]")
    return alpha_list


@moved_keywords(MOVED)
def alpha_sweep(model: Model, prompts: Prompts | Sequence[str], make_intervention: Callable[[float], Any],
                alphas: Sequence[float], metric: Callable[[Any], Any], on: str = "text",
                config: SweepConfig | None = None, runtime: Runtime | None = None) -> AlphaSweep:
    """``metric`` at each alpha for ``make_intervention(alpha)``, for ``config.n_random`` same-strength random
    controls, and with no intervention.

    ``on="text"``: ``metric(texts: list[str])`` over generations (:func:`steering.generate`, ``config.sampling``;
    greedy by default); ``on="logits"``: ``metric(logits [n_prompts, vocab])``. ``config.cost``: also measure, for
    every edit, the mean KL(steered || unsteered) of the prompts' next-token distributions and, with
    ``config.reference_texts``, their cross-entropy under the edit. ``runtime``: batch size, the first random
    control's seed (then seed + 1, ...), progress.
    """
    cfg, rt = config if config is not None else SweepConfig(), Runtime.of(runtime)
    alpha_list = _check_sweep(on, alphas)
    given = Prompts.of(prompts)
    run, prompt_batches = _evaluator(model, given, metric, on, cfg, rt.batch_size)
    coster, base_ce = _coster(model, prompt_batches, cfg.reference_texts, rt.batch_size) if cfg.cost else (
        None, math.nan)
    seeds = [rt.seed + j for j in range(cfg.n_random)]
    vals = _run_sweep(model, make_intervention, alpha_list, cfg, seeds, run, coster, rt.progress)
    baseline = float(vals[0, 0, 0])
    vals = vals[:, 1:]
    cost, has_ce = cfg.cost, cfg.cost and cfg.reference_texts is not None
    return AlphaSweep(alpha_list, vals[0, :, 0].float(), vals[1:, :, 0].float(), baseline,
                      getattr(metric, "__name__", type(metric).__name__), on, len(given), model.name, seeds,
                      _describe(make_intervention(alpha_list[-1])),
                      kl=vals[0, :, 1].float() if cost else None, random_kl=vals[1:, :, 1].float() if cost else None,
                      ce=vals[0, :, 2].float() if has_ce else None, random_ce=vals[1:, :, 2].float() if has_ce else None,
                      baseline_ce=base_ce if has_ce else None)


def _run_sweep(model: Model, make_intervention: Callable[[float], Any], alpha_list: list[float], cfg: SweepConfig,
               seeds: list[int], run: Callable[[tuple], float], coster: Any, progress: bool) -> torch.Tensor:
    """``[1 + n_random, 1 + n_alphas, 3]`` (value, kl, ce): column 0 holds the baseline at ``[0, 0, 0]``."""
    vals = torch.full((1 + cfg.n_random, 1 + len(alpha_list), 3), math.nan, dtype=torch.float64)
    bar = tqdm(total=1 + len(alpha_list) * (1 + cfg.n_random), desc="alpha sweep", disable=not progress, leave=False)
    try:
        vals[0, 0, 0] = run(())
        bar.update()
        for i, a in enumerate(alpha_list, start=1):
            for row in range(1 + cfg.n_random):
                iv = make_intervention(a) if row == 0 else _control(make_intervention, cfg.make_control, model, a,
                                                                    seeds[row - 1])
                vals[row, i, 0] = run((iv,))
                if coster is not None:
                    vals[row, i, 1:] = torch.tensor(coster((iv,)), dtype=torch.float64)
                bar.update()
    finally:
        bar.close()
    return vals


def _describe(iv: Any) -> str:
    """A short label for an intervention (its class, layers, sites and unit; no tensors)."""
    parts = [f"{k}={getattr(iv, k)!r}" for k in ("layers", "sites", "unit") if hasattr(iv, k)]
    return f"{type(iv).__name__}({', '.join(parts)})"


__all__ = ["AlphaSweep", "SweepConfig", "alpha_sweep", "logits_under"]
