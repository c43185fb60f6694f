"""Cross-language similarity of parallel prompts by layer: is a sentence closer to its own translation than to other
sentences of the other language?

Every language's activations are centred on that language's own mean (per layer) before the cosine, which removes
what all sentences of a language share; the raw, uncentred cosine is reported beside it (it is dominated by the
components all prompts share, so matched and mismatched pairs look alike). For each ordered pair of languages:
matched-pair cosine (a sentence and its translation), the mismatched-pair baseline (every other pairing), retrieval
accuracy (the nearest other-language neighbour is the translation; chance 1/n) with its Wilson interval, and a
shuffled-pairing control (the same statistics against a seeded random pairing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import permutations as ordered_pairs
from typing import Any

import pandas as pd
import torch

from interp.bundle import Result
from interp.evals.rates import wilson
from interp.models import Model
from interp.studies.directions.similarity_data import MEAN_AFTER_FIRST, item_activations
from interp.viz.directions_similarity import cross_language_by_layer
from probes.layers import LayerRule, choose
from probes.similarity import pair_cosines, pairing_stats, permutations

KEYS = ("matched", "mismatched", "retrieval", "raw_matched", "raw_mismatched", "raw_retrieval",
        "shuffled_matched", "shuffled_retrieval")
BEST_GAP = LayerRule(("gap",), tol=0.0, tie="lowest")   # the summary's layer: the largest matched - mismatched gap


def check_parallel(parallel: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """``parallel`` as ``{lang: [text, ...]}`` with >= 2 languages and one translation of each of >= 3 sentences in
    every language."""
    par = {str(k): [str(t) for t in v] for k, v in parallel.items()}
    if len(par) < 2:
        raise ValueError(f"cross-language similarity needs >= 2 languages, got {list(par)}")
    counts = {k: len(v) for k, v in par.items()}
    if len(set(counts.values())) != 1:
        raise ValueError(f"parallel prompts must hold one translation of every sentence in each language (aligned by "
                         f"index), got unequal counts {counts}")
    if next(iter(counts.values())) < 3:
        raise ValueError(f"need at least 3 parallel sentences per language, got {counts}")
    return par


def language_stats(acts: Mapping[str, torch.Tensor], seed: int = 0) -> dict[tuple[str, str], torch.Tensor]:
    """``{(source, target): stats [len(KEYS), L]}`` over ordered pairs of languages from ``acts {lang: X [L, n, d]}``."""
    langs = list(acts)
    n = acts[langs[0]].shape[-2]
    ident = torch.arange(n)
    shuffled = permutations(n, 1, seed)[0]
    out = {}
    for a, b in ordered_pairs(langs, 2):
        C, R = pair_cosines(acts[a], acts[b], True), pair_cosines(acts[a], acts[b], False)
        m, mm, ret = pairing_stats(C, ident)
        rm, rmm, rret = pairing_stats(R, ident)
        sm, _, sret = pairing_stats(C, shuffled)
        out[(a, b)] = torch.stack([m, mm, ret, rm, rmm, rret, sm, sret])
    return out


@dataclass
class CrossLanguageSimilarity(Result):
    """Per ordered language pair, ``stats[(source, target)] [len(KEYS), L]`` (rows named by :data:`KEYS`); ``n``
    sentences per language."""

    layers: list[int]
    languages: list[str]
    n: int
    stats: dict[tuple[str, str], torch.Tensor]

    def mean_over_pairs(self) -> dict[str, torch.Tensor]:
        """Each statistic ``[L]`` averaged over the ordered language pairs."""
        s = torch.stack(list(self.stats.values())).mean(0)
        return {k: s[i] for i, k in enumerate(KEYS)}

    def summary(self) -> dict[str, Any]:
        """Headline numbers, averaged over the language pairs, at the layer with the largest matched - mismatched
        gap (:data:`BEST_GAP`): the cosines, retrieval (chance ``1/n``) and its shuffled and raw controls."""
        m = self.mean_over_pairs()
        c = choose(BEST_GAP, {"gap": m["matched"] - m["mismatched"]}, self.layers)
        at = {k: float(m[k][c.index]) for k in KEYS}
        return {"best_layer": self.layers[c.index], "gap": at["matched"] - at["mismatched"], **at,
                "chance": 1 / self.n, "n": self.n, "n_pairs": len(self.stats), "layer_rule": c.rule}

    def to_frame(self, pairs: bool = True) -> pd.DataFrame:
        """One row per (layer, source, target), or with ``pairs=False`` per layer averaged over pairs (``source`` and
        ``target`` = ``"mean"``); retrieval carries its Wilson 95% interval over the ``n`` (per pair) or pooled
        sentences."""
        items = list(self.stats.items()) if pairs else [(("mean", "mean"), torch.stack(list(self.stats.values())).mean(0))]
        n_trials = self.n if pairs else self.n * len(self.stats)
        rows = []
        for (a, b), s in items:
            for k, v in enumerate(self.layers):
                row: dict[str, Any] = {"layer": v, "source": a, "target": b, "n": self.n}
                row.update({key: float(s[i, k]) for i, key in enumerate(KEYS)})
                row["gap"] = row["matched"] - row["mismatched"]
                row["raw_gap"] = row["raw_matched"] - row["raw_mismatched"]
                row["retrieval_lo"], row["retrieval_hi"] = wilson(round(row["retrieval"] * n_trials), n_trials)
                row["chance"] = 1 / self.n
                rows.append(row)
        return pd.DataFrame(rows)

    def plot(self) -> Any:
        m = self.mean_over_pairs()
        cos = {"matched (centred)": m["matched"], "mismatched (centred)": m["mismatched"],
               "matched raw": m["raw_matched"], "mismatched raw": m["raw_mismatched"],
               "shuffled pairing (centred)": m["shuffled_matched"]}
        ret = {"retrieval (centred)": m["retrieval"], "retrieval raw": m["raw_retrieval"],
               "retrieval shuffled pairing": m["shuffled_retrieval"]}
        return cross_language_by_layer(cos, ret, self.layers,
                                       title=f"cross-language similarity ({', '.join(self.languages)}; n={self.n})")


def cross_language_similarity(model: Model, parallel: Mapping[str, Sequence[str]], layers: Sequence[int] | None = None,
                              positions: Any = MEAN_AFTER_FIRST, template: str = "{text}", seed: int = 0,
                              batch_size: int = 16) -> CrossLanguageSimilarity:
    """Cross-language similarity of ``parallel {lang: [sentence, ...]}`` (aligned by index) in ``model``'s residual
    stream after each block; plain text, chat template off; ``positions`` default: the mean over the sentence's tokens
    after the first (the attention sink; see :func:`item_activations`)."""
    par = check_parallel(parallel)
    if "{text}" not in template:
        raise ValueError(f"template {template!r} has no {{text}} field")
    acts, layer_list = {}, None
    for lang, texts in par.items():
        acts[lang], layer_list = item_activations(model, [template.format(text=t) for t in texts], layers, positions,
                                                  batch_size)
    n = len(next(iter(par.values())))
    return CrossLanguageSimilarity(layers=layer_list, languages=list(par), n=n, stats=language_stats(acts, seed))


__all__ = ["check_parallel", "cross_language_similarity", "CrossLanguageSimilarity", "KEYS", "language_stats"]
