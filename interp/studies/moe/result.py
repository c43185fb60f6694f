"""The mixture-of-experts study's result: refusal removed per writer condition, the joint-only share, random
orthogonal directions, the category subspaces' rank sweep, judged rates and the bake-vs-hooks check."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from interp.bundle import Result
from interp.evals.rates import Rate
from interp.studies.moe.conditions import ALONE, JOINT

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class MoeRefusal(Result):
    """``writers[condition]``: ``{removed, lo, hi, score, sites}`` (the fraction of refusal removed with its 95%
    bootstrap interval, the mean first-token refusal score, the sites) for ``attention``, ``dense + shared``,
    ``routed experts`` and ``joint``; ``joint_only``: ``{share, lo, hi, sum_alone, sum_lo, sum_hi}``; ``random``:
    one row per random unit direction orthogonal to the refusal direction, ablated jointly (``cos``: its cosine
    with it); ``subspaces[name]``:
    one row per rank ``{rank, removed, lo, hi, overlap}`` (``overlap``: the refusal direction's projection norm
    into the subspace built without projecting it out; the ablated one excludes it unless the config says not), for each category and a ``random subspace`` control; ``rates``: judged refusal rates
    (Wilson 95%) of greedy answers; ``bake``: the joint edit baked into the weights vs the hooks."""

    model_id: str
    direction: dict[str, Any]
    tokens: list[str]
    n_eval: int
    baseline_score: float
    harmless_score: float
    writers: dict[str, dict[str, Any]]
    joint_only: dict[str, float]
    random: list[dict[str, float]]
    ranks: list[int]
    subspaces: dict[str, list[dict[str, float]]]
    rates: dict[str, Rate]
    bake: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Removal per condition, the joint-only share, the random directions, the rank sweep, rates, bake."""
        bake = {k: v for k, v in self.bake.items() if k != "parameters"}
        return {"model": self.model_id, "direction": self.direction, "tokens": self.tokens, "n_eval": self.n_eval,
                "baseline_score": self.baseline_score, "harmless_score": self.harmless_score,
                "writers": self.writers, "joint_only": self.joint_only, "random": self.random,
                "subspaces": self.subspaces, "rates": {k: dict(r) for k, r in self.rates.items()}, "bake": bake,
                "notes": self.notes}

    def to_frame(self) -> pd.DataFrame:
        """One row per measured condition: ``part`` (writers / random direction / subspace), ``condition``,
        ``rank`` (subspaces), ``removed``, ``lo``, ``hi``, and the judged rate's columns where one was judged."""
        import pandas as pd

        rows = [{"part": "writers", "condition": k, "rank": None, **_cols(v)} for k, v in self.writers.items()]
        rows += [{"part": "random direction", "condition": f"random {i}", "rank": None, **_cols(v)}
                 for i, v in enumerate(self.random)]
        rows += [{"part": "subspace", "condition": name, "rank": v["rank"], **_cols(v)}
                 for name, vs in self.subspaces.items() for v in vs]
        frame = pd.DataFrame(rows)
        for col in ("rate", "k", "n", "rate_lo", "rate_hi"):
            frame[col] = None
        for i, row in frame.iterrows():
            key = row["condition"] if row["part"] != "random direction" else ("random" if row["condition"] == "random 0"
                                                                             else None)
            if key in self.rates:
                c = self.rates[key].columns()
                frame.loc[i, ["rate", "k", "n", "rate_lo", "rate_hi"]] = [c["rate"], c["k"], c["n"], c["low"], c["high"]]
        return frame

    def plot(self, which: str = "writers") -> Any:
        """``"writers"``: the fraction removed per condition (alone, their sum, joint, random directions) with
        intervals; ``"ranks"``: the removal by rank of each category subspace and the random subspace."""
        from interp.viz.moe import rank_sweep, removal_bars

        if which == "writers":
            jo = self.joint_only
            rows = [(k, self.writers[k], "#1f77b4") for k in ALONE]
            rows.append(("sum of the three alone", {"removed": jo["sum_alone"], "lo": jo["sum_lo"],
                                                    "hi": jo["sum_hi"]}, "#9ecae1"))
            rows.append((JOINT, self.writers[JOINT], "#d62728"))
            rows += [(f"random orthogonal {i}", v, "#9a9a9a") for i, v in enumerate(self.random)]
            return removal_bars([r[0] for r in rows], tuple([r[1][k] for r in rows] for k in ("removed", "lo", "hi")),
                                [r[2] for r in rows])
        if which == "ranks":
            curves = {n: tuple([v[k] for v in vs] for k in ("removed", "lo", "hi")) for n, vs in self.subspaces.items()}
            return rank_sweep(self.ranks, curves, {"refusal direction, joint": self.writers[JOINT]["removed"]})
        raise ValueError(f"which must be 'writers' or 'ranks', got {which!r}")


def _cols(v: dict[str, Any]) -> dict[str, Any]:
    return {"removed": v["removed"], "lo": v["lo"], "hi": v["hi"]}


__all__ = ["MoeRefusal"]
