"""Language identity against safety geometry, by layer, from parallel prompts.

- **Language identity**: how well the last-token activation names its prompt's language (nearest language mean of
  the train prompts, every dimension standardised by its train spread, accuracy on the test prompts; chance
  ``1 / n_langs``), with a Wilson interval.
- **Language subspace**: each language's mean minus the source language's mean (train prompts, harmful and
  harmless pooled), orthonormalised (:func:`probes.subspace.category_subspace`, rank ``n_langs - 1``); its overlap
  with the source refusal direction is the squared norm of that unit direction's projection on it (random unit
  directions give ``rank / d`` on average).
- **Erasing language**: LEACE (:func:`probes.erasure.fit_leace`, language labels, fitted on the train prompts of
  every language) removes what linearly names the language; the source refusal direction is then refitted on the
  erased source train prompts and the projection ratio and transfer AUROC of
  :mod:`interp.studies.multilingual.geometry` recomputed on the erased test prompts, beside the same after erasing a
  random subspace of the same rank (the control) and before any erasure. A representation-level test: it says
  whether the harmful/harmless signal of the other languages lines up better with the source's once language is
  gone, not what the model would then do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.evals.rates import wilson
from interp.studies.kit.moved import moved
from interp.studies.multilingual.geometry import Acts, auroc_on, mean_diff, projection_ratios, unit
from interp.values import Runtime, moved_keywords
from probes.erasure import fit_leace
from probes.subspace import category_subspace

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class LanguageGeometry(Result):
    """Per layer ``[L]`` (per language where keyed): see the module docstring."""

    layers: list[int]
    langs: list[str]
    source: str
    identity_accuracy: torch.Tensor
    identity_ci: torch.Tensor            # [2, L]
    chance: float
    overlap: torch.Tensor                # squared projection of the refusal direction on the language subspace
    random_overlap: float                # rank / d
    rank: int
    ratio: dict[str, dict[str, torch.Tensor]]   # ratio[condition][lang]: before, leace, random
    auroc: dict[str, dict[str, torch.Tensor]]

    def summary(self) -> dict[str, Any]:
        """Headline numbers: the layer where language identity is best with its accuracy, 95% interval and chance;
        the largest overlap of the refusal direction with the language subspace against random (``rank / d``);
        and per condition and language the projection ratio and AUROC averaged over layers."""
        i = int(self.identity_accuracy.nan_to_num(-1.0).argmax())
        j = int(self.overlap.nan_to_num(-1.0).argmax())

        def per(d: dict[str, dict[str, torch.Tensor]]) -> dict[str, dict[str, float]]:
            return {c: {la: float(v.double().nanmean()) for la, v in by.items()} for c, by in d.items()}
        return {"source": self.source, "n_langs": len(self.langs), "identity_layer": self.layers[i],
                "identity_accuracy": float(self.identity_accuracy[i]),
                "identity_ci95": [float(self.identity_ci[0, i]), float(self.identity_ci[1, i])], "chance": self.chance,
                "overlap_layer": self.layers[j], "overlap": float(self.overlap[j]),
                "random_overlap": self.random_overlap, "rank": self.rank,
                "ratio_mean": per(self.ratio), "auroc_mean": per(self.auroc)}

    def to_frame(self) -> pd.DataFrame:
        """One row per (layer, language): identity accuracy, overlap, projection ratios and AUROCs per condition."""
        import pandas as pd

        out = []
        for i, layer in enumerate(self.layers):
            for lang in self.langs:
                out.append({"layer": layer, "lang": lang, "identity_accuracy": float(self.identity_accuracy[i]),
                            "overlap": float(self.overlap[i]),
                            **{f"ratio_{c}": float(self.ratio[c][lang][i]) for c in self.ratio},
                            **{f"auroc_{c}": float(self.auroc[c][lang][i]) for c in self.auroc}})
        return pd.DataFrame(out)

    def plot(self) -> Any:
        """Identity accuracy, the language subspace's overlap with the refusal direction, and the projection ratios
        before and after erasure, by layer (:func:`interp.viz.multilingual.language_geometry`)."""
        from interp.viz.multilingual import language_geometry

        return language_geometry(self.layers, self.identity_accuracy, self.identity_ci, self.chance, self.overlap,
                                 self.random_overlap, self.ratio, self.source)


def _pool(acts: Acts, split: str, langs: list[str]) -> tuple[torch.Tensor, list[str]]:
    xs, ys = [], []
    for lang in langs:
        for kind in ("harmful", "harmless"):
            x = acts[kind][split][lang]
            xs.append(x)
            ys += [lang] * x.shape[0]
    return torch.cat(xs), ys


def _identity(train: torch.Tensor, ytr: list[str], test: torch.Tensor, yte: list[str], langs: list[str]
              ) -> tuple[torch.Tensor, torch.Tensor]:
    scale = train.std(0).clamp_min(1e-12)                          # [L, d]: each dimension in its own units
    means = torch.stack([train[[y == lang for y in ytr]].mean(0) for lang in langs]) / scale  # [k, L, d]
    dist = (test[:, None] / scale - means[None]).norm(dim=-1)                               # [n, k, L]
    truth = torch.tensor([langs.index(y) for y in yte])
    hits = (dist.argmin(1) == truth[:, None]).sum(0)                                         # [L]
    n = len(yte)
    ci = torch.tensor([wilson(int(k), n) for k in hits], dtype=torch.float64).T
    return hits.double() / n, ci


def _erase_all(acts: Acts, fn) -> Acts:
    return {k: {s: {lang: fn(x) for lang, x in by.items()} for s, by in acts[k].items()} for k in acts}


def _transfer(acts: Acts, source: str, n_boot: int, gen: torch.Generator) -> tuple[dict, dict]:
    test = {k: acts[k]["test"] for k in acts}
    r = mean_diff(acts["harmful"]["train"][source], acts["harmless"]["train"][source])
    ratio, _, _ = projection_ratios(test, r, source, n_boot, 1, gen)
    return ratio, {lang: auroc_on(test["harmful"][lang], test["harmless"][lang], r) for lang in test["harmful"]}


def _random_eraser(rank: int, L: int, d: int, gen: torch.Generator):
    Q = torch.linalg.qr(torch.randn(L, d, rank, generator=gen, dtype=torch.float64)).Q      # [L, d, rank]

    def erase(x: torch.Tensor) -> torch.Tensor:
        return x - torch.einsum("nlk,ldk->nld", torch.einsum("nld,ldk->nlk", x, Q), Q)

    return erase


@moved_keywords(moved())
def language_geometry(acts: Acts, layers: list[int], source: str, n_boot: int = 100, runtime: Runtime | None = None
                      ) -> LanguageGeometry:
    """The module docstring's statistics from :func:`interp.studies.multilingual.geometry.capture_last` activations
    (``harmful`` and ``harmless``, ``train`` and ``test`` splits, every language; ``runtime.seed``: the bootstrap's)."""
    seed = (runtime or Runtime()).seed
    langs = list(acts["harmful"]["train"])
    if source not in langs or len(langs) < 2:
        raise ValueError(f"need the source language {source!r} and at least one other; got {langs}")
    gen = torch.Generator().manual_seed(seed)
    xtr, ytr = _pool(acts, "train", langs)
    xte, yte = _pool(acts, "test", langs)
    acc, ci = _identity(xtr, ytr, xte, yte, langs)
    sub = category_subspace(xtr, ytr, reference=source)
    B = sub.bases.double()                                                                  # [L, k, d]
    r = unit(acts["harmful"]["train"][source].mean(0) - acts["harmless"]["train"][source].mean(0))
    overlap = torch.einsum("lkd,ld->lk", B, r).pow(2).sum(-1)
    L, rank, d = B.shape
    leace = fit_leace(xtr, ytr)
    ratio, auroc = {}, {}
    for cond, fn in (("before", None), ("leace", lambda x: leace(x).double()),
                     ("random", _random_eraser(rank, L, d, gen))):
        ratio[cond], auroc[cond] = _transfer(acts if fn is None else _erase_all(acts, fn), source, n_boot, gen)
    return LanguageGeometry(layers, langs, source, acc, ci, 1 / len(langs), overlap, rank / d, rank, ratio, auroc)


__all__ = ["LanguageGeometry", "language_geometry"]
