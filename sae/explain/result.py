"""The result of explaining and scoring latents: per latent its explanation, detection and fuzzing verdicts, and
the same scorers' verdicts with a shuffled explanation (another latent's) as the control."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from interp.bundle import Result
from sae.explain.explainer import Explanation
from sae.explain.scorers import SCORERS, Verdicts, pooled

if TYPE_CHECKING:
    import pandas as pd

CONDITIONS = ("explanation", "shuffled")


def verdict_mode(verdicts: Sequence[Verdicts]) -> str:
    """The verdict mode of a list of verdicts (``"mixed"`` if they differ, e.g. a folder resumed with another)."""
    modes = {v.mode for v in verdicts}
    return modes.pop() if len(modes) == 1 else "mixed" if modes else ""


@dataclass
class LatentExplanations(Result):
    """``latents [n]`` with their ``explanations``; ``control_of[i]``: the latent whose explanation scored latent
    ``i`` in the control; ``detection`` / ``fuzzing`` (own explanation) and ``detection_control`` /
    ``fuzzing_control`` (shuffled), one :class:`Verdicts` per latent. ``explainer`` / ``scorer``: the clients."""

    latents: list[int]
    explanations: list[Explanation]
    control_of: list[int]
    detection: list[Verdicts]
    fuzzing: list[Verdicts]
    detection_control: list[Verdicts]
    fuzzing_control: list[Verdicts]
    explainer: str = ""
    scorer: str = ""
    model_id: str = ""
    site: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.latents)
        for name in ("explanations", "control_of", "detection", "fuzzing", "detection_control", "fuzzing_control"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries for {n} latents")

    def verdicts(self, kind: str, condition: str = "explanation") -> list[Verdicts]:
        """The verdicts of scorer ``kind`` under ``condition`` (``"explanation"`` or ``"shuffled"``)."""
        if kind not in SCORERS or condition not in CONDITIONS:
            raise ValueError(f"kind must be one of {SCORERS} and condition one of {CONDITIONS}")
        return getattr(self, kind if condition == "explanation" else f"{kind}_control")

    def explanation_of(self, latent: int) -> str:
        return self.explanations[self.latents.index(latent)].text

    def summary(self) -> dict[str, Any]:
        """Pooled over latents, per scorer and condition: accuracy (Wilson 95%), balanced accuracy and F1
        (bootstrap 95%), the answered fraction, the verdict mode and (log-prob verdicts) the margin's AUROC
        (bootstrap 95%); and each latent's explanation."""
        out: dict[str, Any] = {"explainer": self.explainer, "scorer": self.scorer, "model_id": self.model_id,
                               "site": self.site, "n_latents": len(self.latents),
                               "explanations": {str(e.latent): e.text for e in self.explanations}}
        for kind in SCORERS:
            for cond in CONDITIONS:
                m = pooled(self.verdicts(kind, cond))
                out[f"{kind}/{cond}"] = {"accuracy": m["accuracy"].columns(), "answered": m["answered"].rate,
                                         "balanced_accuracy": m["balanced_accuracy"],
                                         "balanced_accuracy_ci95": m["balanced_accuracy_ci95"],
                                         "f1": m["f1"], "f1_ci95": m["f1_ci95"],
                                         "mode": verdict_mode(self.verdicts(kind, cond)),
                                         "auroc": m.get("auroc", math.nan),
                                         "auroc_ci95": m.get("auroc_ci95", [math.nan, math.nan])}
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    def to_frame(self) -> pd.DataFrame:
        """One row per latent, scorer and condition: ``latent``, ``scorer``, ``condition``, ``explanation_of``,
        ``explanation``, ``n``, ``answered``, ``accuracy`` with ``low`` / ``high`` (Wilson), ``balanced_accuracy``,
        ``f1``, ``auroc`` (log-prob verdicts; NaN otherwise), each with bootstrap ``*_low`` / ``*_high``,
        ``recall``, ``specificity`` and the verdict ``mode``."""
        import pandas as pd

        rows = []
        for kind in SCORERS:
            for cond in CONDITIONS:
                for latent, v in zip(self.latents, self.verdicts(kind, cond)):
                    m = v.metrics()
                    acc = m["accuracy"].columns()
                    rows.append({"latent": latent, "scorer": kind, "condition": cond, "explanation_of": v.explanation_of,
                                 "explanation": v.explanation, "n": len(v.labels), "answered": m["answered"].rate,
                                 "accuracy": acc["rate"], "low": acc["low"], "high": acc["high"],
                                 "balanced_accuracy": m["balanced_accuracy"],
                                 "balanced_accuracy_low": m["balanced_accuracy_ci95"][0],
                                 "balanced_accuracy_high": m["balanced_accuracy_ci95"][1], "f1": m["f1"],
                                 "f1_low": m["f1_ci95"][0], "f1_high": m["f1_ci95"][1],
                                 "recall": m["recall"].rate, "specificity": m["specificity"].rate,
                                 "auroc": m.get("auroc", math.nan),
                                 "auroc_low": m.get("auroc_ci95", [math.nan] * 2)[0],
                                 "auroc_high": m.get("auroc_ci95", [math.nan] * 2)[1], "mode": v.mode})
        return pd.DataFrame(rows)

    def plot(self, metric: str = "balanced_accuracy", title: str | None = None) -> Any:
        """Bars per latent: ``metric`` of each scorer with the latent's own explanation and with a shuffled one."""
        from interp.viz.sae import latent_bars

        frame = self.to_frame()
        series = {f"{k} ({c})": frame[(frame.scorer == k) & (frame.condition == c)][metric].tolist()
                  for k in SCORERS for c in CONDITIONS}
        return latent_bars(self.latents, series, yaxis=metric,
                           title=title or f"explanations by {self.explainer}: {metric} vs shuffled explanations")


__all__ = ["CONDITIONS", "LatentExplanations"]
