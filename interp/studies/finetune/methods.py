"""Post-training methods compared: from the same base and the same data, SFT, reasoning-augmented SFT and a
preference method (DPO or ORPO), and for each fine-tune how refusal sits inside it.

Training data: harmful prompts -> ``refusals`` and harmless prompts -> ``answers`` (SFT); the same with each refusal
replaced by a reasoned one, a short justification then the decline (:mod:`.methods_data`; reasoning SFT); pairs
with chosen = refusal, rejected = a compliant answer for harmful prompts and chosen = answer, rejected = a refusal
for harmless ones (DPO / ORPO, :mod:`tune.preference`). All share one :class:`tune.TuneConfig` and seed.

Measured on each model (:mod:`.methods_measure`) and on the base as the reference: (a) behaviour, refusal on the
held-out harmful / harmless test prompts (Wilson); (b) refusal concentration on the model's own direction,
per-layer and per-writer-group ablation effects with orthogonal controls, the heads and neurons holding the
effect, and a concentration index (share of the top layers, Gini); (c) capability cost, CE on held-out harmless
answers against the base's; (d) steerability, refusal vs strength of addition (harmless) and subtraction /
ablation (harmful), with random-direction controls.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import steering
from interp.bundle import Result
from interp.evals.judge import Judge
from interp.forward import prepare
from interp.models import Model, from_hf
from interp.studies.finetune.methods_data import preference_pairs, reasoned_refusals
from interp.studies.finetune.methods_measure import (
    behaviour,
    capability_cost,
    concentration_index,
    group_effects,
    holders,
    layer_effects,
    own_direction,
    steerability,
)
from interp.studies.kit.moved import moved
from interp.studies.kit.prompt_sets import RefusalData
from interp.studies.kit.scoring import refusal_tokens
from interp.studies.kit.stages import RefusalTokens
from interp.tune.config import TuneConfig
from interp.tune.loop import fine_tune
from interp.tune.preference import KINDS, PreferenceConfig, preference_tune
from interp.values import Runtime, moved_keywords
from probes.directions import random_orthogonal

if TYPE_CHECKING:
    import pandas as pd

METHODS = ("sft", "reasoning_sft", *KINDS)
Pairs = tuple[Sequence[str], Sequence[str]]
WHICH = ("behaviour", "concentration", "cost", "steerability")


@dataclass(frozen=True)
class MethodsConfig:
    """``tune``: the one fine-tune every method runs (LoRA by default: DPO's reference is the adapter disabled);
    ``beta``: DPO temperature / ORPO odds-ratio weight; ``strengths``: multiples of the raw difference of means
    added / subtracted; ``top_layers``: the layers the concentration index counts; ``head_layers``: how many of the
    layers with the largest attention effect get their heads swept; ``n_neurons``: neurons (and random controls);
    ``methods``: the fine-tunes compared; ``compliant`` / ``reasoned``: a compliant answer / a reasoned refusal per
    harmful training prompt (``None``: the base's own greedy answers / drawn from our templates)."""

    tune: TuneConfig = TuneConfig()
    beta: float = 0.1
    strengths: tuple[float, ...] = (0.5, 1.0, 2.0)
    max_new_tokens: int = 16
    top_layers: int = 3
    head_layers: int = 2
    n_neurons: int = 8
    methods: tuple[str, ...] = ("sft", "reasoning_sft", "orpo")
    compliant: tuple[str, ...] | None = None
    reasoned: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not self.strengths or any(not a > 0 for a in self.strengths):
            raise ValueError(f"strengths must be positive multiples of the direction, got {self.strengths}")
        for name in ("max_new_tokens", "top_layers", "head_layers", "n_neurons"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if isinstance(self.methods, str) or not self.methods:
            raise ValueError(f"methods must be a non-empty tuple of {METHODS}, got {self.methods!r}")
        bad = [m for m in self.methods if m not in METHODS]
        if bad or len(set(self.methods)) != len(self.methods):
            raise ValueError(f"unknown or repeated methods {list(self.methods)}; choose among {METHODS}")
        for name in ("methods", "compliant", "reasoned"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))


@dataclass
class MethodsStudy(Result):
    """One entry per model (``"base"`` first, then each method): ``rows`` (the table's row), ``layers`` (per-layer
    effects), ``groups`` (per writer group), ``heads`` / ``neurons`` (holders), ``steer`` (steerability rows),
    ``losses`` (training curve)."""

    rows: list[dict[str, Any]]
    layers: dict[str, dict[str, list[float]]]
    groups: dict[str, dict[str, dict[str, float]]]
    holders: dict[str, dict[str, Any]]
    steer: dict[str, list[dict[str, Any]]]
    losses: dict[str, list[float]]
    meta: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Headline numbers: each model's table row (refusal with its interval and n, CE against the base's,
        the concentration and steerability columns) and its last training loss."""
        return {r["model"]: {k: v for k, v in r.items() if k != "model"}
                | {"final_loss": self.losses[r["model"]][-1] if self.losses.get(r["model"]) else None}
                for r in self.rows}

    def to_frame(self, which: str = "table") -> pd.DataFrame:
        """``'table'``: one row per model; ``'layers'``: per layer; ``'steer'``: steerability; ``'groups'``."""
        import pandas as pd

        if which == "table":
            return pd.DataFrame(self.rows)
        if which == "layers":
            return pd.DataFrame([{"model": m, "layer": i, **{k: v[i] for k, v in d.items()}}
                                 for m, d in self.layers.items() for i in range(len(d["both"]))])
        if which == "steer":
            return pd.DataFrame([{"model": m, **r} for m, rs in self.steer.items() for r in rs])
        if which == "groups":
            return pd.DataFrame([{"model": m, "group": g, **v} for m, gs in self.groups.items() for g, v in gs.items()])
        raise ValueError(f"which must be 'table', 'layers', 'steer' or 'groups', got {which!r}")

    def plot(self, which: str = "concentration") -> Any:
        """One figure per property: ``'behaviour'``, ``'concentration'``, ``'cost'`` or ``'steerability'``."""
        from interp.viz.finetune import method_curves, method_rates

        if which not in WHICH:
            raise ValueError(f"which must be one of {WHICH}, got {which!r}")
        if which == "behaviour":
            bars = {f"{r['model']}: {s}": (r[f"{s}_refusal"], r[f"{s}_low"], r[f"{s}_high"])
                    for r in self.rows for s in ("harmful", "harmless")}
            return method_rates(bars, "refusal rate", "Refusal on held-out prompts (95% Wilson intervals)")
        if which == "cost":
            return method_rates({r["model"]: (r["ce"], math.nan, math.nan) for r in self.rows}, "CE (nats / token)",
                                "Capability cost: cross-entropy on held-out harmless answers")
        if which == "concentration":
            total = {m: sum(max(x, 0) for x in d["both"]) or 1.0 for m, d in self.layers.items()}
            curves = {m: (list(range(len(d["both"]))), [x / total[m] for x in d["both"]]) for m, d in self.layers.items()}
            ctrl = {m: (list(range(len(d["control"]))), [x / total[m] for x in d["control"]])
                    for m, d in self.layers.items()}
            return method_curves(curves, ctrl, "layer", "share of the per-layer ablation effect",
                                 "Refusal concentration: direction ablated from one layer's writers")
        curves, ctrl = {}, {}
        for m, rs in self.steer.items():
            for edit in ("addition", "subtraction"):
                for d, into in (("refusal direction", curves), ("random direction", ctrl)):
                    sel = [r for r in rs if r["edit"] == edit and r["direction"] == d]
                    into[f"{m}: {edit}"] = ([r["alpha"] for r in sel], [r["rate"] for r in sel])
        return method_curves(curves, ctrl, "strength (x difference of means)", "refusal rate",
                             "Steerability: addition on harmless, subtraction on harmful prompts")


def _train(base: Model, method: str, data: dict[str, list[str]], cfg: MethodsConfig, progress: bool
           ) -> tuple[Model, list[float]]:
    """A fresh copy of ``base`` fine-tuned by ``method``, the adapter merged into plain weights."""
    work = from_hf(copy.deepcopy(base.hf), base.tokenizer, name=f"{base.name}+{method}")
    prompts = data["harmful"] + data["harmless"]
    if method in KINDS:
        p = preference_pairs(data["harmful"], data["refusals"], data["compliant"], data["harmless"], data["answers"],
                             seed=cfg.tune.seed)
        res = preference_tune(work, p.prompts, p.chosen, p.rejected,
                              PreferenceConfig(**asdict(cfg.tune), kind=method, beta=cfg.beta), progress=progress)
    else:
        refusals = data["reasoned"] if method == "reasoning_sft" else data["refusals"]
        res = fine_tune(work, prompts, refusals + data["answers"], cfg.tune, progress=progress)
    hf = res.model.hf.merge_and_unload() if hasattr(res.model.hf, "merge_and_unload") else res.model.hf
    return from_hf(hf, base.tokenizer, name=f"{base.name}+{method}"), res.losses


def _row(name: str, beh: dict, ce: float, ce_base: float) -> dict[str, Any]:
    row: dict[str, Any] = {"model": name}
    for s in ("harmful", "harmless"):
        row |= {f"{s}_refusal": beh[s]["rate"], f"{s}_low": beh[s]["ci95"][0], f"{s}_high": beh[s]["ci95"][1],
                f"{s}_n": beh[s]["n"]}
    return row | {"ce": ce, "ce_vs_base": ce - ce_base}


def trained_tokens(model: Model, refusals: Sequence[str], answers: Sequence[str]) -> RefusalTokens:
    """The refusal tokens a fine-tune was trained to open with: first tokens of its training refusals that do not
    open its training answers as often (:func:`interp.studies.kit.scoring.refusal_tokens`). Defined for every
    model, refusing or not, so each is scored on what its own method taught."""
    first = [[ids[0] for ids in model.tokenizer(list(xs), add_special_tokens=False)["input_ids"] if ids]
             for xs in (refusals, answers)]
    toks = refusal_tokens(first[0], first[1])
    if not toks:
        raise ValueError("the refusals open with the same tokens as the answers, so no refusal token tells them "
                         "apart; give refusals that open differently")
    return RefusalTokens(toks, [model.tokenizer.decode([t]) for t in toks], math.nan, math.nan)


def _inside(model: Model, data: RefusalData, refusals: Sequence[str], answers: Sequence[str], cfg: MethodsConfig,
            rt: Runtime, judge: Judge | None) -> dict[str, Any]:
    """Concentration and steerability on the method's refusal tokens and the model's own direction."""
    seed, bs = rt.seed, rt.batch_size
    tok = trained_tokens(model, refusals, answers)
    d = own_direction(model, data, tok, bs)
    u = random_orthogonal(d.unit[None], 1, seed=seed)[0].vectors[0]
    harmful, harmless = data.harmful["val"].instructions, data.harmless["val"].instructions
    encs = prepare(model, harmful)[1]
    layers = layer_effects(model, encs, tok.tokens, d.unit, u, bs)
    groups = group_effects(model, encs, tok.tokens, d.unit, u, bs)
    top_attn = sorted(range(model.n_layers), key=lambda i: -layers["attention"][i])[:cfg.head_layers]
    hold = holders(model, harmful, harmless, tok.tokens, sorted(top_attn), cfg.n_neurons, seed, bs)
    steer = steerability(model, data, d, cfg.strengths, cfg.max_new_tokens, bs, seed, judge)
    return {"tokens": tok.strings, "direction": d, "layers": layers, "groups": groups, "holders": hold, "steer": steer}


def _inside_row(got: dict[str, Any], cfg: MethodsConfig) -> dict[str, Any]:
    d, layers, groups, hold = got["direction"], got["layers"], got["groups"], got["holders"]
    top = max(cfg.strengths)

    def steer(split: str, edit: str, direction: str) -> float:
        return next(r["rate"] for r in got["steer"] if r["split"] == split and r["edit"] == edit
                    and r["direction"] == direction and r["alpha"] == (1.0 if edit == "ablation" else top))

    attn, mlp = groups["attention"]["effect"], groups["MLP"]["effect"]
    h, n = hold["heads"][0], hold["neurons"][0] if hold["neurons"] else (math.nan, math.nan, math.nan)
    return {"refusal_tokens": " ".join(got["tokens"]), "direction_layer": d.layer, "direction_how": d.how,
            "all_writers_effect": groups["all writers"]["effect"], "all_writers_control": groups["all writers"]["control"],
            "attention_effect": attn, "mlp_effect": mlp, "attention_share": attn / (attn + mlp) if attn + mlp else math.nan,
            **concentration_index(layers["both"], cfg.top_layers), "top_layer": max(range(len(layers["both"])),
                                                                                  key=lambda i: layers["both"][i]),
            "top_head": f"L{h[0]}.H{h[1]}", "top_head_effect": h[2], "top_neuron": f"L{n[0]}.N{n[1]}",
            "top_neuron_effect": n[2], "neurons_joint_effect": hold["neurons_joint"],
            "neuron_control_effect": hold["neuron_control"],
            f"add_refusal@{top:g}": steer("harmless", "addition", "refusal direction"),
            f"add_random@{top:g}": steer("harmless", "addition", "random direction"),
            f"subtract_refusal@{top:g}": steer("harmful", "subtraction", "refusal direction"),
            f"subtract_random@{top:g}": steer("harmful", "subtraction", "random direction"),
            "ablate_refusal": steer("harmful", "ablation", "refusal direction"),
            "ablate_random": steer("harmful", "ablation", "random direction")}


def _check(harmful: Pairs, harmless: Pairs, ce: Pairs) -> None:
    for what, pairs in (("harmful", harmful), ("harmless", harmless), ("ce", ce)):
        if isinstance(pairs, str) or len(pairs) != 2 or isinstance(pairs[0], str):
            raise TypeError(f"{what} must be a pair (prompts, {'refusals' if what == 'harmful' else 'answers'}) of "
                            f"lists, got {type(pairs).__name__}")
    if not harmful[0] or not harmless[0]:
        raise ValueError("give at least one harmful and one harmless training prompt")
    if len(ce[0]) != len(ce[1]) or not ce[0]:
        raise ValueError(f"{len(ce[1])} CE answers for {len(ce[0])} CE prompts; give one held-out answer per prompt")


_PAIRS = {"harmful_prompts": "harmful=(prompts, refusals)", "refusals": "harmful=(prompts, refusals)",
          "harmless_prompts": "harmless=(prompts, answers)", "answers": "harmless=(prompts, answers)",
          "ce_prompts": "ce=(prompts, answers)", "ce_answers": "ce=(prompts, answers)"}
_MOVED = {**moved(config="MethodsConfig", knobs=("compliant", "reasoned", "methods")), **_PAIRS}


@moved_keywords(_MOVED)
def compare_methods(base: Model, harmful: Pairs, harmless: Pairs, data: RefusalData, ce: Pairs,
                    judge: Judge | None = None, config: MethodsConfig | None = None,
                    runtime: Runtime | None = None) -> MethodsStudy:
    """Fine-tune ``base`` by each of ``config.methods`` on the same data and measure each model (module docstring).

    ``harmful``: (prompts, refusals), ``refusals[i]`` a refusal of ``prompts[i]`` (``config.compliant[i]``: a
    compliant answer, ``config.reasoned[i]``: a reasoned refusal); ``harmless``: (prompts, answers); ``data``:
    train prompts find each model's refusal tokens and direction, val prompts score ablations, test prompts are
    generated on; ``ce``: held-out harmless (prompts, answers) for the capability cost. ``runtime``: batch size
    (default 32), ``seed`` of every fine-tune and random draw, ``progress`` of the fine-tunes (default off).
    ``base`` is not changed (each method trains a copy)."""
    config = config if config is not None else MethodsConfig()
    rt = runtime if runtime is not None else Runtime(batch_size=32, progress=False)
    _check(harmful, harmless, ce)
    (harmful_prompts, refusals), (harmless_prompts, answers), (ce_prompts, ce_answers) = harmful, harmless, ce
    compliant = config.compliant
    if compliant is None:
        compliant = list(steering.generate(base, list(harmful_prompts), max_new_tokens=4 * config.max_new_tokens,
                                           runtime=Runtime(batch_size=rt.batch_size, progress=False)).texts)
    reasoned = config.reasoned
    train = {"harmful": list(harmful_prompts), "harmless": list(harmless_prompts), "refusals": list(refusals),
             "answers": list(answers), "compliant": list(compliant),
             "reasoned": list(reasoned) if reasoned is not None else reasoned_refusals(len(harmful_prompts), rt.seed)}
    for key, like in (("refusals", "harmful"), ("compliant", "harmful"), ("reasoned", "harmful"), ("answers", "harmless")):
        if len(train[key]) != len(train[like]):
            raise ValueError(f"{len(train[key])} {key} for {len(train[like])} {like} prompts; give one per prompt")
    cfg = replace(config, tune=replace(config.tune, seed=rt.seed))
    ce_base = capability_cost(base, list(ce_prompts), list(ce_answers), rt.batch_size)
    study = MethodsStudy([], {}, {}, {}, {}, {}, meta={"config": repr(cfg), "seed": rt.seed, "sizes": data.sizes(),
                                                       "n_train": len(train["harmful"]) + len(train["harmless"])})
    for name in ("base", *cfg.methods):
        model, losses = (base, []) if name == "base" else _train(base, name, train, cfg, rt.progress)
        beh = behaviour(model, data, cfg.max_new_tokens, rt.batch_size, judge)
        ce_m = ce_base if name == "base" else capability_cost(model, list(ce_prompts), list(ce_answers), rt.batch_size)
        refs = train["reasoned"] if name == "reasoning_sft" else train["refusals"]
        got = _inside(model, data, refs, train["answers"], cfg, rt, judge)
        study.rows.append(_row(name, beh, ce_m, ce_base) | _inside_row(got, cfg))
        study.losses[name] = losses
        study.layers[name], study.groups[name] = got["layers"], got["groups"]
        study.holders[name], study.steer[name] = got["holders"], got["steer"]
    return study


__all__ = ["METHODS", "MethodsConfig", "MethodsStudy", "compare_methods"]
