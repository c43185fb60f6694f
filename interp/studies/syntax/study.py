"""The syntactic refusal study: refusal of each form with Wilson intervals, activation patching imperative -> form
and back by layer x position (:mod:`interp.studies.syntax.mediation`), heads and neurons at the found layers
against random ones, the refusal direction's projection by form (the job's own direction,
:func:`interp.studies.kit.direction.own_direction`), and steering the bypassing form with the imperative-minus-form
difference at the found layers x aligned positions against random vectors of the same norms (judged rates)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

import steering
from interp.bundle import Result
from interp.capturing import capture
from interp.evals.bootstrap import percentile_interval, resample_ids
from interp.evals.judge import Judge, load_judge
from interp.evals.rates import Rate
from interp.models import Model
from interp.studies.kit.config import DataConfig
from interp.studies.kit.direction import own_direction
from interp.studies.kit.prompt_sets import load_refusal_data
from interp.studies.kit.stages import find_refusal_tokens
from interp.studies.syntax import mediation as med
from interp.studies.syntax.data import FORMS, SyntaxForms, load_syntax_forms
from interp.values import Runtime
from probes.directions import random_directions

if TYPE_CHECKING:
    import pandas as pd

ALIGNS = ("end", "same")


@dataclass(frozen=True)
class SyntaxConfig:
    """``forms`` (the imperative first), the first ``n_pairs`` requests (None: all), pairs aligned on their last
    ``n_positions`` tokens (``align="end"``) or token for token (``"same"``: equal token counts needed), the
    ``layers`` swept (None: all), the ``n_found_layers`` best, ``n_heads`` (at most half the found layers' heads,
    so random ones remain) / ``n_neurons`` found units, ``n_random``
    random draws per control, greedy answers of ``max_new_tokens``, ``n_boot`` bootstrap resamples, ``n_direction``
    train prompts per class for the refusal direction."""

    forms: tuple[str, ...] = FORMS
    n_pairs: int | None = None
    n_positions: int = 8
    align: str = "end"
    layers: tuple[int, ...] | None = None
    n_found_layers: int = 2
    n_heads: int = 4
    n_neurons: int = 16
    n_random: int = 3
    max_new_tokens: int = 32
    n_boot: int = 1000
    n_direction: int = 32

    def __post_init__(self) -> None:
        if not self.forms or self.forms[0] != "imperative" or len(self.forms) < 2:
            raise ValueError(f"forms must start with 'imperative' (the source of every patch) and name at least one "
                             f"other form, got {self.forms}")
        if any(f not in FORMS for f in self.forms):
            raise ValueError(f"forms must be among {FORMS}, got {self.forms}")
        if self.align not in ALIGNS:
            raise ValueError(f"align must be one of {ALIGNS} ('end': the last n_positions tokens; 'same': token for "
                             f"token, equal token counts), got {self.align!r}")
        for name in ("n_found_layers", "n_heads", "n_neurons", "n_random", "n_positions", "n_direction"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_pairs is not None and self.n_pairs < 2:
            raise ValueError(f"n_pairs must be >= 2 (or None for all), got {self.n_pairs}")


@dataclass
class SyntaxRefusal(Result):
    """Rates by form; ``to_form[form]`` / ``back[form]`` ``[L, P]`` restored shares (patching both ways, ``resid_pre``
    at ``layers`` x aligned ``positions``); at ``found_layers`` on ``target_form`` (the form refused least): head
    shares ``heads [F, H]``, ``found_heads``, ``components`` (heads / neurons: found vs random shares); the refusal
    direction's ``projection[form]`` ``[lo, mean, hi]``; ``steering`` rates on the target form (plain, found,
    random of the same norms)."""

    forms: list[str]
    rates: dict[str, Rate]
    scores: dict[str, float]
    layers: list[int]
    positions: list[str]
    to_form: dict[str, torch.Tensor]
    back: dict[str, torch.Tensor]
    target_form: str
    found_layers: list[int]
    heads: torch.Tensor
    found_heads: list[list[int]]
    components: dict[str, dict[str, Any]]
    projection: dict[str, list[float]]
    direction_layer: int
    steering: dict[str, Rate]
    n_pairs: int
    model_id: str = ""
    config: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Rates and scores by form, the found layers, heads and components with their random controls, the
        projection by form and the steering rates."""
        comps = {k: {n: v[n] for n in ("size", "found", "random")} for k, v in self.components.items()}
        return {"model": self.model_id, "n_pairs": self.n_pairs, "rates": {f: dict(r) for f, r in self.rates.items()},
                "scores": self.scores, "target_form": self.target_form, "found_layers": self.found_layers,
                "found_heads": self.found_heads, "components": comps, "projection": self.projection,
                "direction_layer": self.direction_layer, "steering": {k: dict(r) for k, r in self.steering.items()},
                "steering_restored": self.steering_restored()}

    def steering_restored(self) -> dict[str, float | None]:
        """Share of the imperative-minus-target refusal-rate gap that steering (found, random) closes; None when the
        target form is refused as often as the imperative."""
        plain, gap = self.steering["plain"].rate, self.rates["imperative"].rate - self.steering["plain"].rate
        return {k: (self.steering[k].rate - plain) / gap if abs(gap) > 1e-12 else None
                for k in ("found", "random")}

    def to_frame(self) -> pd.DataFrame:
        """One row per form, direction (``to_form``: imperative patched in; ``back``: the form patched into the
        imperative), layer and aligned position: the restored share."""
        import pandas as pd

        rows = [{"form": f, "direction": name, "layer": la, "position": pos, "restored": float(grid[f][i, j])}
                for name, grid in (("to_form", self.to_form), ("back", self.back)) for f in grid
                for i, la in enumerate(self.layers) for j, pos in enumerate(self.positions)]
        return pd.DataFrame(rows)

    def plot(self) -> Any:
        """Share of the refusal-score gap restored by patching the imperative's ``resid_pre`` into the target form,
        layer x aligned position."""
        from interp.viz.patching import grid_heatmap

        return grid_heatmap(self.to_form[self.target_form], self.positions, [str(la) for la in self.layers], "aligned position", "layer", "restored share",
                            f"imperative -> {self.target_form}: restored refusal score", diverging=True)


def form_rates(model: Model, data: SyntaxForms, cfg: SyntaxConfig, judge: Judge, rt: Runtime) -> dict[str, Rate]:
    """Judged refusal rate (Wilson 95%) of greedy answers to each form."""
    return {f: steering.generate_and_judge(model, data.get(f, cfg.n_pairs), judge=judge,
                                           max_new_tokens=cfg.max_new_tokens, runtime=rt) for f in cfg.forms}


def direction_projection(model: Model, data: SyntaxForms, cfg: SyntaxConfig, rt: Runtime
                         ) -> tuple[int, dict[str, list[float]]]:
    """The job's refusal direction (its layer) and each form's mean projection on it at the last token, with a
    bootstrap 95% interval over requests: ``{form: [lo, mean, hi]}``."""
    n = cfg.n_direction
    rd = load_refusal_data(model.name, DataConfig(n_train=n, n_val=n, n_test=2, n_borderline=2, borderline="none"),
                           runtime=rt)
    tokens = find_refusal_tokens(model, rd, batch_size=rt.batch_size)
    d = own_direction(model, rd, tokens, rt.batch_size)
    out = {}
    for f in cfg.forms:
        acts = capture(model, data.get(f, cfg.n_pairs), sites="resid_pre", positions="last", layers=[d.layer],
                       runtime=Runtime(batch_size=rt.batch_size, progress=False))
        proj = acts.tensor.float().reshape(acts.tensor.shape[0], -1) @ d.unit.float()
        idx = resample_ids(len(proj), cfg.n_boot, rt.seed)
        lo, hi = percentile_interval(proj[idx].mean(1))
        out[f] = [float(lo), float(proj.mean()), float(hi)]
    return d.layer, out


def steer_edits(diff: torch.Tensor, layers: list[int], seed: int | None) -> list[Any]:
    """``AddVector`` of ``diff [F, P, d]`` at each found layer x aligned position (the last ``P`` prompt tokens), or
    with ``seed`` random directions of the same norms."""
    F, P, d = diff.shape
    rnd = None if seed is None else random_directions(d, F * P, seed=seed)
    edits = []
    for i, la in enumerate(layers):
        for p in range(P):
            v = diff[i, p]
            if rnd is not None:
                v = rnd[i * P + p].vectors[0].float() * v.norm()
            edits.append(steering.AddVector(v, layers=[la], sites="resid_pre", positions=[p - P], scope="prompt"))
    return edits


def mediation(model: Model, data: SyntaxForms, cfg: SyntaxConfig, rates: dict[str, Rate], rt: Runtime
              ) -> dict[str, Any]:
    """Patching both ways for every other form, then heads and neurons at the found layers of the target form."""
    metric, n, bs = med.refusal_metric(model), cfg.n_pairs, rt.batch_size
    layers = list(cfg.layers) if cfg.layers is not None else list(range(model.n_layers))
    imp, others = data.get("imperative", n), list(cfg.forms[1:])
    out: dict[str, Any] = {"to_form": {}, "back": {}, "scores": {}, "pairs": {}}
    for f in others:
        pairs = med.form_pairs(model, imp, data.get(f, n), cfg.align, cfg.n_positions)
        fwd, back = med.both_ways(model, pairs, metric, layers, bs)
        out["to_form"][f] = med.share(fwd.values, fwd.baseline, fwd.reference)
        out["back"][f] = med.share(back.values, back.baseline, back.reference)  # 1: the form's score reached
        out["scores"]["imperative"], out["scores"][f] = fwd.reference, fwd.baseline
        out["pairs"][f], out["positions"] = pairs, list(fwd.cols)
    sc = out["scores"]
    target = min(others, key=lambda f: (rates[f].rate, sc[f] - sc["imperative"]))
    bypass = [f for f in others if sc[f] < sc["imperative"]] or others
    found = med.top_layers([out["to_form"][f] for f in bypass], layers, min(cfg.n_found_layers, len(layers)))
    pairs, gap = out["pairs"][target], (sc[target], sc["imperative"])
    hs = med.head_sweep(model, pairs, metric, found, bs)
    heads = med.top_heads(hs, found, min(cfg.n_heads, len(found) * model.n_heads // 2))  # leave heads to draw from
    neurons = med.top_neurons(model, imp, data.get(target, n), found, cfg.n_neurons, bs)
    out["components"] = {kind: med.component_control(model, pairs, metric, units, kind, gap, cfg.n_random, rt.seed, bs)
                         for kind, units in (("heads", heads), ("neurons", neurons))}
    out.update(layers=layers, target=target, found=found, heads=med.share(hs.values, *gap), found_heads=heads)
    return out


def syntactic_refusal(model: Model, data: SyntaxForms | None = None, config: SyntaxConfig | None = None,
                      judge: Judge | str | None = None, runtime: Runtime | None = None) -> SyntaxRefusal:
    """The whole study on ``model`` (our set by default; ``judge``: :func:`interp.evals.judge.load_judge` spec,
    default the phrase judge; ``runtime``: batch size and seed)."""
    cfg = config if config is not None else SyntaxConfig()
    rt = runtime if runtime is not None else Runtime(batch_size=16, progress=False)
    data = data if data is not None else load_syntax_forms()
    jd = load_judge(judge)
    if cfg.align == "same":  # refuse unequal pairs before any generation
        for f in cfg.forms[1:]:
            med.form_pairs(model, data.get("imperative", cfg.n_pairs), data.get(f, cfg.n_pairs), "same", 1)
    rates = form_rates(model, data, cfg, jd, rt)
    m = mediation(model, data, cfg, rates, rt)
    d_layer, proj = direction_projection(model, data, cfg, rt)
    target, found = m["target"], m["found"]
    diff = med.aligned_difference(model, m["pairs"][target], found)
    prompts = data.get(target, cfg.n_pairs)
    kw = dict(judge=jd, max_new_tokens=cfg.max_new_tokens, runtime=rt)
    steered = steering.generate_and_judge(model, prompts, *steer_edits(diff, found, None), **kw)
    rand = [steering.generate_and_judge(model, prompts, *steer_edits(diff, found, rt.seed + i), **kw)
            for i in range(cfg.n_random)]
    pooled = Rate(sum(r.k for r in rand), sum(r.n for r in rand), [x for r in rand for x in r.flags])
    return SyntaxRefusal(list(cfg.forms), rates, m["scores"], m["layers"], m["positions"], m["to_form"], m["back"],
                         target, found, m["heads"], [list(h) for h in m["found_heads"]], m["components"], proj,
                         d_layer, {"plain": rates[target], "found": steered, "random": pooled},
                         rates["imperative"].n, model.name, asdict(cfg))


__all__ = ["ALIGNS", "SyntaxConfig", "SyntaxRefusal", "direction_projection", "form_rates", "mediation",
           "steer_edits", "syntactic_refusal"]
