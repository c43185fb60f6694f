"""What the refusal job checks before and after it searches: does the model refuse at all, and did the
selected direction change anything.

Before scoring (from the tokens stage's own generations): harmful train prompts must be refused more often
than harmless ones by a one-sided Fisher exact test at ``alpha``, and at least ``min_refusals`` times,
or the job stops early with that finding. After evaluation: whether ablation lowered held-out harmful
refusal and addition raised harmless refusal, by the same test; and every filter that was relaxed or
tightened from the paper's defaults is named.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from interp.evals.rates import fisher_greater, rate
from interp.studies.kit.config import DEFAULTS, SelectionConfig
from interp.studies.kit.stages import RefusalTokens

TEST = "one-sided Fisher exact test that harmful train prompts are refused more often than harmless ones"


@dataclass
class Diagnosis:
    """The baseline refusal check on the train prompts: rates with intervals, the test, and the verdict."""

    harmful: dict[str, Any]
    harmless: dict[str, Any]
    p_value: float
    alpha: float
    min_refusals: int
    refuses: bool
    finding: str
    test: str = TEST

    def as_dict(self) -> dict[str, Any]:
        return {"train_refusal": {"harmful": self.harmful, "harmless": self.harmless}, "test": self.test,
                "p_value": self.p_value, "alpha": self.alpha, "min_refusals": self.min_refusals,
                "refuses": self.refuses, "finding": self.finding}


def _fmt(r: dict[str, Any]) -> str:
    lo, hi = r["ci95"]
    return f"{r['k']}/{r['n']} ({r['rate']:.0%}, 95% CI {lo:.0%}-{hi:.0%})"


def diagnose(tok: RefusalTokens, sel: SelectionConfig) -> Diagnosis:
    """Does the model refuse harmful train prompts clearly more often than harmless ones (and often enough)?"""
    h, s = rate(tok.harmful_refused), rate(tok.harmless_refused)
    p = fisher_greater(h["k"], h["n"], s["k"], s["n"])
    enough = h["k"] >= sel.min_refusals
    refuses = p < sel.diagnosis_alpha and enough
    seen = f"harmful {_fmt(h)} vs harmless {_fmt(s)}; {TEST}: p = {p:.2g}"
    if refuses:
        finding = f"the model refuses: {seen} < {sel.diagnosis_alpha:g}"
    elif not enough:
        finding = (f"the model does not refuse: only {h['k']} harmful train prompts were refused, fewer than the "
                   f"{sel.min_refusals} needed to find refusal tokens (--min-refusals); {seen}. Stopped before "
                   f"scoring: there is no refusal behaviour for a refusal direction to mediate")
    else:
        finding = (f"the model does not refuse harmful prompts clearly more often than harmless ones: {seen} >= "
                   f"{sel.diagnosis_alpha:g}. Stopped before scoring: its refusals do not track harmfulness, so "
                   f"there is no refusal direction to find (check the judge on generations.jsonl)")
    return Diagnosis(h, s, p, sel.diagnosis_alpha, sel.min_refusals, refuses, finding)


def relaxed_notes(sel: SelectionConfig) -> list[str]:
    """A note for each selection filter set away from the paper's default (relaxed, tightened or off)."""
    notes = []
    labels = {"kl_threshold": "KL filter (ablation KL on harmless below)",
              "prune_layer_fraction": "depth filter (drop the last fraction of layers)",
              "induce_threshold": "induce filter (addition raises the harmless refusal score above)"}
    for name, default in DEFAULTS.items():
        value = getattr(sel, name)
        if value == default:
            continue
        off = math.isinf(value) or (name == "prune_layer_fraction" and value <= 0)
        loose = value > default if name == "kl_threshold" else value < default
        how = "off" if off else ("relaxed" if loose else "tightened")
        notes.append(f"selection: the {labels[name]} is {how}: {value:g} instead of the default {default:g}; the "
                     f"selected direction need not meet the paper's criteria")
    if sel.kl_reference == "random":
        notes.append(f"selection: the KL filter is calibrated by random directions (--kl-reference random): a candidate "
                     f"passes when its ablation KL is below the larger of {sel.kl_threshold:g} and the highest KL of the "
                     f"random unit directions ablated the same way, not below the paper's fixed threshold; the "
                     f"selected direction need not meet the paper's criteria")
    if sel.ablate_positions == "post_instruction":
        notes.append(POST_NOTE)
    return notes


POST_NOTE = ("ablation: every candidate is ablated at the prompt's post-instruction tokens and every generated "
             "token only (ablate_positions='post_instruction'), not at every token as in the paper; hooks "
             "only: no weight edit reproduces it, so the baked-weights condition ablates the direction at every token "
             "(checked against the every-token hook) and no model is saved")


def kl_rejected_notes(sel: Any) -> list[str]:
    """A note naming the candidates the KL filter alone turned down that cut the harmful refusal score further than
    the selected one (or than nothing, when none was selected)."""
    if not sel.kl_rejected:
        return []
    than = f"than the selected one (bypass {sel.bypass_score:.2f})" if sel.found else "and pass every other filter"
    listed = "; ".join(f"layer {x['layer']}, position {x['position']}: bypass {x['bypass']:.2f} at KL {x['kl']:.3g}"
                       for x in sel.kl_rejected)
    return [f"selection: the KL filter (< {sel.filters['kl_threshold']:g}) turned down candidates that cut the "
            f"harmful refusal score further {than}: {listed}; removing them moves the harmless next-token "
            f"distribution more than the filter allows (benchmarks/bench_refusal_positions.py --judged checks such "
            f"candidates by generation)"]


def auto_notes(tried: list[dict[str, Any]], sel: SelectionConfig) -> list[str]:
    """``ablate_positions="auto"``: a note when the every-token search found nothing and the post-instruction
    ablation was searched next (a forced choice of mode, stated), with both outcomes."""
    if len(tried) < 2:
        return []
    first, last = tried[0], tried[-1]
    scored = f"{first['passing'].get('kl', 0)} of the {first['n_scored_exactly']} candidates scored exactly pass KL"
    if not first.get("bypass_induce_scored", True):
        scored = f"their bypass and induce were not scored, as none could be selected: {scored}"
    cut = first.get("kl_threshold", sel.kl_threshold)
    level = random_kl_text(first.get("kl_random", []), cut)
    outcome = "and selected a direction there" if last["found"] else "and found none there either"
    return [f"ablation (auto): no candidate passes the filters with the paper's every-token ablation ({scored} < "
            f"{cut:.3g}{'; ' + level if level else ''}); the search was repeated with the ablation at the "
            f"prompt's post-instruction tokens and every generated token {outcome} (--ablate-positions all keeps the "
            f"paper's mode only)",
            POST_NOTE]


def random_kl_text(kl_random: list[float], threshold: float) -> str:
    """How the KL filter's threshold compares with the KL of random unit directions ablated the same way on the
    same prompts (``Scores.kl_random``): the level under which no direction-specific cost can be read."""
    if not kl_random:
        return ""
    k = sorted(kl_random)
    med = statistics.median(k)
    where = ("below" if threshold < k[0] else "within" if threshold <= k[-1] else "above")
    return (f"{len(k)} random unit directions ablated the same way cost KL {med:.3g} (median; range {k[0]:.3g}-"
            f"{k[-1]:.3g}) on the same harmless prompts, so the KL threshold {threshold:g} lies {where} the cost of "
            f"ablating a random direction")


def effect_check(refused: dict[str, list[bool]], alpha: float) -> dict[str, Any]:
    """Did ablation lower harmful refusal and addition raise harmless refusal (one-sided Fisher tests)?"""
    out: dict[str, Any] = {}
    for name, (hi, lo) in {"ablation lowers harmful refusal": ("harmful/baseline", "harmful/ablation"),
                           "addition raises harmless refusal": ("harmless/addition", "harmless/baseline")}.items():
        a, b = rate(refused[hi]), rate(refused[lo])
        p = fisher_greater(a["k"], a["n"], b["k"], b["n"])
        out[name] = {"p_value": p, "significant": p < alpha}
    return out


def effect_notes(effect: dict[str, Any], alpha: float) -> list[str]:
    """A note for each causal check the selected direction failed."""
    return [f"the selected direction fails a causal check: '{name}' is not significant (one-sided Fisher exact "
            f"p = {e['p_value']:.2g} >= {alpha:g}); it is not shown to mediate refusal"
            for name, e in effect.items() if not e["significant"]]


__all__ = ["Diagnosis", "auto_notes", "diagnose", "effect_check", "effect_notes", "random_kl_text", "relaxed_notes"]
