"""Value vectors (C-Voices style): a direction per layer from contrastive value prompts, its held-out separation,
and the value-sensitive layers chosen by a stated rule (held-out separation x causal effect on forced choice).

    pairs = dilemma_contrast(fit_dilemmas, "en")
    vv = value_vectors(model, pairs)                      # diff of means per layer, AUROC held out by dilemma
    sel = select_layers(model, vv, calib_items, alpha=0.5)
    eff = selective_steering(model, vv, test_items, sel.chosen, norms=sel.norms)   # values_steer
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.capturing import capture
from interp.models import Model
from interp.sites import parse_site
from interp.studies.directions.moved import moved_into
from interp.studies.directions.values_choice import CHAT_MOVED, ValueStudyConfig, check_items, forced_choice
from interp.studies.directions.values_data import ChoiceItem, Contrast
from interp.values import Prompts, Runtime, moved_keywords
from probes.config import CVConfig
from probes.directions import diff_of_means
from probes.layers import LayerRule, choose
from probes.objects import Direction
from probes.validation import ProbeScores, cross_validate
from steering.interventions import AddVector
from steering.strength import ResidualNorms, residual_norms

if TYPE_CHECKING:
    import pandas as pd

RULE = ("score(layer) = max(AUROC_heldout - 0.5, 0) x max(effect, 0), effect = (mean P(pole | +alpha) - mean "
        "P(pole | -alpha)) / 2 on the calibration items, steering that one layer with the unit direction at alpha x "
        "its mean residual norm; the top_k layers by score (ties by effect), only layers with a positive score; none "
        "positive: the one layer with the largest effect, with a warning")


@dataclass
class ValueVectors(Result):
    """``direction`` (unit diff of means per layer, toward the pole) and its held-out ``scores`` (AUROC / d by
    grouped cross-validation: no group straddles train and test)."""

    direction: Direction
    scores: ProbeScores
    site: str
    positions: str
    n_pairs: int
    pole: str
    chat: bool
    acts: Any = field(repr=False, default=None)

    @property
    def layers(self) -> list[int]:
        return [int(x) for x in self.direction.layers]

    @property
    def auroc(self) -> torch.Tensor:
        """Mean held-out AUROC per layer ``[n_layers]``."""
        return self.scores.mean("auroc")

    def summary(self) -> dict[str, Any]:
        """Headline numbers: the held-out scores' best layer with its AUROC, d and shuffled-label control
        (:meth:`ProbeScores.summary`), the pole, site, positions and pairs."""
        return {"pole": self.pole, "site": self.site, "positions": self.positions, "n_pairs": self.n_pairs,
                **self.scores.summary()}

    def to_frame(self) -> pd.DataFrame:
        """One row per layer: held-out AUROC, d, accuracy (with the shuffled-label control), and the raw norm."""
        df = self.scores.by_site()
        df["raw_norm"] = self.direction.norms.tolist()
        df["n_pairs"], df["pole"], df["positions"] = self.n_pairs, self.pole, self.positions
        return df

    def plot(self, title: str | None = None) -> Any:
        from interp.viz.directions_values import separation_by_layer

        control = self.scores.control_auroc.nanmean(0) if self.scores.control_auroc is not None else None
        return separation_by_layer(self.layers, self.auroc, control, title=title or
                                   f"{self.pole} direction: held-out AUROC by layer ({self.n_pairs} pairs)")


@moved_keywords(moved_into(ValueStudyConfig, ["site", "positions", "n_folds", "chat"]))
def value_vectors(model: Model, pairs: Contrast, *, layers: Sequence[int] | None = None,
                  config: ValueStudyConfig | None = None, runtime: Runtime | None = None) -> ValueVectors:
    """Capture both sides of ``pairs`` at ``config.site`` / ``positions`` (every layer, or ``layers``), fit the diff
    of means toward the pole per layer, and score it held out (``config.n_folds``, seed ``runtime.seed``) by
    ``probes.cross_validate`` with ``groups`` = the pairs' groups."""
    cfg, run = config or ValueStudyConfig(), Runtime.of(runtime)
    site, positions, n_folds, chat = cfg.site, cfg.positions, cfg.n_folds, cfg.chat
    if not isinstance(pairs, Contrast):
        raise TypeError("pairs must be a values_data.Contrast (pole prompts, other-side prompts, groups)")
    n_groups = len(set(pairs.groups))
    if n_groups < n_folds:
        raise ValueError(f"{n_groups} groups cannot fill {n_folds} held-out folds; pass n_folds <= {n_groups}")
    acts = capture(model, Prompts(pairs.prompts, labels=pairs.labels, chat=chat), sites=site,
                   positions=positions,
                   layers=layers, runtime=Runtime(batch_size=run.batch_size, progress=False))
    direction = diff_of_means(acts, positive=1)
    scores = cross_validate(acts, method="mean_diff", groups=pairs.all_groups, positive=1,
                            config=CVConfig(n_folds=n_folds), runtime=Runtime(seed=run.seed, progress=False))
    return ValueVectors(direction, scores, site, positions, len(pairs.positive), pairs.pole, chat, acts)


@dataclass
class LayerSelection(Result):
    """Per layer: held-out ``auroc``, causal ``effect`` of steering that layer alone on the calibration items,
    ``score`` = their product by ``rule``; ``chosen``: the top layers. ``null``: no layer had a positive score."""

    layers: list[int]
    auroc: torch.Tensor
    effect: torch.Tensor
    rate_plus: torch.Tensor
    rate_minus: torch.Tensor
    score: torch.Tensor
    chosen: list[int]
    alpha: float
    baseline: dict[str, Any]
    n_items: int
    norms: ResidualNorms | Any = field(repr=False, default=None)
    rule: str = RULE

    def summary(self) -> dict[str, Any]:
        """Headline numbers: the chosen layers with their AUROC, effect and score, alpha, n items and the rule."""
        at = [self.layers.index(la) for la in self.chosen]
        return {"chosen": list(self.chosen), "auroc": [float(self.auroc[j]) for j in at],
                "effect": [float(self.effect[j]) for j in at], "score": [float(self.score[j]) for j in at],
                "null": self.null, "alpha": self.alpha, "n_items": self.n_items, "baseline": dict(self.baseline),
                "rule": self.rule}

    @property
    def null(self) -> bool:
        return not bool((self.score > 0).any())

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame({"layer": self.layers, "auroc": self.auroc.tolist(), "effect": self.effect.tolist(),
                             "rate_plus": self.rate_plus.tolist(), "rate_minus": self.rate_minus.tolist(),
                             "score": self.score.tolist(), "chosen": [la in self.chosen for la in self.layers],
                             "alpha": self.alpha, "n_items": self.n_items})

    def plot(self, title: str | None = None) -> Any:
        from interp.viz.directions_values import layer_selection

        return layer_selection(self.layers, self.auroc, self.effect, self.score, self.chosen,
                               title=title or f"value-sensitive layers (alpha {self.alpha:g}, {self.n_items} items)")


def _unpack(vectors: ValueVectors | Direction, auroc: Any) -> tuple[Direction, torch.Tensor]:
    if isinstance(vectors, ValueVectors):
        return vectors.direction, vectors.auroc if auroc is None else torch.as_tensor(auroc, dtype=torch.float32)
    if isinstance(vectors, Direction):
        if auroc is None:
            raise ValueError("a bare Direction has no held-out separation; pass auroc= (one per layer) or ValueVectors")
        return vectors, torch.as_tensor(auroc, dtype=torch.float32)
    raise TypeError(f"vectors must be ValueVectors or a probes Direction, got {type(vectors).__name__}")


def steer_at(direction: Direction, layers: Sequence[int], alpha: float, norms: Any) -> AddVector:
    """``AddVector`` of the direction's unit vectors at ``layers``, ``alpha`` x the residual norm there."""
    kind = parse_site(direction.sites[0]).kind
    return AddVector({la: direction.at(la) for la in layers}, layers=list(layers), alpha=alpha, sites=kind,
                     unit="residual", norms=norms)


def item_norms(model: Model, direction: Direction, items: Sequence[ChoiceItem],
               config: ValueStudyConfig | None = None) -> ResidualNorms:
    """Mean residual norms at the direction's site on the items' own prompts (the steering unit)."""
    c = (config or ValueStudyConfig()).chat
    return residual_norms(model, Prompts([i.prompt(c) for i in items], chat=c),
                          site=parse_site(direction.sites[0]).kind, layers=[int(x) for x in direction.layers])


@moved_keywords(CHAT_MOVED)
def select_layers(model: Model, vectors: ValueVectors | Direction, items: Sequence[ChoiceItem], *,
                  alpha: float = 0.5, top_k: int = 3, norms: Any = None, auroc: Any = None,
                  config: ValueStudyConfig | None = None, runtime: Runtime | None = None) -> LayerSelection:
    """Steer each layer alone by +-``alpha`` (residual units) on calibration ``items`` and choose the ``top_k``
    layers by held-out separation x effect (the stated :data:`RULE`, recorded in the result)."""
    direction, sep = _unpack(vectors, auroc)
    check_items(model, items, balanced=True)
    if alpha <= 0 or top_k < 1:
        raise ValueError(f"need alpha > 0 and top_k >= 1, got alpha={alpha}, top_k={top_k}")
    if sep.numel() != direction.n_layers:
        raise ValueError(f"{sep.numel()} separation values for {direction.n_layers} layers")
    norms = item_norms(model, direction, items, config) if norms is None else norms
    layers = [int(x) for x in direction.layers]
    base = forced_choice(model, items, config=config, runtime=runtime)
    eff, plus, minus = [], [], []
    for la in layers:
        up = forced_choice(model, items, steer_at(direction, [la], alpha, norms), config=config, runtime=runtime)
        down = forced_choice(model, items, steer_at(direction, [la], -alpha, norms), config=config, runtime=runtime)
        eff.append(float(up.p_pole.mean() - down.p_pole.mean()) / 2)
        plus.append(up.rate()["rate"])
        minus.append(down.rate()["rate"])
    effect = torch.tensor(eff)
    score = (torch.nan_to_num(sep, nan=0.5) - 0.5).clamp_min(0) * effect.clamp_min(0)
    crit = {"score": score, "effect": effect}
    if bool((score > 0).any()):
        picked = choose(LayerRule(("score", "effect"), tol=0.0, tie="lowest", above=0.0, top_k=top_k), crit, layers)
    else:
        warnings.warn(f"select_layers: no layer has a positive separation x effect score (alpha={alpha}); steering "
                      f"at the best layer by effect only, so expect a null", stacklevel=2)
        picked = choose(LayerRule(("effect",), tol=0.0, tie="lowest"), crit, layers)
    chosen = sorted(layers[j] for j in picked.indices)
    return LayerSelection(layers, sep, effect, torch.tensor(plus), torch.tensor(minus), score, chosen, float(alpha),
                          base.rate(), len(items), norms)


__all__ = ["LayerSelection", "RULE", "ValueVectors", "select_layers", "steer_at", "value_vectors"]
