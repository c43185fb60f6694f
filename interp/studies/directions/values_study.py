"""The value and partisan studies end to end, and the cross-lingual test, on splits by item (dilemma or topic):
fit the direction on one part, choose layers on a calibration part, steer the held-out part.

    study = value_study(model, load_dilemmas())                         # English liberty-vs-welfare vector
    study.effect.comparison(); study.plot()
    party = partisan_direction(model, load_statements())                # Democratic-vs-Republican direction
    xl = cross_lingual_transfer(load_model("gemma3-270m"), load_dilemmas(), source="en", target="fr",
                                config=ValueStudyConfig(chat=False))        # a base model: plain prompts
    xl.to_frame(); xl.plot()
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.models import Model
from interp.studies.directions.values import LayerSelection, ValueVectors, select_layers, value_vectors
from interp.studies.directions.values_choice import (
    ALPHAS,
    LETTERS,
    VALUE_MOVED,
    ValueStudyConfig,
    check_items,
)
from interp.studies.directions.values_data import (
    Dilemma,
    Statement,
    dilemma_contrast,
    dilemma_items,
    split_groups,
    statement_contrast,
    statement_items,
)
from interp.studies.directions.values_steer import SteeringEffect, selective_steering
from interp.values import Runtime, moved_keywords
from probes.compare import cosine_by_layer
from probes.validation import evaluate_direction

if TYPE_CHECKING:
    import pandas as pd

@dataclass
class ValueStudy(Result):
    """A direction (``vectors``), its chosen layers (``selection``) and its selective steering on held-out items
    (``effect``); ``split`` names the groups (dilemmas / topics) of each part."""

    vectors: ValueVectors
    selection: LayerSelection
    effect: SteeringEffect
    split: dict[str, list[str]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Headline numbers: the direction's held-out separation, the chosen layers (and their rule) and the
        held-out steering against random vectors (each part's own summary), with the groups per split."""
        return {"vectors": self.vectors.summary(), "selection": self.selection.summary(),
                "steering": self.effect.summary(), "n_groups": {k: len(v) for k, v in self.split.items()}}

    def to_frame(self) -> pd.DataFrame:
        """The held-out comparison with random vectors, one row per alpha, with the chosen layers."""
        df = self.effect.comparison()
        df["layers"], df["label"] = str(self.selection.chosen), self.effect.label
        return df

    def plot(self) -> Any:
        return self.effect.plot()


def _parts(groups: Sequence[str], fractions: Sequence[float], seed: int) -> dict[str, list[str]]:
    fit, calib, test = split_groups(groups, fractions, seed)
    return {"fit": fit, "calibration": calib, "test": test}


def _run(model: Model, pairs: Any, calib: list, test: list, split: dict[str, list[str]], label: str,
         layers: Any, cfg: ValueStudyConfig, run: Runtime) -> ValueStudy:
    calib, test = calib[:cfg.max_items[0]], test[:cfg.max_items[1]]   # items alternate letters: a prefix stays balanced
    check_items(model, calib, balanced=True)       # letters and balance checked before anything runs
    check_items(model, test, balanced=True)
    vv = value_vectors(model, pairs, layers=layers, config=cfg, runtime=run)
    sel = select_layers(model, vv, calib, alpha=cfg.select_alpha, top_k=cfg.top_k, config=cfg, runtime=run)
    eff = selective_steering(model, vv, test, sel.chosen, label=label, config=cfg, runtime=run)
    return ValueStudy(vv, sel, eff, split)


@moved_keywords(VALUE_MOVED)
def value_study(model: Model, dilemmas: Sequence[Dilemma], *, lang: str = "en", pole: str | None = None,
                layers: Any = None, config: ValueStudyConfig | None = None,
                runtime: Runtime | None = None) -> ValueStudy:
    """Value vector of ``dilemmas`` in ``lang``: fit / calibration / held-out test by dilemma (``config.fractions``,
    split seed ``runtime.seed``); ``config.max_items``: at most this many (calibration, test) items."""
    cfg, run = config or ValueStudyConfig(), Runtime.of(runtime)
    split = _parts([d.id for d in dilemmas], cfg.fractions, run.seed)
    part = {k: [d for d in dilemmas if d.id in set(v)] for k, v in split.items()}
    return _run(model, dilemma_contrast(part["fit"], lang, pole), dilemma_items(part["calibration"], lang, pole,
                cfg.letters), dilemma_items(part["test"], lang, pole, cfg.letters), split, f"values-{lang}", layers,
                cfg, run)


@moved_keywords(VALUE_MOVED)
def partisan_direction(model: Model, statements: Sequence[Statement], *, pole: str = "D", layers: Any = None,
                       config: ValueStudyConfig | None = None, runtime: Runtime | None = None) -> ValueStudy:
    """Party direction (``pole`` party's statements minus the other's) fitted on some topics, layers chosen on
    others, steering measured on forced choices between the parties' statements on held-out topics."""
    if pole not in {s.party for s in statements}:
        raise ValueError(f"no statement of party {pole!r}; parties present: {sorted({s.party for s in statements})}")
    cfg, run = config or ValueStudyConfig(), Runtime.of(runtime)
    split = _parts([s.topic for s in statements], cfg.fractions, run.seed)
    part = {k: [s for s in statements if s.topic in set(v)] for k, v in split.items()}
    return _run(model, statement_contrast(part["fit"], pole), statement_items(part["calibration"], pole, cfg.letters),
                statement_items(part["test"], pole, cfg.letters), split, f"partisan-{pole}", layers, cfg, run)


@dataclass
class CrossLingual(Result):
    """A direction fitted on ``source`` pairs steering ``target``-language prompts: ``cosine [L]`` between the
    source- and target-fit directions, ``transfer_auroc [L]`` (source direction on target pairs, nothing refitted),
    the source ``study`` (layers chosen on source calibration items) and ``target_effect`` on target test items."""

    source: str
    target: str
    study: ValueStudy
    target_vectors: ValueVectors
    cosine: torch.Tensor
    transfer_auroc: torch.Tensor
    target_effect: SteeringEffect

    @property
    def layers(self) -> list[int]:
        return self.study.vectors.layers

    def summary(self) -> dict[str, Any]:
        """Headline numbers at the source's chosen layers: the cosine of the two languages' directions and the
        transfer AUROC, each language's held-out AUROC there, and steering in the source and in the target."""
        at = [self.layers.index(la) for la in self.study.selection.chosen]

        def pick(t: torch.Tensor) -> list[float]:
            return [float(t[j]) for j in at]
        return {"source": self.source, "target": self.target, "chosen": list(self.study.selection.chosen),
                "cosine": pick(self.cosine), "transfer_auroc": pick(self.transfer_auroc),
                "auroc_source": pick(self.study.vectors.auroc), "auroc_target": pick(self.target_vectors.auroc),
                "steering_source": self.study.effect.summary(), "steering_target": self.target_effect.summary()}

    def to_frame(self) -> pd.DataFrame:
        """Per layer: cosine of the two languages' directions, held-out AUROC in each, transfer AUROC."""
        import pandas as pd

        return pd.DataFrame({"layer": self.layers, "cosine": self.cosine.tolist(),
                             f"auroc_{self.source}": self.study.vectors.auroc.tolist(),
                             f"auroc_{self.target}": self.target_vectors.auroc.tolist(),
                             f"transfer_auroc_{self.source}_to_{self.target}": self.transfer_auroc.tolist(),
                             "chosen": [la in self.study.selection.chosen for la in self.layers]})

    def comparison(self) -> Any:
        """Steering's comparison with random vectors in the source and in the target language, by alpha."""
        import pandas as pd

        a, b = self.study.effect.comparison(), self.target_effect.comparison()
        a["language"], b["language"] = self.source, self.target
        return pd.concat([a, b], ignore_index=True)

    def plot(self) -> Any:
        from interp.viz.directions_values import agreement_by_layer

        return agreement_by_layer(self.layers, {"cosine (source vs target fit)": self.cosine,
                                                "transfer AUROC": self.transfer_auroc},
                                  title=f"{self.source} -> {self.target}: direction agreement by layer")


@moved_keywords(VALUE_MOVED)
def cross_lingual_transfer(model: Model, dilemmas: Sequence[Dilemma], *, source: str = "en", target: str = "fr",
                           pole: str | None = None, layers: Any = None, config: ValueStudyConfig | None = None,
                           runtime: Runtime | None = None) -> CrossLingual:
    """Fit on ``source`` pairs (choose layers on source calibration items), steer held-out ``target`` items with
    that direction vs random; fit the same dilemmas in ``target`` too for the per-layer cosine."""
    if source == target:
        raise ValueError(f"source and target are both {source!r}; give two languages")
    cfg, run = config or ValueStudyConfig(), Runtime.of(runtime)
    study = value_study(model, dilemmas, lang=source, pole=pole, layers=layers, config=cfg, runtime=run)
    fit = [d for d in dilemmas if d.id in set(study.split["fit"])]
    test = [d for d in dilemmas if d.id in set(study.split["test"])]
    tv = value_vectors(model, dilemma_contrast(fit, target, pole), layers=layers, config=cfg, runtime=run)
    transfer = evaluate_direction(tv.acts, direction=study.vectors.direction).auroc
    target_items = dilemma_items(test, target, pole, cfg.letters)[:cfg.max_items[1]]
    eff = selective_steering(model, study.vectors, target_items, study.selection.chosen,
                             label=f"values-{source}->{target}", config=cfg, runtime=run)
    return CrossLingual(source, target, study, tv, cosine_by_layer(study.vectors.direction, tv.direction), transfer, eff)


__all__ = ["ALPHAS", "LETTERS", "CrossLingual", "ValueStudy", "ValueStudyConfig", "cross_lingual_transfer",
           "partisan_direction", "value_study"]
