"""Analyses on calibrated trait scales: a corpus's signature in level units (bootstrap intervals, a random-axis
control), and the decomposition of another behaviour direction (sycophancy) onto the trait directions by least
squares, with bootstrap intervals over the items that fitted every direction and a random-vector control.

    sig = corpus_signature(scales, {"news": texts, "chat": other}, model=model); sig.to_frame(); sig.plot()
    syc = capture_contrast(model, sycophancy_items(), SYCOPHANCY_PROMPTS, scales)
    dec = traits_decompose.decompose(scales, syc); dec.summary()   # level steps per trait, R^2, intervals
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from interp.activations import Activations
from interp.bundle import Result
from interp.evals.bootstrap import percentile_interval, resample_ids
from interp.models import Model
from interp.studies.directions.traits import TRAIT_MOVED, TraitConfig, TraitScales, _capture_trait
from interp.values import Prompts, Runtime, moved_keywords
from probes import random_directions

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class TraitSignature(Result):
    """Mean level ``[n_corpora, n_traits]`` of each corpus on each trait (band means, level units) with
    bootstrap percentile intervals ``lo`` / ``hi`` (``n_boot`` resamples of the corpus's texts) and
    ``random``: the same reading along a random axis with the trait's calibration (what no trait reads)."""

    traits: list[str]
    corpora: list[str]
    mean: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor
    random: torch.Tensor
    n: list[int]
    n_boot: int
    model_id: str = ""

    def summary(self) -> dict[str, Any]:
        """Headline numbers: per corpus and trait, the mean level with its 95% bootstrap interval and the random
        axis's reading; texts per corpus."""
        return {"levels": {c: {t: {"level": float(self.mean[i, j]), "ci95": [float(self.lo[i, j]), float(self.hi[i, j])],
                                   "random_axis": float(self.random[i, j])} for j, t in enumerate(self.traits)}
                           for i, c in enumerate(self.corpora)},
                "n": dict(zip(self.corpora, self.n)), "n_boot": self.n_boot, "model_id": self.model_id}

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([{"corpus": c, "trait": t, "level": float(self.mean[i, j]), "lo": float(self.lo[i, j]),
                              "hi": float(self.hi[i, j]), "random_axis": float(self.random[i, j]), "n": self.n[i],
                              "n_boot": self.n_boot, "model_id": self.model_id}
                             for i, c in enumerate(self.corpora) for j, t in enumerate(self.traits)])

    def plot(self) -> Any:
        from interp.viz.directions_traits import interval_bars

        return interval_bars(self.traits, self.corpora, self.mean, self.lo, self.hi, ylabel="level units",
                             title=f"Corpus signatures on the trait scales ({self.model_id}; 95% bootstrap)")


def _capture_like(scales: TraitScales, model: Model | None, texts: Any, batch_size: int) -> Activations:
    if isinstance(texts, Activations):
        return texts
    if model is None:
        raise ValueError("a corpus given as texts needs model=; or pass Activations captured at the scales' sites")
    from interp.capturing import capture

    sites = next(iter(scales.scales.values())).sites
    return capture(model, Prompts.of(texts), sites=sites, positions=scales.positions,
                   runtime=Runtime(batch_size=batch_size, progress=False))


def _random_reading(scales: TraitScales, trait: str, X: Any, seed: int) -> torch.Tensor:
    """Band-mean level reading ``[n]`` along a random axis, centred on the trait's training items, same slope."""
    s = scales[trait]
    r = random_directions(s.graded.direction.vectors.shape[-1], n_layers=len(s.sites), sites=s.sites, seed=seed)[0]
    centre = r.project(scales.acts[trait]).double().mean(0)
    mid = (len(s.levels) - 1) / 2
    return ((r.project(X).double() - centre) * s.slope + mid)[:, s.band].mean(1)


@moved_keywords({**TRAIT_MOVED, "chat": "corpora={name: interp.Prompts(texts, chat=...)}"})
def corpus_signature(scales: TraitScales, corpora: Mapping[str, Prompts | Sequence[str] | Activations], *,
                     model: Model | None = None, config: TraitConfig | None = None,
                     runtime: Runtime | None = None) -> TraitSignature:
    """Each corpus (texts or :class:`interp.Prompts` captured like the scales' items but with no system prompt, or
    Activations at the same sites) read in level units on every trait that has a band; intervals from
    ``config.n_boot`` bootstrap resamples of its texts (seed ``runtime.seed``)."""
    n_boot, run = (config or TraitConfig()).n_boot, Runtime.of(runtime)
    seed, batch_size = run.seed, run.batch_size
    if not corpora:
        raise ValueError("corpora is empty; give {name: texts}")
    traits = [t for t in scales.traits if scales[t].band]
    if not traits:
        raise ValueError("no trait has a band to read a corpus on; rerun trait_scales with a looser BandRule")
    g = torch.Generator().manual_seed(seed)
    rows = []
    for texts in corpora.values():
        X = _capture_like(scales, model, texts, batch_size)
        lv = torch.stack([scales[t].level(X) for t in traits], 1).double()               # [n, T]
        idx = resample_ids(len(lv), n_boot, g)
        boot = lv[idx].mean(1)                                                           # [B, T]
        rnd = torch.stack([_random_reading(scales, t, X, seed + 1).mean() for t in traits])
        rows.append((lv.mean(0), *(x.float() for x in percentile_interval(boot)), rnd, len(lv)))
    return TraitSignature(traits, list(corpora), torch.stack([r[0] for r in rows]).float(),
                          torch.stack([r[1] for r in rows]), torch.stack([r[2] for r in rows]),
                          torch.stack([r[3] for r in rows]).float(), [r[4] for r in rows], n_boot, scales.model_id)


@moved_keywords(TRAIT_MOVED)
def capture_contrast(model: Model, items: Sequence[str], prompts: Mapping[str, str], scales: TraitScales, *,
                     config: TraitConfig | None = None, runtime: Runtime | None = None) -> Activations:
    """The items under each of two system prompts (``{negative: ..., positive: ...}``, in that order), captured at
    the scales' sites and positions; labels are the prompt names, prompt ids ``contrast:<name>:<i>``."""
    if len(prompts) != 2:
        raise ValueError(f"a contrast needs exactly two system prompts (negative, positive); got {list(prompts)}")
    if len(items) < 4:
        raise ValueError(f"{len(items)} contrast items; give at least 4 (the study writes 64)")
    first = next(iter(scales.scales.values()))
    layers = [int(x) for x in first.graded.direction.layers]
    return _capture_trait(model, "contrast", list(items), prompts, scales.site, layers, scales.positions,
                          Runtime.of(runtime).batch_size, (config or TraitConfig()).chat)


__all__ = ["TraitSignature", "capture_contrast", "corpus_signature"]
