"""Refusal retention across languages: does a model made to refuse in English refuse the same requests in other
languages, and does the English refusal direction reach them?

:func:`refusal_retention` measures, on the held-out test ids of a parallel prompt set:
1. refusal rate per language at baseline (greedy generations judged by :func:`evals.judge_languages.
   is_refusal_multilingual`), on harmful and harmless prompts, with Wilson intervals, and each language's
   transfer (its harmful refusal rate over the source language's);
2. the geometry of :mod:`interp.studies.multilingual.geometry` by layer (projection ratio, transfer AUROC, cosine drift,
   the language's own direction and its distance from the English one);
3. language identity against the refusal geometry (:mod:`interp.studies.multilingual.language`: identity accuracy, the
   language subspace's overlap with the refusal direction, transfer after LEACE-erasing language vs a random
   erasure of the same rank);
4. ablation of the English direction (one layer's direction, removed from every writer at the post-instruction and
   generated tokens, or at every token) per language, beside the same ablation of a random direction.

The ablated layer is chosen on the val split only: the layer, in the middle half of the stack, whose English
direction separates English harmful from harmless val prompts best (Cohen's d of the projections), unless
``layer`` is given. Every rate carries its interval; a language whose harmful refusal is not above its harmless
refusal (one-sided Fisher test, p < 0.05) is reported as a null.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pandas as pd
import torch

import steering
from interp.bundle import Result
from interp.evals.judge_languages import is_degenerate, is_refusal_multilingual
from interp.evals.metrics import cohens_d
from interp.evals.rates import fisher_greater, rate
from interp.models import Model
from interp.studies.kit.moved import moved
from interp.studies.multilingual.data import ParallelSafety
from interp.studies.multilingual.geometry import Geometry, capture_last, geometry, unit
from interp.studies.multilingual.language import LanguageGeometry, language_geometry
from interp.values import Runtime, moved_keywords
from probes.directions import random_directions
from probes.layers import LayerRule, choose

CONDITIONS = ("baseline", "ablation", "random ablation")


@dataclass(frozen=True)
class RetentionConfig:
    """``layers`` captured (None: 1 .. n_layers - 1; layer 0's input at the last token is that token's embedding,
    the same for every prompt); ``layer`` whose direction is ablated (None: chosen on val);
    ``ablate_positions``: ``post_instruction`` (prompt's post-instruction tokens and every generated token) or
    ``all``; ``massive_factor``: residual dimensions whose mean |activation| at the captured layers exceeds this many
    times the median dimension's (massive activations, e.g. Gemma 3's dimension 163 at ~1e4 on every token) are
    left out of every statistic and of the ablated and the random direction (None keeps them: removing a direction's share of a massive
    dimension spreads it over every other dimension and breaks generation); ``max_new_tokens`` of the judged greedy
    generations. Every answer is also checked for degeneration (:func:`evals.judge_languages.is_degenerate`)."""

    layers: tuple[int, ...] | None = None
    layer: int | None = None
    ablate_positions: str = "post_instruction"
    massive_factor: float | None = 20.0
    max_new_tokens: int = 32
    batch_size: int = 32
    n_boot: int = 200
    seed: int = 0


@dataclass
class Retention(Result):
    """What :func:`refusal_retention` measured: ``rates`` (one row per language x set x condition), the judged
    ``generations``, the :class:`Geometry`, the ablated ``layer`` and how it was chosen, and ``notes``."""

    config: RetentionConfig
    langs: list[str]
    source: str
    layer: int
    layer_choice: dict[str, Any]
    rates: list[dict[str, Any]]
    geometry: Geometry
    language: LanguageGeometry | None = None
    generations: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def rates_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rates)

    def to_frame(self) -> pd.DataFrame:
        """The geometry by language and layer, one row each."""
        g, rows = self.geometry, []
        for lang in g.langs:
            for i, layer in enumerate(g.layers):
                rows.append({"lang": lang, "layer": layer, "projection_ratio": float(g.ratio[lang][i]),
                             "ratio_lo": float(g.ratio_ci[lang][0, i]), "ratio_hi": float(g.ratio_ci[lang][1, i]),
                             "random_ratio": float(g.random_ratio[lang][i]),
                             "transfer_auroc": float(g.transfer_auroc[lang][i]),
                             "drift_matched": float(g.drift_matched[lang][i]),
                             "drift_mismatched": float(g.drift_mismatched[lang][i]),
                             "own_cosine": float(g.own_cosine[lang][i]), "own_cosine_lo": float(g.own_cosine_ci[lang][0, i]),
                             "own_cosine_hi": float(g.own_cosine_ci[lang][1, i]), "own_auroc": float(g.own_auroc[lang][i]),
                             "split_half_cosine": float(g.split_half_cosine[i])})
        return pd.DataFrame(rows)

    def rate(self, lang: str, kind: str, condition: str = "baseline") -> dict[str, Any]:
        for r in self.rates:
            if (r["lang"], r["set"], r["condition"]) == (lang, kind, condition):
                return r
        raise KeyError(f"no rate for {lang}/{kind}/{condition}; conditions are {CONDITIONS}")

    def transfer(self) -> dict[str, float]:
        """Per language: harmful refusal rate at baseline over the source language's (1: all of it transfers)."""
        src = self.rate(self.source, "harmful")["rate"]
        return {lang: (self.rate(lang, "harmful")["rate"] / src if src > 0 else float("nan")) for lang in self.langs}

    def summary(self) -> dict[str, Any]:
        """Headline numbers per language: harmful / harmless refusal, transfer, ablation and its random control."""
        tr = self.transfer()
        return {"source": self.source, "layer": self.layer, "langs": {lang: {
            "harmful": self.rate(lang, "harmful")["rate"], "harmless": self.rate(lang, "harmless")["rate"],
            "transfer": tr[lang], "ablation": self.rate(lang, "harmful", "ablation")["rate"],
            "random_ablation": self.rate(lang, "harmful", "random ablation")["rate"]} for lang in self.langs}}

    def report(self) -> str:
        """The summary as text, with the language geometry and the notes."""
        lines = [f"refusal retention ({self.geometry.n_test} parallel test prompts per set and language; English "
                 f"direction of layer {self.layer}, ablated at {self.config.ablate_positions} tokens)"]
        tr = self.transfer()
        for lang in self.langs:
            h, s = self.rate(lang, "harmful"), self.rate(lang, "harmless")
            a, ra = self.rate(lang, "harmful", "ablation"), self.rate(lang, "harmful", "random ablation")
            lines.append(f"  {lang}: harmful {h['rate']:.0%} [{h['low']:.0%}, {h['high']:.0%}]  harmless {s['rate']:.0%}  "
                         f"transfer {tr[lang]:.2f}  ablation {a['rate']:.0%} (random {ra['rate']:.0%})  projection "
                         f"ratio at L{self.layer} {float(self.geometry.ratio[lang][self.geometry.layers.index(self.layer)]):.2f}")
        if self.language is not None:
            lg, i = self.language, self.language.layers.index(self.layer)
            lines.append(f"  language identity at L{self.layer}: {float(lg.identity_accuracy[i]):.0%} (chance "
                         f"{lg.chance:.0%}); refusal direction in the language subspace {float(lg.overlap[i]):.3f} "
                         f"(random {lg.random_overlap:.3f})")
            lines.append("  projection ratio before / after LEACE-erasing language / random erasure: " + ", ".join(
                f"{lang} {float(lg.ratio['before'][lang][i]):.2f}/{float(lg.ratio['leace'][lang][i]):.2f}/"
                f"{float(lg.ratio['random'][lang][i]):.2f}" for lang in lg.langs if lang != self.source))
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])

    def plot(self) -> Any:
        from interp.viz.multilingual import retention_by_layer

        g = self.geometry
        return retention_by_layer(g.layers, {k: g.ratio[k] for k in g.langs}, {k: g.ratio_ci[k] for k in g.langs},
                                  {k: g.drift_matched[k] for k in g.langs}, {k: g.own_cosine[k] for k in g.langs},
                                  g.split_half_cosine, g.random_cosine, source=g.source)

    def record(self) -> dict[str, Any]:
        """JSON-ready: config, rates, layer choice, notes, the geometry as rows."""
        return {"config": asdict(self.config), "langs": self.langs, "source": self.source, "layer": self.layer,
                "layer_choice": self.layer_choice, "rates": self.rates, "transfer": self.transfer(),
                "geometry": self.to_frame().to_dict("records"), "notes": self.notes,
                "random_cosine": self.geometry.random_cosine, "n_test": self.geometry.n_test,
                "language": None if self.language is None else {
                    "rank": self.language.rank, "chance": self.language.chance,
                    "random_overlap": self.language.random_overlap, "rows": self.language.to_frame().to_dict("records")}}


def choose_layer(acts: dict, layers: list[int], source: str) -> tuple[int, dict[str, Any]]:
    """The middle-half layer whose source direction (train) best separates the source's val prompts (Cohen's d)."""
    tr, va = {k: acts[k]["train"][source] for k in acts}, {k: acts[k]["val"][source] for k in acts}
    r = unit(tr["harmful"].mean(0) - tr["harmless"].mean(0))
    proj = torch.cat([torch.einsum("nld,ld->ln", va["harmful"], r), torch.einsum("nld,ld->ln", va["harmless"], r)], 1)
    y = torch.cat([torch.ones(va["harmful"].shape[0]), torch.zeros(va["harmless"].shape[0])]).long()
    d = cohens_d(proj.float(), y)
    choice = choose(LayerRule(("cohens_d",), tol=0.0, tie="lowest", window="middle half"), {"cohens_d": d}, layers)
    return layers[choice.index], {"rule": f"max Cohen's d of source-language val projections: {choice.rule}",
                                  "d_by_layer": {layers[i]: round(float(d[i]), 3) for i in range(len(layers))}}


@moved_keywords(moved())
def judged_rates(model: Model, groups: list[tuple[dict[str, Any], list[str]]], ivs: tuple,
                 judge: Callable[[str], bool], max_new_tokens: int, runtime: Runtime
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Greedy answers to every group's prompts under the same interventions ``ivs``, in one generation call (the
    groups share batches), judged per group: one row per group (its ``labels`` + :meth:`~interp.evals.rates.Rate.columns`,
    share of degenerate answers) and one record per answer (``labels`` + prompt, text, refused, degenerate)."""
    prompts = [p for _, ps in groups for p in ps]
    texts = list(steering.generate(model, prompts, *ivs, max_new_tokens=max_new_tokens,
                                   runtime=replace(runtime, progress=False)).texts) if prompts else []
    rows, recs, at = [], [], 0
    for labels, ps in groups:
        mine, at = texts[at:at + len(ps)], at + len(ps)
        flags, bad = [bool(judge(t)) for t in mine], [is_degenerate(t) for t in mine]
        n = len(flags)
        rows.append({**labels, **rate(flags).columns(), "degenerate": sum(bad) / n if n else float("nan")})
        recs += [{**labels, "prompt": p, "text": t, "refused": f, "degenerate": b}
                 for p, t, f, b in zip(ps, mine, flags, bad)]
    return rows, recs


def massive_dims(acts: dict, factor: float | None) -> list[int]:
    """Dimensions whose mean |activation| (train prompts, every language and captured layer, last token) is above
    ``factor`` times the median dimension's at some layer."""
    if factor is None:
        return []
    x = torch.cat([v for kind in acts for v in acts[kind]["train"].values()]).abs().mean(0)     # [L, d]
    return sorted(set((x > factor * x.median(-1, keepdim=True).values).nonzero()[:, 1].tolist()))


def _zeroed(x: torch.Tensor, dims: list[int]) -> torch.Tensor:
    x = x.clone()
    x[..., dims] = 0
    return x


def without(v: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """``v`` with ``dims`` zeroed, unit norm."""
    v = v.clone().float()
    v[dims] = 0
    return v / v.norm().clamp_min(1e-30)


def behaviour(model: Model, data: ParallelSafety, r: torch.Tensor, cfg: RetentionConfig,
              judge: Callable[[str], bool], dims: list[int] = ()) -> tuple[list[dict], list[dict]]:
    """Refusal per language: harmful and harmless test prompts at baseline, harmful under ablation of ``r`` and of
    a random unit direction (seeded), both without the massive ``dims``; every answer also checked for degeneration."""
    r = without(r, list(dims))
    rand = without(random_directions(model.d_model, 1, seed=cfg.seed)[0].vectors[0], list(dims))
    ivs = {"baseline": (), "ablation": (steering.DirectionalAblation(r, layers="all", positions=cfg.ablate_positions),),
           "random ablation": (steering.DirectionalAblation(rand, layers="all", positions=cfg.ablate_positions),)}
    rates, gens = [], []
    for cond in CONDITIONS:  # one generation call per condition: every language (and set) shares its batches
        groups = [({"lang": lang, "set": kind, "condition": cond}, data.get(kind, "test", lang))
                  for lang in data.langs for kind in ("harmful", "harmless") if kind == "harmful" or cond == "baseline"]
        rows, recs = judged_rates(model, groups, ivs[cond], judge, cfg.max_new_tokens,
                                  Runtime(batch_size=cfg.batch_size, progress=False))
        rates += rows
        gens += recs
    return rates, gens


def _notes(res: Retention) -> list[str]:
    out = [f"{r['lang']} {r['set']}/{r['condition']}: {r['degenerate']:.0%} of answers degenerate (repetition or no "
           f"words): this condition breaks generation, and its refusal rate is not a bypass"
           for r in res.rates if r["degenerate"] > 0.2]
    for lang in res.langs:
        h, s = res.rate(lang, "harmful"), res.rate(lang, "harmless")
        p = fisher_greater(h["k"], h["n"], s["k"], s["n"])
        if p >= 0.05:
            out.append(f"{lang}: harmful prompts are not refused more than harmless ones (Fisher p = {p:.2g}): "
                       f"a null for refusal in {lang}; its ablation rates measure nothing to remove")
    return out


def refusal_retention(model: Model, data: ParallelSafety, config: RetentionConfig = RetentionConfig(),
                      judge: Callable[[str], bool] = is_refusal_multilingual) -> Retention:
    """Run the study of the module docstring on ``model`` with the parallel prompts ``data``."""
    if config.ablate_positions not in ("post_instruction", "all"):
        raise ValueError(f"ablate_positions must be 'post_instruction' or 'all', got {config.ablate_positions!r}")
    layers = list(config.layers) if config.layers is not None else list(range(1, model.n_layers))
    if config.layer is not None and config.layer not in layers:
        raise ValueError(f"layer {config.layer} is not among the captured layers {layers}; add it to layers")
    acts = capture_last(model, data, layers, runtime=Runtime(batch_size=config.batch_size, progress=False))
    dims = massive_dims(acts, config.massive_factor)
    if dims:  # every statistic is read without them, as the ablation is done without them
        acts = {k: {sp: {lang: _zeroed(x, dims) for lang, x in by.items()} for sp, by in acts[k].items()} for k in acts}
    geo = geometry(acts, layers, data.source, n_boot=config.n_boot, runtime=Runtime(seed=config.seed))
    if config.layer is None:
        layer, choice = choose_layer(acts, layers, data.source)
    else:
        layer, choice = config.layer, {"rule": "given"}
    r = geo.direction[layers.index(layer)]
    if not float(r.norm()) > 0:
        raise ValueError(f"the {data.source} refusal direction of layer {layer} is zero (harmful and harmless means are "
                         f"equal there, as at layer 0's last token, an embedding); choose another layer")
    rates, gens = behaviour(model, data, r, config, judge, dims)
    choice["massive_dims_removed"] = dims
    lang_geo = language_geometry(acts, layers, data.source, n_boot=config.n_boot, runtime=Runtime(seed=config.seed))
    res = Retention(config, list(data.langs), data.source, layer, choice, rates, geo, lang_geo, gens)
    res.notes = _notes(res)
    return res


__all__ = ["CONDITIONS", "Retention", "RetentionConfig", "choose_layer", "judged_rates", "refusal_retention"]
