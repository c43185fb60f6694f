"""Causal test of a bias direction: on questions where the cue moves the model's forced-choice answer to the cued
option, subtract the direction (in residual-norm units, over a band of middle layers) and count how often the
model returns to its own uncued answer, against same-norm random directions.

    res = bias_causal_test(model, fam, items, "suggested", band=[10, 12, 14], alpha=0.5, n_random=3)
    res.summary(); res.to_frame(); res.plot()
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

import steering
from interp.bundle import Result
from interp.evals.choice import chosen, letter_ids
from interp.evals.rates import fisher_greater, rate
from interp.models import Model
from interp.readout import logits
from interp.studies.directions.biases import BIAS_MOVED, BiasConfig, BiasFamily
from interp.studies.directions.biases_items import BiasItem
from interp.values import Prompts, moved_keywords

if TYPE_CHECKING:
    import pandas as pd


@moved_keywords({"chat": "prompts=interp.Prompts(texts, chat=...)"})
def choose_options(model: Model, prompts: Prompts | Sequence[str], letters: Sequence[str],
                   batch_size: int = 16) -> torch.Tensor:
    """The option each prompt's next-token logits prefer (formatted as ``Prompts.chat`` / ``system`` say): ``[n]``
    indices into ``letters`` (each option scored over its single-token spellings, :func:`evals.choice.chosen`).
    Runs inside any ``steering.apply`` block around it."""
    ids = letter_ids(model.tokenizer, letters)
    p = Prompts.of(prompts)
    return chosen(logits(model, list(p.texts), chat=p.chat, system=p.system, batch_size=batch_size), ids)


@dataclass
class BiasCausal(Result):
    """Recovery of the uncued answer when the bias direction is subtracted, on the ``n_flipped`` items the cue
    moved (of ``n_items``), vs ``n_random`` same-norm random directions; ``p_value``: one-sided Fisher test that
    the direction recovers more often than the pooled random controls. A null (nothing flipped) has ``n_flipped=0``."""

    bias: str
    band: list[int]
    alpha: float
    n_items: int
    n_flipped: int
    recovered: list[bool] = field(default_factory=list)
    random_recovered: list[list[bool]] = field(default_factory=list)
    still_cued: list[bool] = field(default_factory=list)
    flipped_ids: list[str] = field(default_factory=list)
    added_norms: dict[int, float] = field(default_factory=dict)
    model_id: str = ""

    @property
    def direction_rate(self) -> dict[str, Any]:
        return rate(self.recovered)

    @property
    def random_rate(self) -> dict[str, Any]:
        return rate([f for seed in self.random_recovered for f in seed])

    @property
    def p_value(self) -> float:
        d, r = self.direction_rate, self.random_rate
        return float("nan") if not d["n"] or not r["n"] else fisher_greater(d["k"], d["n"], r["k"], r["n"])

    @property
    def null(self) -> bool:
        """No evidence the direction is causal: nothing flipped, or Fisher's test against random does not reach 0.05."""
        return not self.n_flipped or not self.p_value < 0.05

    def summary(self) -> dict[str, Any]:
        d, r = self.direction_rate, self.random_rate
        return {"bias": self.bias, "band": self.band, "alpha": self.alpha, "n_items": self.n_items,
                "n_flipped": self.n_flipped, "recovery": d["rate"], "recovery_ci95": d["ci95"],
                "random_recovery": r["rate"], "random_ci95": r["ci95"], "n_random_seeds": len(self.random_recovered),
                "still_cued": rate(self.still_cued)["rate"], "fisher_p": self.p_value, "null": self.null,
                "added_norm": {k: round(v, 2) for k, v in self.added_norms.items()}}

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        rows = [{"condition": "bias direction", "seed": None, **rate(self.recovered)}]
        rows += [{"condition": "random", "seed": s, **rate(f)} for s, f in enumerate(self.random_recovered)]
        df = pd.DataFrame(rows)
        df["bias"], df["n_flipped"], df["alpha"] = self.bias, self.n_flipped, self.alpha
        return df

    def plot(self, title: str | None = None) -> Any:
        from interp.viz.directions_biases import recovery_bars

        return recovery_bars({self.bias: (self.direction_rate, self.random_rate)},
                             title=title or f"recovery of the uncued answer, direction vs random ({self.model_id})")


@moved_keywords(BIAS_MOVED)
def answer_table(model: Model, items: Sequence[BiasItem], config: BiasConfig | None = None) -> dict[str, int]:
    """The forced-choice answer (index into the labels) of every distinct uncued and cued prompt, each run once
    (``config.chat``, ``config.batch_size``); pass it to :func:`bias_causal_test` (``answers=``) to share the passes
    between biases."""
    cfg = config or BiasConfig()
    out: dict[str, int] = {}
    by_labels: dict[tuple[str, ...], list[str]] = {}
    for i in items:
        by_labels.setdefault(i.letters, []).extend([i.uncued, i.cued])
    for letters, prompts in by_labels.items():
        prompts = list(dict.fromkeys(prompts))
        got = choose_options(model, Prompts(prompts, chat=cfg.chat), letters, cfg.batch_size)
        out.update(zip(prompts, got.tolist(), strict=True))
    return out


def flip_counts(items: Sequence[BiasItem], answers: dict[str, int]) -> dict[str, dict[str, int]]:
    """Per bias: ``n`` items, ``changed`` (cued answer differs from uncued), ``to_cued`` (moved to the cued option:
    the items a causal test uses), ``correct_uncued`` (uncued answer is the right one)."""
    out: dict[str, dict[str, int]] = {}
    for i in items:
        u, c, k = answers[i.uncued], answers[i.cued], i.letters.index(i.cued_option)
        row = out.setdefault(i.bias, {"n": 0, "changed": 0, "to_cued": 0, "correct_uncued": 0})
        row["n"] += 1
        row["changed"] += int(u != c)
        row["to_cued"] += int(c == k and u != k)
        row["correct_uncued"] += int(u == i.letters.index(i.correct))
    return out


def _flipped(model: Model, its: list[BiasItem], cfg: BiasConfig, answers: dict[str, int] | None) -> tuple[list[BiasItem], torch.Tensor]:
    """Items whose cued answer is the cued option and differs from the uncued answer, with their uncued answers."""
    letters = its[0].letters
    if any(i.letters != letters for i in its):
        raise ValueError("the items of one bias must share their option labels")
    if answers is None or any(p not in answers for i in its for p in (i.uncued, i.cued)):
        answers = answer_table(model, its, cfg)
    un = torch.tensor([answers[i.uncued] for i in its])
    cu = torch.tensor([answers[i.cued] for i in its])
    cued = torch.tensor([letters.index(i.cued_option) for i in its])
    keep = ((cu == cued) & (un != cued)).nonzero().flatten().tolist()
    return [its[k] for k in keep], un[keep]


def _intervention(fam: BiasFamily, bias: str, band: list[int], alpha: float, norms: Any) -> steering.AddVector:
    d = fam.direction(bias)
    return steering.AddVector({layer: d.at(layer) for layer in band}, layers=band, alpha=-abs(alpha), unit="residual",
                              norms=norms)


@moved_keywords(BIAS_MOVED)
def bias_causal_test(model: Model, family: BiasFamily, items: Sequence[BiasItem], bias: str,
                     band: Sequence[int] | None = None, alpha: float = 0.5, answers: dict[str, int] | None = None,
                     config: BiasConfig | None = None) -> BiasCausal:
    """Steer against ``bias``'s direction on the items the cue flips (at most ``config.max_items``) and measure
    recovery against ``config.n_random`` random directions (``config.chat``, ``config.batch_size``).

    ``band``: layers to steer (default the three captured layers around the bias's chosen layer); ``alpha``: the
    fraction of the mean residual norm (measured on the flipped cued prompts at ``band``) subtracted per layer;
    ``answers``: an :func:`answer_table` to reuse (else the unsteered answers are computed here).
    """
    if bias not in family.probes:
        raise ValueError(f"bias {bias!r} is not in the family (it has {family.biases})")
    cfg = config or BiasConfig()
    n_random, max_items, chat, batch_size = cfg.n_random, cfg.max_items, cfg.chat, cfg.batch_size
    its = [i for i in items if i.bias == bias]
    if not its:
        raise ValueError(f"no items of bias {bias!r}")
    layers = family.direction(bias).layers
    j = family.probes[bias].best
    band = list(band) if band is not None else [int(x) for x in layers[max(0, j - 1):j + 2]]
    missing = [layer for layer in band if layer not in layers]
    if missing or not band:
        raise ValueError(f"band layers {missing or band} were not captured (the family has {layers}); steer at "
                         f"captured layers")
    flipped, ref = _flipped(model, its, cfg, answers)
    flipped, ref = flipped[:max_items], ref[:max_items]
    res = BiasCausal(bias=bias, band=band, alpha=float(alpha), n_items=len(its), n_flipped=len(flipped),
                     flipped_ids=[i.id for i in flipped], model_id=model.name)
    if not flipped:
        return res
    prompts, letters = Prompts([i.cued for i in flipped], chat=chat), flipped[0].letters
    norms = steering.residual_norms(model, Prompts(list(prompts.texts[:16]), chat=chat), layers=band)
    iv = _intervention(family, bias, band, alpha, norms)
    res.added_norms = iv.added_norms(model)
    cued = torch.tensor([letters.index(i.cued_option) for i in flipped])
    with steering.apply(model, iv):
        out = choose_options(model, prompts, letters, batch_size)
    res.recovered, res.still_cued = (out == ref).tolist(), (out == cued).tolist()
    for seed in range(n_random):
        with steering.apply(model, iv.random_like(model, seed=seed)):
            res.random_recovered.append((choose_options(model, prompts, letters, batch_size) == ref).tolist())
    return res


__all__ = ["answer_table", "bias_causal_test", "BiasCausal", "choose_options", "flip_counts"]
