"""``RefusalResult``: everything one run of the refusal job produced, as typed stage results."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interp.bundle import Result
from interp.studies.kit.stages import Candidates, RefusalTokens, Scores, Selection
from interp.studies.refusal.estimate import Estimate
from interp.studies.refusal.evaluation import Evaluation, Subspaces
from interp.studies.refusal.writers import Writers


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
    computed: list[str] = field(default_factory=list)
    # ablate_positions="auto": each ablation mode the search tried, in order, with its outcome
    ablation_search: list[dict[str, Any]] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return self.direction is not None
