"""Calibrated trait scales (the Big Five persona-vector study): one graded direction per trait from statements
answered under system prompts of increasing intensity, a middle-layer band chosen by a stated rule, and a scale
mapping each layer's projection to level units (level ``i`` -> ``i``), with held-out checks and a binary AUROC.

    scales = trait_scales(model, {"extraversion": questions, ...})          # levels: LEVEL_PROMPTS
    scales.summary(); scales.plot(); scales["extraversion"].level(acts)       # level units, band mean

Signatures of a corpus and the decomposition of another direction onto the traits are in
:mod:`interp.studies.directions.traits_analysis`; steering along a scale in :mod:`interp.studies.directions.traits_steer`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from interp.activations import Activations
from interp.bundle import Result
from interp.capturing import capture
from interp.chat import has_chat_template
from interp.models import Model
from interp.studies.directions.moved import moved_into
from interp.studies.directions.traits_band import BandRule, choose_band
from interp.studies.directions.traits_data import LEVEL_PROMPTS
from interp.values import Prompts, Runtime, moved_keywords
from probes import CVConfig, cross_validate, graded_direction
from probes.folds import make_folds
from probes.graded import GradedDirection
from probes.validation import ProbeScores

if TYPE_CHECKING:
    import pandas as pd


def affine_to_levels(level_means: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-layer ``(slope, intercept) [L]`` of the least-squares line sending level means ``[L, k]`` (projection
    units) to ``0..k-1``; ``1 / slope`` is the level spacing on the projection."""
    m = level_means.double()
    idx = torch.arange(m.shape[1], dtype=torch.float64)
    mc = m - m.mean(1, keepdim=True)
    slope = (mc * (idx - idx.mean())).sum(1) / (mc ** 2).sum(1).clamp_min(1e-30)
    return slope, idx.mean() - slope * m.mean(1)


@dataclass
class TraitScale:
    """One trait: its graded direction (``graded``, with held-out ordering stats), the calibration ``slope`` /
    ``intercept [n_layers]`` (projection -> level units, fitted on the levels' means), the ``band`` (indices
    into ``sites``; empty when no layer met the rule), ``heldout_error [n_folds, n_layers]`` (mean absolute level
    error of held-out items, direction and calibration fitted on the other folds), and ``auroc`` (highest vs
    lowest level, :func:`probes.cross_validate` by question)."""

    trait: str
    levels: list[str]
    graded: GradedDirection
    slope: torch.Tensor
    intercept: torch.Tensor
    band: list[int]
    heldout_error: torch.Tensor
    auroc: ProbeScores
    band_note: str = ""

    @property
    def sites(self) -> list[str]:
        return self.graded.sites

    @property
    def spacing(self) -> torch.Tensor:
        """Projection units per level ``[n_layers]`` (the step between adjacent levels on the direction)."""
        return 1.0 / self.slope

    def to_level(self, X: Any) -> torch.Tensor:
        """Level units ``[n, n_layers]`` of activations (Activations at the same sites, or ``[n, L, d]``)."""
        proj = self.graded.direction.project(X).double()
        return proj * self.slope + self.intercept

    def level(self, X: Any) -> torch.Tensor:
        """Level units ``[n]``: the mean of :meth:`to_level` over the band's layers."""
        if not self.band:
            raise ValueError(f"{self.trait}: no band ({self.band_note}); read to_level(X)[:, layer] at a layer you "
                             f"choose, or rerun with a looser band rule")
        return self.to_level(X)[:, self.band].mean(1)


@dataclass
class TraitScales(Result):
    """Scales for several traits on one model, site and position rule, with the band ``rule`` they share.

    ``acts[trait]`` keeps the captured activations (labels: level names; ``groups[trait]``: question index) so
    analyses can refit on resamples of the items."""

    scales: dict[str, TraitScale]
    rule: BandRule
    model_id: str
    site: str
    positions: str
    acts: dict[str, Activations] = field(repr=False, default_factory=dict)
    groups: dict[str, list[int]] = field(repr=False, default_factory=dict)

    def __getitem__(self, trait: str) -> TraitScale:
        if trait not in self.scales:
            raise KeyError(f"no scale for {trait!r}; traits here: {list(self.scales)}")
        return self.scales[trait]

    @property
    def traits(self) -> list[str]:
        return list(self.scales)

    def to_level(self, X: Any) -> dict[str, torch.Tensor]:
        """``{trait: level units [n]}`` (band means) of the same activations on every trait."""
        return {t: s.level(X) for t, s in self.scales.items()}

    def to_frame(self) -> pd.DataFrame:
        """One row per (trait, layer): held-out order, adjacent d (min over pairs), AUROC, calibration, band."""
        from interp.studies.directions.traits_frames import scales_frame

        return scales_frame(self)

    def table(self) -> pd.DataFrame:
        """One row per trait: ordered layers, band, adjacent d in the band, best AUROC, calibration error."""
        from interp.studies.directions.traits_frames import scales_summary

        return scales_summary(self)

    def summary(self) -> dict[str, Any]:
        """Headline numbers: per trait, :meth:`table`'s row (JSON-ready)."""
        rows = json.loads(self.table().to_json(orient="records"))
        return {"model_id": self.model_id, "site": self.site, "traits": dict(zip(self.traits, rows, strict=True))}

    def plot(self, what: str = "adjacent_d") -> Any:
        """Per-trait curves by layer (``adjacent_d``: held-out min adjacent d; ``auroc``; ``error``) with bands."""
        from interp.studies.directions.traits_frames import scales_plot

        return scales_plot(self, what)


def _prompts_at(model: Model, questions: list[str], system: str, chat: bool) -> tuple[list[str], str | None, bool]:
    """A level's prompts: the system prompt in the chat template, or prepended to the text without one."""
    if chat and has_chat_template(model):
        return questions, system, True
    return [f"{system}\n\n{q}" for q in questions], None, False


def _capture_trait(model: Model, trait: str, questions: list[str], levels: Mapping[str, str], site: str,
                   layers: Sequence[int] | None, positions: Any, batch_size: int, chat: bool) -> Activations:
    parts = []
    for level, system in levels.items():
        prompts, sys_arg, use_chat = _prompts_at(model, questions, system, chat)
        parts.append(capture(model,
                             Prompts(prompts, chat=use_chat, system=sys_arg, labels=[level] * len(questions), ids=[f"{trait}:{level}:{i}" for i in range(len(questions))]),
                             sites=site, layers=layers, positions=positions,
                             runtime=Runtime(batch_size=batch_size, progress=False)))
    return Activations.concat(parts)


def _calibration_error(X: torch.Tensor, ylev: torch.Tensor, groups: list[int], order: list[str], n_folds: int,
                       seed: int) -> torch.Tensor:
    """Held-out mean absolute level error ``[n_folds, L]``: direction and calibration fitted on the other folds."""
    names = [order[i] for i in ylev.tolist()]
    out = []
    for fold in make_folds(ylev, n_folds, groups, seed):
        tr = fold.train.tolist()
        g = graded_direction(X[fold.train], [names[i] for i in tr], order=order, n_folds=None, warn=False)
        a, b = affine_to_levels(g.level_means)
        pred = g.direction.project(X[fold.test]).double() * a + b
        out.append((pred - ylev[fold.test, None].double()).abs().mean(0))
    return torch.stack(out).float()


def _check_inputs(statements_by_trait: Mapping[str, Sequence[str]], levels: Mapping[str, Mapping[str, str]],
                  n_folds: int) -> None:
    if not statements_by_trait:
        raise ValueError("statements_by_trait is empty; give {trait: [statement, ...]} for at least one trait")
    for trait, qs in statements_by_trait.items():
        if trait not in levels:
            raise ValueError(f"unknown trait {trait!r}: no level prompts for it; known traits: {sorted(levels)}. "
                             f"Pass levels={{{trait!r}: {{'low': ..., 'moderate': ..., 'high': ...}}, ...}}")
        if len(levels[trait]) < 3:
            raise ValueError(f"{trait}: {len(levels[trait])} levels {list(levels[trait])}; a graded scale needs at "
                             f"least 3 ordered levels (low -> high system prompts)")
        if isinstance(qs, str) or len(qs) < max(2, n_folds):
            n = 1 if isinstance(qs, str) else len(qs)
            raise ValueError(f"{trait}: {n} statement(s); each level needs at least {max(2, n_folds)} items "
                             f"(one per held-out fold, n_folds={n_folds}); give more statements or fewer n_folds")


@dataclass(frozen=True)
class TraitConfig:
    """The trait studies' tuning knobs: the band ``rule``, ``n_folds`` held-out folds, the AUROC probe's ``l2``,
    ``on_empty`` (``"raise"`` refuses a trait no layer passes, ``"report"`` keeps it with an empty band), ``chat``
    (the model's chat template with the level prompt as system prompt; ``False``: the level prompt prepended to
    the plain text), ``n_random`` random controls of :func:`~interp.studies.directions.traits_steer.steer_levels`
    and ``n_boot`` bootstrap resamples of a corpus signature."""

    rule: BandRule = BandRule()
    n_folds: int = 5
    l2: float = 1e-2
    on_empty: str = "raise"
    chat: bool = True
    n_random: int = 1
    n_boot: int = 1000

    def __post_init__(self) -> None:
        if not isinstance(self.rule, BandRule):
            raise TypeError(f"rule must be a BandRule, got {type(self.rule).__name__}")
        if self.on_empty not in ("raise", "report"):
            raise ValueError(f"on_empty must be 'raise' or 'report', got {self.on_empty!r}")
        if self.n_folds < 2 or self.l2 < 0 or self.n_random < 0 or self.n_boot < 1:
            raise ValueError(f"need n_folds >= 2, l2 >= 0, n_random >= 0 and n_boot >= 1, got n_folds={self.n_folds}, "
                             f"l2={self.l2}, n_random={self.n_random}, n_boot={self.n_boot}")
        if not isinstance(self.chat, bool):
            raise TypeError(f"chat must be True or False, got {self.chat!r}")


TRAIT_MOVED = moved_into(TraitConfig)
"""The keywords the trait studies took before ``config=`` / ``runtime=``, and where each went."""


@moved_keywords(TRAIT_MOVED)
def fit_scale(trait: str, acts: Activations, groups: list[int], order: list[str], n_layers: int, *,
              config: TraitConfig | None = None, runtime: Runtime | None = None) -> TraitScale:
    """One trait's scale from captured level activations (labels: level names, ``groups``: question index)."""
    cfg, seed = config or TraitConfig(), Runtime.of(runtime).seed
    rule, n_folds, l2, on_empty = cfg.rule, cfg.n_folds, cfg.l2, cfg.on_empty
    g = graded_direction(acts, order=order, groups=groups, n_folds=n_folds, seed=seed, warn=False)
    slope, intercept = affine_to_levels(g.level_means)
    band, note = choose_band(g, rule, n_layers, trait, on_empty)
    X = acts.tensor
    ylev = torch.tensor([order.index(str(x)) for x in acts.labels])
    err = _calibration_error(X, ylev, groups, order, n_folds, seed)
    ends = (ylev == 0) | (ylev == len(order) - 1)
    idx = ends.nonzero().flatten()
    scores = cross_validate(acts[idx.tolist()], (ylev[idx] > 0).long(), groups=[groups[i] for i in idx.tolist()],
                            config=CVConfig(n_folds, l2=l2), runtime=Runtime(seed=seed, progress=False))
    return TraitScale(trait=trait, levels=order, graded=g, slope=slope.float(), intercept=intercept.float(),
                      band=band, heldout_error=err, auroc=scores, band_note=note)


@moved_keywords(TRAIT_MOVED)
def trait_scales(model: Model, statements_by_trait: Mapping[str, Sequence[str]], *,
                 levels: Mapping[str, Mapping[str, str]] = LEVEL_PROMPTS, layers: Sequence[int] | None = None,
                 site: str = "resid_post", positions: Any = "last", config: TraitConfig | None = None,
                 runtime: Runtime | None = None) -> TraitScales:
    """Calibrated scales for each trait in ``statements_by_trait`` (``{trait: statements}``).

    Every statement is captured under each of the trait's level system prompts (``levels[trait]``: ordered
    ``{level: system prompt}``, low -> high; without a chat template the prompt is prepended to the text). The
    direction is :func:`probes.graded_direction` (trend, groups = the statement, ``config.n_folds`` held-out folds);
    the band follows ``config.rule`` (see :class:`BandRule` and ``config.on_empty``); AUROC of highest vs lowest
    level is a logistic probe through :func:`probes.cross_validate` (``config.l2``) on the same question groups.
    """
    cfg, run = config or TraitConfig(), Runtime.of(runtime)
    _check_inputs(statements_by_trait, levels, cfg.n_folds)
    scales, acts, groups = {}, {}, {}
    for trait, qs in statements_by_trait.items():
        qs = list(qs)
        order = list(levels[trait])
        acts[trait] = _capture_trait(model, trait, qs, levels[trait], site, layers, positions, run.batch_size,
                                     cfg.chat)
        groups[trait] = list(range(len(qs))) * len(order)
        scales[trait] = fit_scale(trait, acts[trait], groups[trait], order, model.n_layers, config=cfg, runtime=run)
    return TraitScales(scales=scales, rule=cfg.rule, model_id=model.name, site=site, positions=str(positions),
                       acts=acts, groups=groups)


__all__ = ["TRAIT_MOVED", "TraitConfig", "TraitScale", "TraitScales", "affine_to_levels", "fit_scale", "trait_scales"]
