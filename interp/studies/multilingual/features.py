"""SAE features for safety by language: an SAE on the model's residual stream at one layer (trained here on every
language's train prompts, or given), each language's safety features (the latents whose last-token activation best
separates harmful from harmless train prompts of that language, by AUROC), how many are shared across languages
(against the ``t^2 / d_sae`` a random draw would share), and the effect of ablating a language's features (the SAE
error term kept, :class:`sae.edits.LatentAblation`, at every token) on that language's harmful test prompts: the
refusal rate (:func:`evals.judge_languages.is_refusal_multilingual`) and the share of answers written in the
prompt's language (:func:`evals.judge_languages.detect_language`), beside ablating as many random latents drawn
from those active on the same prompts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import torch

import steering
from interp.capturing import capture
from interp.evals.controls import as_rng, matched_random
from interp.evals.judge_languages import detect_language, is_refusal_multilingual
from interp.evals.rates import rate
from interp.models import Model
from interp.studies.kit.moved import moved
from interp.studies.multilingual.data import ParallelSafety
from interp.values import Runtime, moved_keywords
from sae.analysis import encode_tokens, separating_latents
from sae.edits import LatentAblation
from sae.model import SAE
from sae.runner import site_tokens
from sae.trainer import train_sae


@dataclass
class LanguageFeatures:
    """``features[lang]``: the language's top safety latents (best first) and their train AUROCs; ``shared[(a, b)]``:
    how many two languages share; ``rows``: one per (language, condition) with refusal and same-language rates."""

    layer: int
    d_sae: int
    top: int
    features: dict[str, list[int]]
    aurocs: dict[str, list[float]]
    shared: dict[tuple[str, str], int]
    common: list[int]
    chance_shared: float
    rows: list[dict[str, Any]]
    sae_quality: dict[str, float] = field(default_factory=dict)


@moved_keywords(moved())
def fit_sae(model: Model, data: ParallelSafety, layer: int, expansion: int = 4, k: int = 32, epochs: int = 20,
            runtime: Runtime | None = None) -> tuple[SAE, dict[str, float]]:
    """A TopK SAE on ``resid_pre.{layer}`` over every token of every language's train prompts (chat template
    applied; padding left out), and its fraction of variance unexplained on those tokens (``runtime.seed``
    seeds the training)."""
    seed = (runtime or Runtime()).seed
    prompts = [p for kind in data.prompts for lang in data.langs for p in data.get(kind, "train", lang)]
    xs = []
    for x, batch in site_tokens(model, f"resid_pre.{layer}", prompts, batch_size=16):
        xs.append(x[batch.attention_mask.bool()])
    X = torch.cat(xs)
    bs = min(1024, X.shape[0])
    res = train_sae(X, arch="topk", expansion=expansion, k=k, total_tokens=bs * max(1, epochs * X.shape[0] // bs),
                    batch_size=bs, seed=seed, progress=False)
    with torch.no_grad():
        rec = res.sae(X.to(res.sae.device)).to(X.dtype)
    fvu = float(((X - rec) ** 2).sum() / ((X - X.mean(0)) ** 2).sum())
    return res.sae, {"fvu": round(fvu, 4), "tokens": int(X.shape[0]), "dead_fraction": round(res.dead_fraction, 4)}


def _last(model: Model, prompts: list[str], layer: int) -> torch.Tensor:
    return capture(model, prompts, sites=f"resid_pre.{layer}", positions="last",
                   runtime=Runtime(progress=False)).tensor[:, 0]


def _rate_rows(lang: str, cond: str, texts: list[str]) -> dict[str, Any]:
    same = rate([detect_language(t) == lang for t in texts]).columns()
    return {"lang": lang, "condition": cond, **rate([is_refusal_multilingual(t) for t in texts]).columns(),
            "same_language": same["rate"], "same_low": same["low"], "same_high": same["high"]}


@moved_keywords(moved())
def features_by_language(model: Model, data: ParallelSafety, layer: int, sae: SAE | None = None, top: int = 8,
                         max_new_tokens: int = 32, runtime: Runtime | None = None) -> LanguageFeatures:
    """The study of the module docstring (``sae`` None: :func:`fit_sae` first). ``runtime``: the seed of the SAE
    and the random latents, the batch size of the baseline generation (default 32)."""
    rt = runtime if runtime is not None else Runtime(batch_size=32, progress=False)
    seed = rt.seed
    quality: dict[str, float] = {}
    if sae is None:
        sae, quality = fit_sae(model, data, layer, runtime=rt)
    site = f"blocks.{layer}.hook_resid_pre"
    feats, aurocs = {}, {}
    for lang in data.langs:
        sep = separating_latents(sae, _last(model, data.get("harmful", "train", lang), layer),
                                 _last(model, data.get("harmless", "train", lang), layer), top=top, by="auroc")
        feats[lang] = sep.ranking.indices.tolist()
        aurocs[lang] = [round(float(sep.auroc[i]), 4) for i in feats[lang]]
    shared = {(a, b): len(set(feats[a]) & set(feats[b])) for a, b in combinations(data.langs, 2)}
    common = sorted(set.intersection(*(set(v) for v in feats.values())))
    rng = as_rng(seed)
    tests = {lang: data.get("harmful", "test", lang) for lang in data.langs}
    # the baseline has no per-language edit: one generation call for every language (shared batches)
    every = steering.generate(model, [p for ps in tests.values() for p in ps], max_new_tokens=max_new_tokens,
                              runtime=Runtime(batch_size=rt.batch_size, progress=False)).texts
    rows, at = [], 0
    for lang, prompts in tests.items():
        active = (encode_tokens(sae, _last(model, prompts, layer)) > 0).any(0).nonzero()[:, 0]
        pool = [int(i) for i in active if int(i) not in set(feats[lang])] or list(range(sae.d_sae))
        rand = matched_random(feats[lang], lambda _, pool=pool: pool, rng, n=min(top, len(pool)), what="latent")
        rows.append(_rate_rows(lang, "baseline", list(every[at:at + len(prompts)])))
        at += len(prompts)
        for cond, ivs in (("ablate own features", (LatentAblation(sae, feats[lang], site=site),)),
                          ("ablate random features", (LatentAblation(sae, rand, site=site),))):
            texts = steering.generate(model, prompts, *ivs, max_new_tokens=max_new_tokens,
                                      runtime=Runtime(progress=False)).texts
            rows.append(_rate_rows(lang, cond, list(texts)))
    return LanguageFeatures(layer, sae.d_sae, top, feats, aurocs, shared, common, top * top / sae.d_sae, rows, quality)


__all__ = ["LanguageFeatures", "features_by_language", "fit_sae"]
