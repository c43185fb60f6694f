"""``RefusalResult``: everything one run of the refusal job produced, as typed stage results."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interp.bundle import Result
from interp.studies.kit.stages import Candidates, RefusalTokens, Scores, Selection
from interp.studies.refusal.estimate import Estimate
from interp.studies.refusal.evaluation import Evaluation, Subspaces
from interp.studies.refusal.writers import Writers

if TYPE_CHECKING:
    import pandas as pd

STAGES = ("tokens", "candidates", "estimate", "scores", "selection", "evaluation", "subspaces", "writers", "frontier")


@dataclass
class RefusalResult(Result):
    """Everything a run produced: the typed stage results, the metrics written, the notes, what was computed."""

    out: Path
    metrics: dict[str, Any] = field(default_factory=dict)
    direction: Any = None
    notes: list[str] = field(default_factory=list)
    tokens: RefusalTokens | None = None
    candidates: Candidates | None = None
    estimate: Estimate | None = None
    scores: Scores | None = None
    selection: Selection | None = None
    evaluation: Evaluation | None = None
    subspaces: Subspaces | None = None
    diagnosis: Any = None  # interp.studies.refusal.diagnosis.Diagnosis (derived, not a cached stage)
    writers: Writers | None = None
    frontier: Any = None  # interp.studies.refusal.frontier_result.FrontierResult (--search frontier)
    computed: list[str] = field(default_factory=list)
    # ablate_positions="auto": each ablation mode the search tried, in order, with its outcome
    ablation_search: list[dict[str, Any]] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return self.direction is not None

    def stage(self, name: str | None = None) -> Any:
        """The stage result ``name`` (one of :data:`STAGES`); ``None``: the candidate scores, or the refusal tokens
        (what the diagnosis read) for a run that stopped before scoring."""
        if name is None:
            name = "scores" if self.scores is not None else "tokens"
        if name not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {name!r}")
        got = getattr(self, name)
        if got is None:
            ran = [s for s in STAGES if getattr(self, s) is not None]
            raise ValueError(f"this run has no {name} stage (it stopped before it or skipped it); its stages: {ran}")
        return got

    def summary(self) -> dict[str, Any]:
        """Headline numbers: found or not, the diagnosis, the selected candidate and its scores, the refusal rates."""
        out: dict[str, Any] = {"found": self.found}
        if self.diagnosis is not None:
            out |= {"refuses": self.diagnosis.refuses, "diagnosis_p_value": self.diagnosis.p_value}
        if self.tokens is not None:
            out["refusal_tokens"] = list(self.tokens.strings)
        if self.selection is not None:
            out |= {f"selected_{k}": v for k, v in self.selection.summary().items() if k != "found"}
        if self.evaluation is not None:
            out["refusal_rate"] = dict(self.evaluation.refusal_rate)
        return out | {"computed": list(self.computed), "notes": list(self.notes)}

    def to_frame(self, stage: str | None = None) -> pd.DataFrame:
        """The table of one stage (:meth:`stage`; default the candidate scores, one row per layer x position); the
        candidate maps are labelled with this run's layers and position tokens and mark the selected one."""
        got = self.stage(stage)
        if isinstance(got, (Scores, Estimate)):
            return got.to_frame(self.candidates, self.selection)
        return got.to_frame()

    def plot(self, stage: str | None = None) -> Any:
        """The figure of one stage (:meth:`stage`; default the candidate heatmaps), as the report page draws it."""
        got, sel, ev = self.stage(stage), self.selection, self.evaluation
        if isinstance(got, (Scores, Estimate)):
            return got.plot(self.candidates, sel)
        if isinstance(got, Candidates):
            return got.plot(sel.position if sel is not None and sel.found else -1)
        if isinstance(got, Subspaces) and ev is not None:
            return got.plot(ev.refusal_rate.get("harmful/baseline"), ev.refusal_score.get("harmful/baseline"))
        return got.plot()
