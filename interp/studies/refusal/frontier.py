"""The refusal-vs-damage frontier (issue 36): search the abliteration families' parameters for the trade-off between
removing refusal and damaging the model, instead of taking the first candidate that passes the paper's filters.

Screen: Optuna's seeded multi-objective sampler proposes, per writer kind, an :class:`steering.AblationKernel`, a float
direction index over the job's difference-of-means candidates (one post-instruction position), orthogonalisation
against the harmless mean, and a variant (ablation to 0, to the harmless mean's level, or norm-preserving); each trial
costs one forward over a few validation prompts: mean first-token refusal score (harmful) and first-token KL to the
unedited model (harmless). Score: the Pareto-optimal trials again on the whole validation split. Confirm: the front's
points by generation and the judge on the held-out test prompts, with KL / CE, over-refusal and a same-strength random
control each. :func:`choose` picks one point by :data:`RULE`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from time import perf_counter
from typing import Any

import torch

import steering
from interp.capturing import capture
from interp.evals.judge import Judge
from interp.evals.logits import kl_div, refusal_score
from interp.forward import prepare
from interp.models import Model
from interp.studies.kit.prompt_sets import RefusalData
from interp.studies.kit.scoring import prompt_logits
from interp.studies.kit.stages import Candidates
from interp.studies.refusal.evaluation import harmless_kl_ce
from interp.studies.refusal.frontier_result import RULE, FrontierResult, choose, knee_then_spread, pareto
from interp.values import Runtime
from steering.abliteration import AblationKernel, WeightedAblation, direction_at, orthogonalize
from steering.abliteration_norm import NormPreservingAblation

VARIANTS = ("zero", "reference", "norm_preserving")   # ablate to 0, to the harmless mean's level, norm-preserving
SAMPLERS = ("tpe", "nsga2")
SCOPES = ("global", "per_layer")   # one interpolated direction for every layer, or each layer's own (heretic's scopes)
RANGES = ("heretic", "wide")       # heretic 1.4's parameter ranges, or the whole layer stack and weights 0.5-1.5


@dataclass
class FrontierConfig:
    """The search: ``trials`` (Optuna's budget, >= 1), its ``seed`` and ``sampler``; the kernels' peak layers within
    ``position_range`` (``None``: the ``ranges`` rule); ``variants`` and direction ``scopes`` searched; ``ranges``:
    ``"heretic"`` (heretic 1.4's ranges: peak weight 0.8-1.5 at 0.6-1.0 of the layer stack, reaching 1 to 0.6 x the
    stack, direction index 0.4-0.9 of the stack; they came from its authors' experiments on many models) or ``"wide"``
    (peak anywhere, weight 0.5-1.5, any direction); ``n_screen`` validation prompts per class per trial; up to
    ``max_points`` Pareto points confirmed; ``target``: the held-out refusal the rule aims under."""

    trials: int = 48
    seed: int = 0
    sampler: str = "tpe"
    target: float = 0.10
    max_points: int = 4
    n_screen: int = 16
    position_range: tuple[float, float] | None = None
    variants: tuple[str, ...] = VARIANTS
    scopes: tuple[str, ...] = SCOPES
    ranges: str = "heretic"
    writers: tuple[str, ...] = ("attn", "mlp")
    max_new_tokens: int = 24
    batch_size: int = 64

    def __post_init__(self) -> None:
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials < 1:
            raise ValueError(f"the frontier search needs a trial budget of at least 1, got trials={self.trials!r}; "
                             f"give FrontierConfig(trials=N) (--trials N on the command line)")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS} (Optuna's TPE or NSGA-II), got {self.sampler!r}")
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad or not self.variants:
            raise ValueError(f"variants must be a non-empty subset of {VARIANTS}, got {self.variants!r}")
        if not self.scopes or any(x not in SCOPES for x in self.scopes):
            raise ValueError(f"scopes must be a non-empty subset of {SCOPES}, got {self.scopes!r}")
        if self.ranges not in RANGES:
            raise ValueError(f"ranges must be one of {RANGES}, got {self.ranges!r}")
        if not 0 <= self.target <= 1 or self.max_points < 1 or self.n_screen < 1:
            raise ValueError(f"target must be a rate in [0, 1], max_points and n_screen >= 1; got {self.target}, "
                             f"{self.max_points}, {self.n_screen}")

    def layer_range(self, n_layers: int) -> tuple[float, float]:
        """The kernels' peak-layer range, checked against the model's layers (a kernel outside them is refused)."""
        top = float(n_layers - 1)
        lo, hi = self.position_range if self.position_range is not None else \
            ((0.6 * top, top) if self.ranges == "heretic" else (0.0, top))
        if not 0 <= lo <= hi <= n_layers - 1:
            raise ValueError(f"position_range {self.position_range} puts kernels outside the model's {n_layers} layers; "
                             f"give a range within [0, {n_layers - 1}]")
        return float(lo), float(hi)


def index_range(cfg: FrontierConfig, n_rows: int) -> tuple[float, float]:
    """The direction index's range over the candidate rows: heretic's 0.4-0.9 of the stack, shifted one row because
    our candidates sit at each layer's ``resid_pre`` where heretic's sit at its output; or every row."""
    top = float(n_rows - 1)
    if cfg.ranges != "heretic" or n_rows < 3:
        return 0.0, top
    return min(0.4 * top + 1, top), min(0.9 * top + 1, top)


def suggest(trial: Any, cfg: FrontierConfig, n_layers: int, n_rows: int, n_pos: int) -> dict[str, Any]:
    """One trial's parameters: candidate position, direction scope and index (sampled in both scopes, as heretic
    does, since multivariate TPE needs a fixed space), orthogonalisation, variant, a kernel per writer."""
    lo, hi = cfg.layer_range(n_layers)
    heretic = cfg.ranges == "heretic"
    p: dict[str, Any] = {"position": trial.suggest_int("position", 0, n_pos - 1),
                         "scope": trial.suggest_categorical("scope", list(cfg.scopes)),
                         "direction_index": trial.suggest_float("direction_index", *index_range(cfg, n_rows)),
                         "orthogonalize": trial.suggest_categorical("orthogonalize", [False, True]),
                         "variant": trial.suggest_categorical("variant", list(cfg.variants))}
    reach = (1.0 if heretic else 0.5, max(1.0, 0.6 * (n_layers - 1)))
    for w in cfg.writers:
        top = trial.suggest_float(f"{w}.max_weight", 0.8 if heretic else 0.5, 1.5)
        p[w] = {"max_weight": top, "max_weight_position": trial.suggest_float(f"{w}.max_weight_position", lo, hi),
                "min_weight": top * trial.suggest_float(f"{w}.min_weight_fraction", 0.0, 1.0),
                "min_weight_distance": trial.suggest_float(f"{w}.min_weight_distance", *reach)}
    return p


def layer_directions(cand: Candidates, pos: int, orth: bool) -> dict[int, torch.Tensor]:
    """Heretic's per-layer scope: each layer's writers ablate the direction of the residual they write into (the
    next layer's ``resid_pre`` candidate; the last layer keeps the last row), orthogonalised per row if asked."""
    mean = cand.harmless_acts[:, :, pos].float().mean(0)
    out = {}
    for layer, i in written_rows(cand).items():
        r = cand.raw[i, pos].float()
        out[layer] = orthogonalize(r, mean[i]) if orth else r / r.norm()
    return out


def written_rows(cand: Candidates) -> dict[int, int]:
    """``{layer: candidate row}``: the row of the residual each layer's writers write into (the next layer's
    ``resid_pre``; the last layer keeps its own row)."""
    rows = {layer: i for i, layer in enumerate(cand.layers)}
    return {layer: rows.get(layer + 1, rows[layer]) for layer in cand.layers}


def frontier_edit(cand: Candidates, params: dict[str, Any], writers: Sequence[str] = ("attn", "mlp")) -> Any:
    """The edit object of one setting: :class:`steering.WeightedAblation` (to 0 or to the harmless mean's level per
    layer) or :class:`steering.NormPreservingAblation`, along the interpolated (optionally orthogonalised) direction."""
    pos = int(params["position"])
    mean = cand.harmless_acts[:, :, pos].float().mean(0)                 # [rows, d]: harmless mean per candidate layer
    if params.get("scope", "global") == "per_layer":
        r: Any = layer_directions(cand, pos, bool(params["orthogonalize"]))
    else:
        r = direction_at(cand.raw[:, pos].float(), float(params["direction_index"]))
        if params["orthogonalize"]:
            r = orthogonalize(r, mean[min(round(float(params["direction_index"])), len(cand.layers) - 1)])
    kernel = {w: AblationKernel(**params[w]) for w in writers}
    if params["variant"] == "norm_preserving":
        return NormPreservingAblation(r, kernel, tuple(writers))
    own = params.get("scope", "global") == "per_layer"
    ref = None if params["variant"] == "zero" else {
        layer: mean[written_rows(cand)[layer] if own else i] for i, layer in enumerate(cand.layers)}
    return WeightedAblation(r, kernel, tuple(writers), reference=ref)


class Screen:
    """One forward per setting over ``n`` harmful and ``n`` harmless validation prompts (encoded once): the harmful
    prompts' mean first-token refusal score, each prompt's score floored at ``floor`` (the unedited harmless prompts'
    mean score: where refusal is gone), and the harmless prompts' mean first-token KL to the plain model.

    The floor keeps the objective bounded as heretic's refusal count is: an unfloored log-odds keeps paying an edit
    that drives harmful prompts far below harmless ones, which only a destructive edit does (the 40-trial run in
    ``benchmarks/RESULTS_frontier.md`` found such a point at validation score -20.7, KL 13.7)."""

    def __init__(self, model: Model, data: RefusalData, tokens: Sequence[int], n: int | None, batch_size: int):
        self.model, self.tokens, self.bs = model, list(tokens), batch_size
        self.harmful = prepare(model, data.harmful["val"].instructions[:n])[1]
        self.harmless = prepare(model, data.harmless["val"].instructions[:n])[1]
        self.plain = prompt_logits(model, self.harmless, batch_size=batch_size)
        self.baseline = float(refusal_score(prompt_logits(model, self.harmful, batch_size=batch_size),
                                            self.tokens).mean())
        self.floor = float(refusal_score(self.plain, self.tokens).mean())

    def __call__(self, edit: Any) -> tuple[float, float]:
        logits = prompt_logits(self.model, self.harmful + self.harmless, edit, batch_size=self.bs)
        h, s = logits[:len(self.harmful)], logits[len(self.harmful):]
        score = float(refusal_score(h, self.tokens).clamp(min=self.floor).mean())
        kl = float(kl_div(self.plain, s).mean())
        return (score if math.isfinite(score) else math.inf), (kl if math.isfinite(kl) else math.inf)


def search(model: Model, data: RefusalData, cand: Candidates, tokens: Sequence[int], cfg: FrontierConfig
           ) -> tuple[list[dict[str, Any]], float]:
    """Run the seeded Optuna study: every trial's ``{"number", "params", "refusal_score", "kl"}`` and the screen's
    baseline refusal score."""
    import optuna

    cfg.layer_range(model.n_layers)   # refuse a kernel range outside the layers before any pass
    variants = cfg.variants if cand.layers == list(range(model.n_layers)) else tuple(
        v for v in cfg.variants if v != "reference") or ("zero",)
    cfg = replace(cfg, variants=variants)
    screen = Screen(model, data, tokens, cfg.n_screen, cfg.batch_size)
    sampler = (optuna.samplers.TPESampler(seed=cfg.seed, n_startup_trials=min(10, cfg.trials))
               if cfg.sampler == "tpe" else optuna.samplers.NSGAIISampler(seed=cfg.seed))
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials: list[dict[str, Any]] = []

    def objective(trial: Any) -> tuple[float, float]:
        params = suggest(trial, cfg, model.n_layers, len(cand.layers), cand.n_positions)
        score, kl = screen(frontier_edit(cand, params, cfg.writers))
        trials.append({"number": trial.number, "params": params, "refusal_score": score, "kl": kl})
        return score, kl

    try:
        study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
        study.optimize(objective, n_trials=cfg.trials)
    finally:
        optuna.logging.set_verbosity(verbosity)
    return trials, screen.baseline


def rescore(model: Model, data: RefusalData, cand: Candidates, tokens: Sequence[int], trials: list[dict[str, Any]],
            cfg: FrontierConfig) -> list[dict[str, Any]]:
    """The screen's Pareto-optimal trials scored on the whole validation split; up to ``max_points`` of their own
    front, the knees first (:func:`knee_then_spread`), by KL: ``[{"trial", "params", "val_refusal_score", "val_kl"}]``."""
    front = pareto([(t["refusal_score"], t["kl"]) for t in trials])
    full = Screen(model, data, tokens, None, cfg.batch_size)
    scored = []
    for i in front:
        score, kl = full(frontier_edit(cand, trials[i]["params"], cfg.writers))
        scored.append({"trial": trials[i]["number"], "params": trials[i]["params"], "val_refusal_score": score,
                       "val_kl": kl})
    keep = pareto([(p["val_refusal_score"], p["val_kl"]) for p in scored])
    picked = knee_then_spread([scored[i]["val_refusal_score"] for i in keep], [scored[i]["val_kl"] for i in keep],
                              cfg.max_points, full.floor, full.baseline)
    return [scored[keep[j]] for j in picked]


def confirm(model: Model, data: RefusalData, edits: Sequence[Any], cfg: FrontierConfig, judge: Judge | None = None
            ) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, list[str]]]:
    """Baseline and per-edit held-out measures: harmful refusal :class:`Rate`, harmless KL / CE (the baseline's own
    answers), borderline over-refusal, and a same-strength random control (``random_like``, seeded per point) with
    its harmful refusal and KL. Returns ``(baseline, measures, generations)``."""
    rt = Runtime(batch_size=cfg.batch_size, progress=False)
    judged = partial(steering.generate_and_judge, judge=judge, max_new_tokens=cfg.max_new_tokens, runtime=rt)
    sets = {"harmful": data.harmful["test"].instructions, "harmless": data.harmless["test"].instructions}
    if data.borderline is not None:
        sets["borderline"] = data.borderline.instructions
    base = {k: judged(model, p) for k, p in sets.items()}
    gens = {f"baseline/{k}": list(r.texts) for k, r in base.items()}
    out = []
    for i, edit in enumerate(edits):
        ctrl = edit.random_like(model, seed=cfg.seed + i)
        m: dict[str, Any] = {"harmful": judged(model, sets["harmful"], edit),
                             "control_harmful": judged(model, sets["harmful"], ctrl)}
        if "borderline" in sets:
            m["borderline"] = judged(model, sets["borderline"], edit)
        kc = harmless_kl_ce(model, sets["harmless"], base["harmless"].texts, (edit,), cfg.batch_size,
                            controls={"random": (ctrl,)})
        m |= {"kl": kc.get("kl_first_response_token", math.nan), "ce": kc.get("ce_edited", math.nan),
              "ce_baseline": kc.get("ce_baseline", math.nan),
              "control_kl": kc.get("kl_first_response_token (random)", math.nan)}
        gens |= {f"point{i}/{k}": list(m[k].texts) for k in ("harmful", "control_harmful", "borderline") if k in m}
        out.append({k: dict(v) if isinstance(v, dict) else v for k, v in m.items()})
    return {k: dict(v) for k, v in base.items()}, out, gens


def zero_vs_reference(model: Model, data: RefusalData, cand: Candidates, params: dict[str, Any], cfg: FrontierConfig,
                      judge: Judge | None = None) -> dict[str, Any]:
    """The ablation-to-zero side effect: harmless and borderline test prompts whose last-token projection on the
    chosen direction (at its layer) is negative, judged unedited, under the chosen kernels' weighted ablation to 0 and
    to the harmless mean's level. ``{"n", "refused": {"baseline", "zero", "reference"} (Rates)}``."""
    prompts = list(data.harmless["test"].instructions) + (
        list(data.borderline.instructions) if data.borderline is not None else [])
    zero = frontier_edit(cand, params | {"variant": "zero"}, cfg.writers)
    row = min(round(float(params["direction_index"])), len(cand.layers) - 1)
    acts = capture(model, prompts, sites=cand.sites[0] if cand.sites else "resid_pre", layers=[cand.layers[row]],
                   positions="last", runtime=Runtime(batch_size=cfg.batch_size, progress=False))
    d = zero.direction
    proj = acts.tensor.reshape(len(prompts), -1).float() @ (d[cand.layers[row]] if isinstance(d, dict) else d).float()
    neg = [p for p, x in zip(prompts, proj.tolist()) if x < 0]
    out: dict[str, Any] = {"n": len(neg), "of": len(prompts), "layer": cand.layers[row], "refused": {}}
    if not neg:
        return out
    rt = Runtime(batch_size=cfg.batch_size, progress=False)
    edits = {"baseline": (), "zero": (zero,)}
    if cand.layers == list(range(model.n_layers)):
        edits["reference"] = (frontier_edit(cand, params | {"variant": "reference"}, cfg.writers),)
    for name, ivs in edits.items():
        out["refused"][name] = dict(steering.generate_and_judge(model, neg, *ivs, judge=judge,
                                                                max_new_tokens=cfg.max_new_tokens, runtime=rt))
    return out


def run_frontier(model: Model, data: RefusalData, cand: Candidates, tokens: Sequence[int],
                 cfg: FrontierConfig | None = None, judge: Judge | None = None,
                 searched: FrontierResult | None = None) -> FrontierResult:
    """Search, score, confirm and choose (see the module); the result holds every trial, the confirmed points, the
    chosen one by :data:`RULE`, the zero-vs-reference side effect and the seconds each part took. ``searched``: an
    earlier result on the same model and data whose trials are rescored and confirmed again (no new search)."""
    cfg = cfg or FrontierConfig()
    if not tokens:
        raise ValueError("the frontier needs the job's refusal tokens (the refusal score); this model has none: "
                         "it does not refuse, so there is no refusal to remove")
    t0 = perf_counter()
    if searched is not None:
        trials, baseline_score = searched.trials, searched.baseline["val_refusal_score"]
    else:
        trials, baseline_score = search(model, data, cand, tokens, cfg)
    t1 = perf_counter()
    points = rescore(model, data, cand, tokens, trials, cfg)
    t2 = perf_counter()
    edits = [frontier_edit(cand, p["params"], cfg.writers) for p in points]
    baseline, measures, gens = confirm(model, data, edits, cfg, judge)
    points = [p | m for p, m in zip(points, measures)]
    chosen, why = choose(points, cfg.target)
    t3 = perf_counter()
    side = zero_vs_reference(model, data, cand, points[chosen]["params"], cfg, judge)
    seconds = {"search": t1 - t0, "rescore": t2 - t1, "confirm": t3 - t2, "side_effect": perf_counter() - t3}
    return FrontierResult(trials=trials, points=points, baseline=baseline | {"val_refusal_score": baseline_score},
                          chosen=chosen, rule=RULE.format(target=cfg.target) + f" ({why})", side_effect=side,
                          seconds=seconds, generations=gens,
                          settings={"trials": cfg.trials, "seed": cfg.seed, "sampler": cfg.sampler,
                                    "target": cfg.target, "writers": list(cfg.writers), "n_screen": cfg.n_screen,
                                    "ranges": cfg.ranges, "scopes": list(cfg.scopes),
                                    "max_new_tokens": cfg.max_new_tokens, "batch_size": cfg.batch_size})


def frontier_outputs(out: Path, model: Model, res: FrontierResult, cand: Candidates, save_to: Path | None = None
                     ) -> dict[str, Any]:
    """The run's frontier outputs: every point's spec (and its control's) in ``out/edits``, and with ``save_to`` the
    chosen point baked and saved as an HF folder (``steering.bias.check_saveable`` first). ``metrics.json``'s
    section: the summary, every point's row, ``specs`` (``{name: path relative to out}``), ``saved_model``."""
    from steering.bias import check_saveable

    (out / "edits").mkdir(parents=True, exist_ok=True)
    specs = save_point_specs(res, cand, model, out / "edits")
    m = {"summary": res.summary(), "points": [res.point_row(i) for i in range(len(res.points))],
         "specs": {k: str(v.relative_to(out)) for k, v in specs.items()}}
    if save_to is not None:
        baked = chosen_edit(res, cand).bake(model).model
        check_saveable(baked, "the frontier's chosen point")
        baked.hf.save_pretrained(save_to)
        model.tokenizer.save_pretrained(save_to)
        m["saved_model"] = str(save_to)
    return m


def chosen_edit(res: FrontierResult, cand: Candidates) -> Any:
    """The chosen point's edit object (rebuilt from its parameters)."""
    return frontier_edit(cand, res.points[res.chosen]["params"], res.settings["writers"])


def point_edits(res: FrontierResult, cand: Candidates) -> list[Any]:
    """Every confirmed point's edit object, in the result's order."""
    return [frontier_edit(cand, p["params"], res.settings["writers"]) for p in res.points]


def save_point_specs(res: FrontierResult, cand: Candidates, model: Model, folder: Path) -> dict[str, Path]:
    """Every confirmed point's edit and its random control as specs in ``folder`` (``steering.save_edit``; an
    existing spec is refused, so write into a fresh folder): ``{name: JSON path}``, each point's ``spec`` set."""
    from steering.specs import model_record

    record, out = model_record(model), {}
    for i, edit in enumerate(point_edits(res, cand)):
        ctrl = edit.random_like(model, seed=res.settings["seed"] + i)
        for name, e in ((f"frontier-point{i}", edit), (f"frontier-point{i}-random_control", ctrl)):
            out[name] = steering.save_edit(e, folder / name, record=record)
        res.points[i]["spec"] = out[f"frontier-point{i}"].name
    return out


__all__ = ["RANGES", "SAMPLERS", "SCOPES", "VARIANTS", "index_range", "layer_directions", "written_rows", "FrontierConfig", "Screen", "chosen_edit", "confirm", "frontier_edit", "frontier_outputs",
           "point_edits", "rescore", "run_frontier", "save_point_specs", "search", "suggest", "zero_vs_reference"]
