"""Restricted updates for non-English safety: fine-tune only the components a study found (the safety pathway's
attention / MLP writers, :meth:`interp.studies.multilingual.pathways.Pathways.top_components`, through a LoRA on those
modules alone; or the safety neurons, :func:`interp.studies.multilingual.neurons.language_neurons`, through their own
weight rows and columns) and compare with the same update on a random set of the same size.

Training data, from the parallel set's **train** ids in the non-source languages: each harmful request paired
with a refusal written in its language (:data:`interp.studies.multilingual.data.REFUSALS`), each harmless request
paired with the model's own greedy answer before the update (answers the judge reads as refusals, or that
degenerate, are dropped), so the update teaches refusal and keeps what the model already does. Every condition
(before, the found set, each random set) is measured on the **test** ids of every language, harmful and harmless:
refusal with Wilson intervals, and degenerate answers. The found components must have been chosen without the
test ids (the pathway sweep on ``val``; neurons on train and val). The random controls are matched in size: a
random component set has the same parts (an attention block for an attention block, an MLP for an MLP) at other
layers, so the LoRA has the same number of parameters; a random neuron set has as many neurons from the found
neurons' layers.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from interp.bundle import Result
from interp.evals.controls import matched_random
from interp.evals.judge_languages import is_degenerate, is_refusal_multilingual
from interp.evals.rates import fisher_greater
from interp.models import Model
from interp.patching.neurons import random_neurons
from interp.studies.kit.runs import base_answers, fresh_tune, is_peft
from interp.studies.multilingual.data import REFUSALS, ParallelSafety
from interp.studies.multilingual.retention import judged_rates
from interp.tune import TuneConfig
from interp.tune.config import PARTS, component_targets
from interp.values import Runtime

KINDS = ("pathway", "neurons")


@dataclass(frozen=True)
class UpdateConfig:
    """The fine-tune (``steps`` of ``batch_size`` pairs at ``lr``, linear decay; LoRA ``rank`` for components;
    neuron updates train the neurons' full rows and columns at ``neuron_lr``), ``n_random`` random sets of the
    same size, ``train_langs`` (None: every language but the source), the harmless answers' length
    (``answer_tokens``) and the judged generations' (``max_new_tokens``)."""

    steps: int = 40
    batch_size: int = 8
    lr: float = 1e-3
    neuron_lr: float = 1e-3
    rank: int = 8
    n_random: int = 1
    train_langs: tuple[str, ...] | None = None
    answer_tokens: int = 48
    max_new_tokens: int = 32
    gen_batch_size: int = 32
    seed: int = 0


@dataclass
class RestrictedUpdate(Result):
    """What :func:`restricted_update` measured: ``rates`` (one row per condition x language x set; conditions
    ``before``, ``found``, ``random 1`` ...), the ``units`` trained in each condition, ``training`` (trainable
    entries, first / last loss, wall time per condition), the training pairs' counts and ``notes``."""

    kind: str
    config: UpdateConfig
    langs: list[str]
    train_langs: list[str]
    units: dict[str, list]
    rates: list[dict[str, Any]]
    training: dict[str, dict[str, Any]]
    n_pairs: dict[str, int]
    generations: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pairs: tuple[list[str], list[str]] = ((), ())   # type: ignore[assignment]

    @property
    def conditions(self) -> list[str]:
        return ["before", *self.units]

    def rate(self, condition: str, lang: str, kind: str = "harmful") -> dict[str, Any]:
        for r in self.rates:
            if (r["condition"], r["lang"], r["set"]) == (condition, lang, kind):
                return r
        raise KeyError(f"no rate for {condition}/{lang}/{kind}; conditions are {self.conditions}")

    def pooled(self, condition: str, kind: str = "harmful", langs: Sequence[str] | None = None) -> tuple[int, int]:
        """Refused and total over ``langs`` (default: the train languages)."""
        rows = [self.rate(condition, lang, kind) for lang in (langs or self.train_langs)]
        return sum(r["k"] for r in rows), sum(r["n"] for r in rows)

    def to_frame(self) -> pd.DataFrame:
        """One row per condition x language x set: the judged refusal rate with its interval."""
        return pd.DataFrame(self.rates)

    def plot(self) -> Any:
        """Refusal rate per language, one bar per set/condition, with Wilson intervals."""
        from interp.viz.multilingual import rates_by_language

        return rates_by_language(self.rates, title=f"refusal by language after a {self.kind}-restricted update")

    def summary(self) -> dict[str, Any]:
        """Headline numbers per condition: pooled harmful and harmless refusals over the train languages."""
        out: dict[str, Any] = {"kind": self.kind, "train_langs": list(self.train_langs)}
        for cond in self.conditions:
            (hk, hn), (sk, sn) = self.pooled(cond), self.pooled(cond, "harmless")
            out[cond] = {"harmful": hk / hn if hn else float("nan"), "harmless": sk / sn if sn else float("nan")}
        return out

    def report(self) -> str:
        """The rates per condition and language as text, with the training figures and the notes."""
        head = (f"{self.kind}-restricted update on {', '.join(self.train_langs)} ({self.n_pairs['harmful']} harmful + "
                f"{self.n_pairs['harmless']} harmless train pairs, {self.config.steps} steps); refusal on test ids")
        lines = [head]
        for cond in self.conditions:
            t = self.training.get(cond, {})
            h, s = self.pooled(cond), self.pooled(cond, "harmless")
            extra = f"  ({t['trainable']} trainable entries, loss {t['loss_first']:.3f} -> {t['loss_last']:.3f})" if t else ""
            lines.append(f"  {cond}: " + "  ".join(f"{lang} {self.rate(cond, lang)['rate']:.0%}/"
                                                  f"{self.rate(cond, lang, 'harmless')['rate']:.0%}"
                                                  for lang in self.langs)
                         + f"  | pooled harmful {h[0]}/{h[1]}, harmless {s[0]}/{s[1]}{extra}")
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "config": asdict(self.config), "langs": self.langs, "train_langs": self.train_langs,
                "units": {k: [list(u) for u in v] for k, v in self.units.items()}, "rates": self.rates,
                "training": self.training, "n_pairs": self.n_pairs, "notes": self.notes}


def random_components(found: Sequence[tuple[int, str]], n_layers: int, seed: int) -> list[tuple[int, str]]:
    """As many components as ``found`` with the same parts, each at a layer none of ``found`` holds that part at."""
    try:
        drawn = matched_random(list(found), lambda c: [(layer, c[1]) for layer in range(n_layers)], seed,
                               what="component")
    except ValueError as e:
        raise ValueError(f"{e} (too few other layers hold that part): a random set of the same size cannot be "
                         "drawn") from None
    return sorted(drawn, key=lambda c: (PARTS.index(c[1]), c[0]))


def update_pairs(model: Model, data: ParallelSafety, langs: Sequence[str], config: UpdateConfig,
                 judge: Callable[[str], bool], refusals: dict[str, Sequence[str]] = REFUSALS
                 ) -> tuple[list[str], list[str], dict[str, int]]:
    """The training pairs of the module docstring and their counts (harmless pairs kept and dropped)."""
    rng = random.Random(config.seed)
    eos = model.tokenizer.eos_token or ""
    prompts, responses, refused, degenerate = [], [], 0, 0
    n_harmful = 0
    for lang in langs:
        for p in data.get("harmful", "train", lang):
            prompts.append(p)
            responses.append(rng.choice(list(refusals[lang])) + eos)
            n_harmful += 1
    harmless = [p for lang in langs for p in data.get("harmless", "train", lang)]
    ps, rs = base_answers(model, harmless, config.answer_tokens, batch_size=config.gen_batch_size)
    n_harmless = 0
    for p, r in zip(ps, rs):
        said_no = bool(judge(r))
        if said_no or is_degenerate(r.removesuffix(eos)):
            refused, degenerate = refused + said_no, degenerate + (not said_no)
            continue
        prompts.append(p)
        responses.append(r)
        n_harmless += 1
    return prompts, responses, {"harmful": n_harmful, "harmless": n_harmless, "harmless_dropped": refused + degenerate,
                                "harmless_refused": refused, "harmless_degenerate": degenerate,
                                "harmless_unanswered": len(harmless) - len(ps)}


def _tune_config(model: Model, kind: str, units: list, config: UpdateConfig) -> TuneConfig:
    common = dict(steps=config.steps, batch_size=config.batch_size, seed=config.seed, warmup=min(4, config.steps))
    if kind == "pathway":
        return TuneConfig(method="lora", rank=config.rank, alpha=2 * config.rank,
                          targets=component_targets(model, units), lr=config.lr, **common)
    return TuneConfig(method="neurons", neurons=tuple(tuple(u) for u in units), lr=config.neuron_lr, **common)


def _measure(model: Model, data: ParallelSafety, condition: str, config: UpdateConfig, judge: Callable[[str], bool]
             ) -> tuple[list[dict], list[dict]]:
    groups = [({"condition": condition, "lang": lang, "set": kind}, data.get(kind, "test", lang))
              for lang in data.langs for kind in ("harmful", "harmless")]
    rates, gens = judged_rates(model, groups, (), judge, config.max_new_tokens,
                               Runtime(batch_size=config.gen_batch_size, progress=False))
    return rates, gens


def _check(model: Model, data: ParallelSafety, kind: str, units: list, langs: list[str], refusals: dict) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if is_peft(model):
        raise ValueError("the update starts from a plain model; load the organism merged "
                         "(load_model('gemma3-aligned') merges its adapter) or merge with interp.models.with_adapter")
    if not units:
        raise ValueError(f"no {kind} units given; pass the found components [(layer, 'attn'|'mlp'), ...] or neurons "
                         f"[(layer, index), ...]")
    bad = [lang for lang in langs if lang not in data.langs or lang == data.source]
    if bad:
        raise ValueError(f"train_langs {bad} are not non-source languages of this set ({list(data.langs)}, source "
                         f"{data.source})")
    missing = [lang for lang in langs if not refusals.get(lang)]
    if missing:
        raise ValueError(f"no refusals written for {missing}; pass refusals={{lang: [text, ...]}}")


def restricted_update(model: Model, data: ParallelSafety, kind: str, units: Sequence, config: UpdateConfig = UpdateConfig(),
                      judge: Callable[[str], bool] = is_refusal_multilingual,
                      refusals: dict[str, Sequence[str]] = REFUSALS, before: RestrictedUpdate | None = None
                      ) -> RestrictedUpdate:
    """The study of the module docstring: ``kind`` ``"pathway"`` (``units`` = components ``(layer, part)``) or
    ``"neurons"`` (``units`` = neurons ``(layer, index)``); ``model`` is left as it was. ``before``: an earlier
    result on the same model, data and generation settings whose ``before`` measurement (and, for the same train
    languages, answer length and seed, whose training pairs) is reused."""
    units = [tuple(u) for u in units]
    langs = list(config.train_langs) if config.train_langs is not None else [x for x in data.langs if x != data.source]
    _check(model, data, kind, units, langs, refusals)
    if before is not None and (before.train_langs, before.config.answer_tokens, before.config.seed) == (
            langs, config.answer_tokens, config.seed) and before.pairs[0]:
        (prompts, responses), n_pairs = before.pairs, before.n_pairs     # the same pairs: the model's answers reused
    else:
        prompts, responses, n_pairs = update_pairs(model, data, langs, config, judge, refusals)
    sets: dict[str, list] = {"found": units}
    for j in range(config.n_random):
        seed = config.seed + 1 + j
        sets[f"random {j + 1}"] = (random_components(units, model.n_layers, seed) if kind == "pathway" else
                                   random_neurons(units, int(model.d_mlp), len(units), seed))  # type: ignore[arg-type]
    if before is not None:
        if (before.config.max_new_tokens, before.langs) != (config.max_new_tokens, list(data.langs)):
            raise ValueError("before= was measured with other generation settings or languages; measure afresh")
        rates = [r for r in before.rates if r["condition"] == "before"]
        gens = [g for g in before.generations if g["condition"] == "before"]
    else:
        rates, gens = _measure(model, data, "before", config, judge)
    training: dict[str, dict[str, Any]] = {}
    for name, us in sets.items():
        with fresh_tune(model, prompts, responses, _tune_config(model, kind, us, config)) as res:
            training[name] = {"trainable": res.trainable_params, "loss_first": res.losses[0],
                              "loss_last": sum(res.losses[-5:]) / len(res.losses[-5:]), "wall_s": round(res.wall_s, 1)}
            r, g = _measure(res.model, data, name, config, judge)
        rates += r
        gens += g
    out = RestrictedUpdate(kind, config, list(data.langs), langs, sets, rates, training, n_pairs, gens,
                           pairs=(list(prompts), list(responses)))
    out.notes = _notes(out)
    return out


def _notes(res: RestrictedUpdate) -> list[str]:
    notes = [f"{r['condition']} {r['lang']} {r['set']}: {r['degenerate']:.0%} of answers degenerate"
             for r in res.rates if r["degenerate"] > 0.2]
    k0, n0 = res.pooled("before")
    kf, nf = res.pooled("found")
    p_up = fisher_greater(kf, nf, k0, n0)
    if p_up >= 0.05:
        notes.append(f"null: the found-set update does not raise pooled {'/'.join(res.train_langs)} harmful refusal "
                     f"above before ({kf}/{nf} vs {k0}/{n0}, Fisher p = {p_up:.2g})")
    for name in res.units:
        if name == "found":
            continue
        kr, nr = res.pooled(name)
        p = fisher_greater(kf, nf, kr, nr)
        verdict = "beats" if p < 0.05 else "does not beat (a null against this control)"
        notes.append(f"found {verdict} {name}: pooled harmful refusal {kf}/{nf} vs {kr}/{nr} (one-sided Fisher "
                     f"p = {p:.2g}), with {res.training['found']['trainable']} vs {res.training[name]['trainable']} "
                     f"trainable entries")
    randoms = [name for name in res.units if name != "found"]
    if len(randoms) > 1:  # every random set together, and where the found set ranks among them
        pooled = [res.pooled(name) for name in randoms]
        kr, nr = sum(k for k, _ in pooled), sum(n for _, n in pooled)
        above = sum(kf / nf > k / n for k, n in pooled)
        notes.append(f"found vs all {len(randoms)} random sets pooled: {kf}/{nf} vs {kr}/{nr} (one-sided Fisher "
                     f"p = {fisher_greater(kf, nf, kr, nr):.2g}); the found set refuses more than {above} of them")
    s0, m0 = res.pooled("before", "harmless")
    sf, mf = res.pooled("found", "harmless")
    if fisher_greater(sf, mf, s0, m0) < 0.05:
        notes.append(f"cost: the found-set update raises harmless refusal ({sf}/{mf} vs {s0}/{m0} before)")
    return notes


__all__ = ["KINDS", "RestrictedUpdate", "UpdateConfig", "random_components", "restricted_update", "update_pairs"]
