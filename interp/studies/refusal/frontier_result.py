"""The frontier search's result: every trial, the confirmed Pareto points, the chosen one and its rule; the Pareto
filter, the spread of points along a front, and the rule that picks one."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from interp.bundle import Result

if TYPE_CHECKING:
    import pandas as pd

RULE = ("the lowest harmless KL among the points whose held-out harmful refusal is at most {target:.0%}; if none "
        "reaches it, the lowest held-out harmful refusal")


def pareto(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point dominates (both coordinates minimised; of exact ties, the first)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1], i))
    out, best = [], math.inf
    for i in order:
        if points[i][1] < best:
            out.append(i)
            best = points[i][1]
    return sorted(out)


def spread(n: int, k: int) -> list[int]:
    """``min(n, k)`` indices spread evenly over ``range(n)``, both ends kept."""
    if n <= k:
        return list(range(n))
    if k == 1:
        return [n - 1]
    return sorted({round(j * (n - 1) / (k - 1)) for j in range(k)})


KNEES = (0.1, 0.3)   # where refusal is gone on the screen: within these fractions of (baseline - floor) of the floor


def knee_then_spread(scores: Sequence[float], kls: Sequence[float], k: int, floor: float, baseline: float
                     ) -> list[int]:
    """Up to ``k`` front points to confirm, by KL: first the lowest-KL point whose score is within each fraction in
    :data:`KNEES` of the gap above the floor (where the rule's target is likely reached, at the least damage), then
    points spread evenly along the front. Spreading alone can step over the knee, where the rule's point lies."""
    order = sorted(range(len(kls)), key=lambda i: kls[i])
    out: list[int] = []
    for frac in KNEES:
        near = [i for i in order if scores[i] <= floor + frac * (baseline - floor)]
        if near and near[0] not in out and len(out) < k:
            out.append(near[0])
    for i in [order[j] for j in spread(len(order), k)] + order:    # then the even spread, then the rest by KL
        if len(out) >= k:
            break
        if i not in out:
            out.append(i)
    return sorted(out, key=lambda i: kls[i])


def choose(points: Sequence[dict[str, Any]], target: float) -> tuple[int, str]:
    """:data:`RULE`: ``(index, which branch)`` over points with ``harmful["rate"]`` and ``kl``."""
    if not points:
        raise ValueError("no frontier points to choose from")
    ok = [i for i, p in enumerate(points) if p["harmful"]["rate"] <= target]
    if ok:
        return min(ok, key=lambda i: (points[i]["kl"], i)), f"{len(ok)} of {len(points)} points reach the target"
    return (min(range(len(points)), key=lambda i: (points[i]["harmful"]["rate"], points[i]["kl"], i)),
            "no point reaches the target")


@dataclass
class FrontierResult(Result):
    """``trials``: every screened setting (``params``, validation ``refusal_score``, ``kl``); ``points``: the
    confirmed Pareto points (validation scores, held-out ``harmful`` / ``borderline`` / ``control_harmful`` rates,
    ``kl``, ``ce``, ``control_kl``; ``spec``: its saved edit once written); ``chosen`` (index into ``points``) by
    ``rule``; ``side_effect``: ablation to 0 vs to the reference on negative-projection prompts."""

    trials: list[dict[str, Any]]
    points: list[dict[str, Any]]
    baseline: dict[str, Any]
    chosen: int
    rule: str
    side_effect: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    generations: dict[str, list[str]] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def point_row(self, i: int) -> dict[str, Any]:
        """One confirmed point as a flat row (rates, intervals, KL, CE, the control, its variant)."""
        p, base = self.points[i], self.baseline["harmful"]["rate"]
        row = {"point": i, "trial": p["trial"], "variant": p["params"]["variant"],
               "scope": p["params"].get("scope", "global"),
               "orthogonalize": p["params"]["orthogonalize"], "direction_index": p["params"]["direction_index"],
               "val_refusal_score": p["val_refusal_score"], "val_kl": p["val_kl"],
               "harmful_refusal": p["harmful"]["rate"], "harmful_ci95": p["harmful"]["ci95"],
               "kl": p["kl"], "ce": p["ce"], "ce_baseline": p["ce_baseline"],
               "over_refusal": p["borderline"]["rate"] if "borderline" in p else None,
               "control_refusal": p["control_harmful"]["rate"], "control_kl": p["control_kl"],
               "control_within_5_points": abs(p["control_harmful"]["rate"] - base) <= 0.05,
               "chosen": i == self.chosen}
        return row | ({"spec": p["spec"]} if "spec" in p else {})

    def summary(self) -> dict[str, Any]:
        """The budget, the baseline, the chosen point's row and rule, the side effect and the time taken."""
        return {"n_trials": len(self.trials), "n_points": len(self.points),
                "baseline_harmful_refusal": self.baseline["harmful"]["rate"],
                "baseline_over_refusal": self.baseline.get("borderline", {}).get("rate"),
                "chosen": self.point_row(self.chosen), "rule": self.rule, "side_effect": self.side_effect,
                "seconds": self.seconds, "settings": self.settings}

    def to_frame(self, what: str = "points") -> pd.DataFrame:
        """``"points"``: one row per confirmed point (:meth:`point_row`); ``"trials"``: one row per trial with its
        flattened parameters and whether the screen's front holds it."""
        import pandas as pd

        if what == "points":
            return pd.DataFrame([self.point_row(i) for i in range(len(self.points))])
        if what != "trials":
            raise ValueError(f"to_frame takes 'points' or 'trials', got {what!r}")
        front = set(pareto([(t["refusal_score"], t["kl"]) for t in self.trials]))
        rows = []
        for i, t in enumerate(self.trials):
            flat = {k: v for k, v in t["params"].items() if not isinstance(v, dict)}
            flat |= {f"{w}.{k}": x for w, v in t["params"].items() if isinstance(v, dict) for k, x in v.items()}
            rows.append({"trial": t["number"], "refusal_score": t["refusal_score"], "kl": t["kl"],
                         "pareto": i in front} | flat)
        return pd.DataFrame(rows)

    def report_sections(self) -> list[tuple[str, Any]]:
        """The report page's frontier sections: the figure, the rule and the side effect, the points' table."""
        import html

        from interp.viz.html import table

        cols = ["point", "variant", "orthogonalize", "harmful_refusal", "harmful_ci95", "kl", "ce", "ce_baseline",
                "over_refusal", "control_refusal", "control_kl", "chosen", "spec"]
        s = self.side_effect
        side = (f"ablation to 0 vs to the harmless mean's level at the chosen point: {s.get('n')} of {s.get('of')} "
                f"harmless + borderline test prompts project negatively on the direction (layer {s.get('layer')}); "
                + ("refused: " + ", ".join(f"{k} {v['k']}/{v['n']}" for k, v in s["refused"].items())
                   if s.get("refused") else "none, so no prompt's projection is raised and nothing is judged"))
        base = self.baseline["harmful"]
        notes = [f"chosen: point {self.chosen}, by the rule: {self.rule}",
                 f"baseline held-out harmful refusal {base['k']}/{base['n']}; {len(self.trials)} trials "
                 f"({self.settings.get('sampler')}, seed {self.settings.get('seed')})", side]
        text = "".join(f"<p class='note'>{html.escape(n)}</p>" for n in notes)
        rows = [[self.point_row(i).get(c) for c in cols] for i in range(len(self.points))]
        return [("Refusal vs damage frontier", self.plot()),
                ("Frontier points: held-out refusal [95% CI], KL, CE, over-refusal, random controls",
                 text + table(cols, rows))]

    def plot(self) -> Any:
        """Heretic-style trial scatter with the Pareto front, and the confirmed frontier with controls and the
        chosen point (:func:`interp.viz.frontier.frontier_figure`)."""
        from interp.viz.frontier import frontier_figure

        pts = self.points
        trials = {"score": [t["refusal_score"] for t in self.trials], "kl": [t["kl"] for t in self.trials],
                  "front": pareto([(t["refusal_score"], t["kl"]) for t in self.trials])}
        points = {"rate": [p["harmful"]["rate"] for p in pts], "lo": [p["harmful"]["ci95"][0] for p in pts],
                  "hi": [p["harmful"]["ci95"][1] for p in pts], "kl": [p["kl"] for p in pts],
                  "control_rate": [p["control_harmful"]["rate"] for p in pts],
                  "control_kl": [p["control_kl"] for p in pts]}
        return frontier_figure(trials, points, self.baseline["harmful"]["rate"], self.chosen)


__all__ = ["RULE", "FrontierResult", "choose", "pareto", "spread"]
