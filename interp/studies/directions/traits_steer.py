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
from interp.studies.directions.traits import TRAIT_MOVED, TraitConfig, TraitScales
from interp.values import Prompts, Runtime, moved_keywords
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


@moved_keywords(TRAIT_MOVED)
def residual_fraction(model: Model, scales: TraitScales, trait: str, prompts: Prompts | Sequence[str]
                      ) -> dict[int, float]:
    """``{layer: fraction of the mean residual norm}`` that one level unit adds at each band layer (norms of
    ``prompts``, formatted as they say: ``Prompts.chat`` / ``system``)."""
    iv = level_vector(scales, trait, 1.0)
    p = Prompts.of(prompts)
    norms = steering.residual_norms(model, p, layers=iv.layers, site=scales.site)
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

    def summary(self) -> dict[str, Any]:
        """Headline numbers: the level read out at each ``k`` against the mean of the random directions', the
        unsteered reading, the slope (level read per level unit added) of each, and the band."""
        ks = torch.tensor(self.ks, dtype=torch.float64)
        rand = self.random.double().mean(0) if self.random.numel() else None

        def slope(y: torch.Tensor) -> float | None:
            kc = ks - ks.mean()
            return float((kc * (y.double() - y.double().mean())).sum() / (kc ** 2).sum()) if len(ks) > 1 else None
        return {"trait": self.trait, "baseline": self.baseline,
                "read": {f"{k:g}": float(self.read[i]) for i, k in enumerate(self.ks)},
                "random": None if rand is None else {f"{k:g}": float(rand[i]) for i, k in enumerate(self.ks)},
                "slope": slope(self.read), "random_slope": None if rand is None else slope(rand),
                "band": list(self.band), "n_prompts": len(self.prompts), "n_random": int(self.random.shape[0])}

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([{"trait": self.trait, "k": k, "prompt": p, "text": t, "read": float(self.read[i])}
                             for i, k in enumerate(self.ks) for p, t in zip(self.prompts, self.texts[k], strict=True)])

    def plot(self) -> Any:
        from interp.viz.steering import alpha_curve

        return alpha_curve(self.ks, self.read, self.random, self.baseline, metric=f"{self.trait} level read out",
                           title=f"Steering {self.trait} by k level units over layers {self.band} ({self.model_id})")


def _read(model: Model, scales: TraitScales, trait: str, prompts: Prompts, ivs: tuple) -> float:
    """Mean band level of the prompts' activations with ``ivs`` attached."""
    sites = scales[trait].sites
    with steering.apply(model, *ivs):
        acts = capture(model, prompts, sites=sites, positions=scales.positions,
                       runtime=Runtime(progress=False))
    return float(scales[trait].level(acts).mean())


@moved_keywords({**TRAIT_MOVED, "chat": "prompts=interp.Prompts(texts, chat=...)"})
def steer_levels(model: Model, scales: TraitScales, trait: str, prompts: Prompts | Sequence[str],
                 ks: Sequence[float] = (-2.0, 0.0, 2.0), *, max_new_tokens: int = 40,
                 config: TraitConfig | None = None, runtime: Runtime | None = None) -> TraitSteering:
    """Greedy generations of ``prompts`` with ``k`` level units of ``trait`` added over its band, for each ``k``,
    and the level read out under each edit against ``config.n_random`` same-strength random directions (seeds
    ``runtime.seed + j``)."""
    if isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings")
    p = Prompts.of(prompts)
    n_random, run = (config or TraitConfig()).n_random, Runtime.of(runtime)
    ks = [float(k) for k in ks]
    texts, read, rnd = {}, [], [[] for _ in range(n_random)]
    for k in ks:
        iv = level_vector(scales, trait, k)
        gens = steering.generate(model, p, iv, max_new_tokens=max_new_tokens,
                                 runtime=Runtime(batch_size=run.batch_size, progress=False))
        texts[k] = list(gens.texts)
        read.append(_read(model, scales, trait, p, (iv,)))
        for j in range(n_random):
            rnd[j].append(_read(model, scales, trait, p, (iv.random_like(model, seed=run.seed + j),)))
    s = scales[trait]
    return TraitSteering(trait, ks, texts, torch.tensor(read), torch.tensor(rnd).reshape(n_random, len(ks)),
                         _read(model, scales, trait, p, ()),
                         [int(s.graded.direction.layers[j]) for j in s.band],
                         residual_fraction(model, scales, trait, p), model.name, list(p.texts))


def level_sweep(model: Model, scales: TraitScales, trait: str, prompts: Sequence[str], ks: Sequence[float],
                metric: Callable[[Any], Any], **kwargs: Any) -> AlphaSweep:
    """:func:`steering.alpha_sweep` with alpha in level units of ``trait`` (behaviour, KL / CE cost, random
    controls of the same strength); keyword arguments go to it."""
    return steering.alpha_sweep(model, prompts, lambda k: level_vector(scales, trait, k), ks, metric, **kwargs)


__all__ = ["TraitSteering", "level_sweep", "level_vector", "residual_fraction", "steer_levels"]
