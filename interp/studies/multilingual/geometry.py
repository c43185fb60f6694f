"""Refusal geometry across languages, by layer, from parallel prompts.

The source-language (English) refusal direction at each layer is the difference of means of harmful and harmless
train prompts at the last prompt token (``resid_pre``), unit norm. On the held-out test prompts of each language:
- **projection ratio** (LoDNA's retention): the harmful-minus-harmless gap of the projections on the English
  direction in that language over the same gap in English (1: fully retained, 0: lost), with a bootstrap
  interval over prompt ids (the same resampled ids in every language, since the prompts are parallel) and a
  random-direction control (the same gap along random unit directions, over the English gap);
- **transfer AUROC**: the English direction's projection separating harmful from harmless in that language;
- **cosine drift**: the cosine of a prompt's activation with its English translation's, each language centred on
  its own mean (:func:`probes.similarity.pair_cosines`), matched pairs vs mismatched pairs;
- **own direction**: the language's own difference-of-means direction (its train split), its cosine with the
  English one beside the split-half cosine of two English directions from disjoint halves of the train ids (what
  sampling noise alone leaves) and the random-direction level, and its own test AUROC.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from interp.capturing import capture
from interp.evals.bootstrap import percentile_interval, resample_ids
from interp.evals.metrics import auroc
from interp.models import Model
from interp.studies.kit.moved import moved
from interp.studies.multilingual.data import ParallelSafety
from interp.values import Runtime, moved_keywords
from probes.similarity import pair_cosines, pairing_stats

Acts = dict[str, dict[str, dict[str, torch.Tensor]]]  # acts[kind][split][lang] -> [n, L, d]


@moved_keywords(moved())
def capture_last(model: Model, data: ParallelSafety, layers: list[int], kinds: tuple[str, ...] = ("harmful", "harmless"),
                 splits: tuple[str, ...] = ("train", "val", "test"), runtime: Runtime | None = None) -> Acts:
    """``resid_pre`` of ``layers`` at every prompt's last token (the end of the chat template), float64
    (``runtime``: default batch size 32)."""
    batch_size = runtime.batch_size if runtime is not None else 32
    out: Acts = {}
    for kind in kinds:
        out[kind] = {}
        for split in splits:
            out[kind][split] = {
                lang: capture(model, data.get(kind, split, lang), sites="resid_pre", layers=layers,
                              positions="last",
                              runtime=Runtime(batch_size=batch_size, progress=False)).tensor.double()
                for lang in data.langs}
    return out


def unit(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm(dim=-1, keepdim=True).clamp_min(1e-30)


def mean_diff(h: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Unit difference of means ``[L, d]`` of harmful ``h [n, L, d]`` and harmless ``s [m, L, d]``."""
    return unit(h.mean(0) - s.mean(0))


def _gap(h: torch.Tensor, s: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Mean projection gap ``[..., L]`` on ``r [L, d]`` (or ``[k, L, d]``) of harmful over harmless rows."""
    return torch.einsum("nld,...ld->...l", h, r) / h.shape[0] - torch.einsum("nld,...ld->...l", s, r) / s.shape[0]


@dataclass
class Geometry:
    """Per language, by layer (``[L]`` tensors; intervals ``[2, L]``); see the module docstring."""

    layers: list[int]
    langs: list[str]
    source: str
    direction: torch.Tensor                      # [L, d] the source language's unit refusal direction
    ratio: dict[str, torch.Tensor]
    ratio_ci: dict[str, torch.Tensor]
    random_ratio: dict[str, torch.Tensor]        # mean |gap| along random directions / source gap
    transfer_auroc: dict[str, torch.Tensor]
    drift_matched: dict[str, torch.Tensor]
    drift_mismatched: dict[str, torch.Tensor]
    own_cosine: dict[str, torch.Tensor]
    own_cosine_ci: dict[str, torch.Tensor]
    own_auroc: dict[str, torch.Tensor]
    split_half_cosine: torch.Tensor
    random_cosine: float                         # E|cos| of two random directions in d dimensions
    n_test: int
    n_boot: int


def projection_ratios(test: Mapping[str, Mapping[str, torch.Tensor]], r: torch.Tensor, source: str, n_boot: int,
                      n_random: int, gen: torch.Generator) -> tuple[dict, dict, dict]:
    """Per language: gap ratio ``[L]``, its bootstrap 95% interval ``[2, L]`` and the random-direction level."""
    h, s = test["harmful"], test["harmless"]
    ref = _gap(h[source], s[source], r)
    rand = unit(torch.randn(n_random, *r.shape, generator=gen, dtype=r.dtype))
    bh, bs = resample_ids(h[source].shape[0], n_boot, gen), resample_ids(s[source].shape[0], n_boot, gen)
    boot_ref = torch.stack([_gap(h[source][i], s[source][j], r) for i, j in zip(bh, bs)])
    ratio, ci, rnd = {}, {}, {}
    for lang in h:
        ratio[lang] = _gap(h[lang], s[lang], r) / ref
        boot = torch.stack([_gap(h[lang][i], s[lang][j], r) for i, j in zip(bh, bs)]) / boot_ref
        ci[lang] = torch.stack(percentile_interval(boot))
        rnd[lang] = _gap(h[lang], s[lang], rand).abs().mean(0) / ref.abs()
    return ratio, ci, rnd


def auroc_on(h: torch.Tensor, s: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    scores = torch.cat([torch.einsum("nld,ld->ln", h, r), torch.einsum("nld,ld->ln", s, r)], dim=1)
    y = torch.cat([torch.ones(h.shape[0]), torch.zeros(s.shape[0])]).long()
    return auroc(scores.float(), y).double()


def own_directions(train: Mapping[str, Mapping[str, torch.Tensor]], test: Mapping[str, Mapping[str, torch.Tensor]],
                   r: torch.Tensor, source: str, n_boot: int, gen: torch.Generator) -> tuple[dict, dict, dict, torch.Tensor]:
    """Per language: cosine of its own direction with the source one ``[L]`` (bootstrap interval over train ids),
    its own test AUROC ``[L]``, and the source's split-half cosine ``[L]``."""
    h, s = train["harmful"], train["harmless"]
    cos, ci, own = {}, {}, {}
    for lang in h:
        r_l = mean_diff(h[lang], s[lang])
        cos[lang] = (r_l * r).sum(-1)
        bh, bs = resample_ids(h[lang].shape[0], n_boot, gen), resample_ids(s[lang].shape[0], n_boot, gen)
        boot = torch.stack([(mean_diff(h[lang][i], s[lang][j]) * r).sum(-1) for i, j in zip(bh, bs)])
        ci[lang] = torch.stack(percentile_interval(boot))
        own[lang] = auroc_on(test["harmful"][lang], test["harmless"][lang], r_l)
    nh, ns = h[source].shape[0], s[source].shape[0]
    ph, ps = torch.randperm(nh, generator=gen), torch.randperm(ns, generator=gen)
    a = mean_diff(h[source][ph[: nh // 2]], s[source][ps[: ns // 2]])
    b = mean_diff(h[source][ph[nh // 2:]], s[source][ps[ns // 2:]])
    return cos, ci, own, (a * b).sum(-1)


def drift(test: Mapping[str, Mapping[str, torch.Tensor]], source: str) -> tuple[dict, dict]:
    """Per language: centred matched and mismatched cosines ``[L]`` with the source language's parallel prompts."""
    both = {lang: torch.cat([test["harmful"][lang], test["harmless"][lang]]).transpose(0, 1) for lang in test["harmful"]}
    n = both[source].shape[1]
    matched, mismatched = {}, {}
    for lang, X in both.items():
        m, mm, _ = pairing_stats(pair_cosines(both[source], X, centre=True), torch.arange(n))
        matched[lang], mismatched[lang] = m, mm
    return matched, mismatched


@moved_keywords(moved())
def geometry(acts: Acts, layers: list[int], source: str, n_boot: int = 200, n_random: int = 32,
             runtime: Runtime | None = None) -> Geometry:
    """The module docstring's statistics from :func:`capture_last` activations (``runtime.seed``: the bootstrap's
    and the random directions')."""
    seed = (runtime or Runtime()).seed
    gen = torch.Generator().manual_seed(seed)
    train, test = {k: acts[k]["train"] for k in acts}, {k: acts[k]["test"] for k in acts}
    r = mean_diff(train["harmful"][source], train["harmless"][source])
    ratio, ratio_ci, rnd = projection_ratios(test, r, source, n_boot, n_random, gen)
    cos, cos_ci, own, split_half = own_directions(train, test, r, source, n_boot, gen)
    matched, mismatched = drift(test, source)
    d = r.shape[-1]
    return Geometry(layers, list(test["harmful"]), source, r.float(), ratio, ratio_ci, rnd,
                    {lang: auroc_on(test["harmful"][lang], test["harmless"][lang], r) for lang in test["harmful"]},
                    matched, mismatched, cos, cos_ci, own, split_half, math.sqrt(2 / (math.pi * d)),
                    int(test["harmful"][source].shape[0]), n_boot)


__all__ = ["Acts", "Geometry", "auroc_on", "capture_last", "drift", "geometry", "mean_diff", "own_directions",
           "projection_ratios", "unit"]
