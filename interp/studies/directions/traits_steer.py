"""Steering along a calibrated trait scale in level units: ``k`` level units are added over the trait's band
(``k / len(band)`` level steps at each band layer, a step being the level spacing measured on the projection),
with the same strength as a fraction of each layer's mean residual norm recorded beside it.

    st = steer_levels(model, scales, "extraversion", prompts, ks=(-2, 0, 2))
    st.to_frame()          # the generations at each k;  st.plot(): level read out vs k against random controls
    sweep = level_sweep(model, scales, "extraversion", prompts, [0, 1, 2], metric, on="logits")  # with KL cost
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

import steering
from interp.bundle import Result
from interp.capturing import capture
from interp.models import Model
from interp.studies.directions.traits import TraitScales
from interp.values import Prompts, Runtime
from steering.sweep import AlphaSweep

if TYPE_CHECKING:
    import pandas as pd


def level_vector(scales: TraitScales, trait: str, k: float = 1.0) -> steering.AddVector:
    """An edit adding ``k`` level units of ``trait`` over its band (raw vectors: unit direction x spacing / B)."""
    s = scales[trait]
    if not s.band:
        raise ValueError(f"{trait} has no band to steer in ({s.band_note}); rerun trait_scales with a looser rule")
    layers = [int(s.graded.direction.layers[j]) for j in s.band]
    vecs = {layer: s.graded.direction.vectors[j] * float(s.spacing[j]) / len(s.band)
            for layer, j in zip(layers, s.band, strict=True)}
    return steering.AddVector(vecs, layers=layers, alpha=float(k), sites=scales.site)


def residual_fraction(model: Model, scales: TraitScales, trait: str, prompts: Sequence[str], chat: bool = True
                      ) -> dict[int, float]:
    """``{layer: fraction of the mean residual norm}`` that one level unit adds at each band layer."""
    iv = level_vector(scales, trait, 1.0)
    norms = steering.residual_norms(model, Prompts(list(prompts), chat=chat), layers=iv.layers,
                                     site=scales.site)
    return {layer: v / norms.at(layer) for layer, v in iv.added_norms(model).items()}


@dataclass
class TraitSteering(Result):
    """Generations at each ``k`` (level units over the band), the level read out on the prompts' own tokens under
    each edit (``read [n_k]``), the same for same-strength random directions (``random [n_random, n_k]``), the
    unsteered reading, and ``residual_fraction``: each band layer's added norm per level unit / its residual norm."""

    trait: str
    ks: list[float]
    texts: dict[float, list[str]]
    read: torch.Tensor
    random: torch.Tensor
    baseline: float
    band: list[int]
    residual_fraction: dict[int, float]
    model_id: str = ""
    prompts: list[str] = field(default_factory=list)

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([{"trait": self.trait, "k": k, "prompt": p, "text": t, "read": float(self.read[i])}
                             for i, k in enumerate(self.ks) for p, t in zip(self.prompts, self.texts[k], strict=True)])

    def plot(self) -> Any:
        from interp.viz.steering import alpha_curve

        return alpha_curve(self.ks, self.read, self.random, self.baseline, metric=f"{self.trait} level read out",
                           title=f"Steering {self.trait} by k level units over layers {self.band} ({self.model_id})")


def _read(model: Model, scales: TraitScales, trait: str, prompts: list[str], ivs: tuple, chat: bool) -> float:
    """Mean band level of the prompts' activations with ``ivs`` attached."""
    sites = scales[trait].sites
    with steering.apply(model, *ivs):
        acts = capture(model, Prompts(prompts, chat=chat), sites=sites, positions=scales.positions,
                       runtime=Runtime(progress=False))
    return float(scales[trait].level(acts).mean())


def steer_levels(model: Model, scales: TraitScales, trait: str, prompts: Sequence[str],
                 ks: Sequence[float] = (-2.0, 0.0, 2.0), *, max_new_tokens: int = 40, n_random: int = 1, seed: int = 0,
                 chat: bool = True, batch_size: int = 16) -> TraitSteering:
    """Greedy generations of ``prompts`` with ``k`` level units of ``trait`` added over its band, for each ``k``,
    and the level read out under each edit against ``n_random`` same-strength random directions."""
    if isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings")
    prompts = list(prompts)
    ks = [float(k) for k in ks]
    texts, read, rnd = {}, [], [[] for _ in range(n_random)]
    for k in ks:
        iv = level_vector(scales, trait, k)
        gens = steering.generate(model, Prompts(prompts, chat=chat), iv, max_new_tokens=max_new_tokens,
                                 runtime=Runtime(batch_size=batch_size, progress=False))
        texts[k] = list(gens.texts)
        read.append(_read(model, scales, trait, prompts, (iv,), chat))
        for j in range(n_random):
            rnd[j].append(_read(model, scales, trait, prompts, (iv.random_like(model, seed=seed + j),), chat))
    s = scales[trait]
    return TraitSteering(trait, ks, texts, torch.tensor(read), torch.tensor(rnd).reshape(n_random, len(ks)),
                         _read(model, scales, trait, prompts, (), chat),
                         [int(s.graded.direction.layers[j]) for j in s.band],
                         residual_fraction(model, scales, trait, prompts, chat), model.name, prompts)


def level_sweep(model: Model, scales: TraitScales, trait: str, prompts: Sequence[str], ks: Sequence[float],
                metric: Callable[[Any], Any], **kwargs: Any) -> AlphaSweep:
    """:func:`steering.alpha_sweep` with alpha in level units of ``trait`` (behaviour, KL / CE cost, random
    controls of the same strength); keyword arguments go to it."""
    return steering.alpha_sweep(model, prompts, lambda k: level_vector(scales, trait, k), ks, metric, **kwargs)


__all__ = ["TraitSteering", "level_sweep", "level_vector", "residual_fraction", "steer_levels"]
