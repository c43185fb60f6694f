"""Representational similarity analysis of a model's layers against a category (or any target) dissimilarity matrix.

    data = load_categories()
    res = category_rsa(model, data["items"], data["categories"])     # target: same category 0, different 1
    res.to_frame(); res.plot(); res.summary()

Each item is captured as ``template.format(item=...)`` with the chat template off, at the last token (the template
ends with the item, so the last token is the item's last token) unless ``positions`` says otherwise; RDMs of every
layer are compared with the target by Spearman (or Pearson / Kendall) on the upper triangle, with a Mantel permutation
test (item labels of the target permuted), a family-wise p over layers (max statistic), and the noise ceiling when the
target holds repeated judgements ``[n_raters, n, n]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from interp.bundle import Result
from interp.models import Model
from interp.studies.directions.moved import moved_into
from interp.studies.directions.similarity_data import category_matrix, item_activations
from interp.values import Runtime, moved_keywords
from interp.viz.directions_similarity import rdm_heatmap, rsa_by_layer
from probes.layers import LayerRule, choose
from probes.similarity import METHODS, METRICS, check_target, mantel, noise_ceiling, p_greater, rdm

BEST_LAYER = LayerRule(("r",), tol=0.0, tie="lowest")
TEMPLATE = "The word: {item}"


@dataclass(frozen=True)
class SimilarityConfig:
    """The similarity studies' tuning knobs: the RDM / distance ``metric`` (``None``: the study's own default,
    ``"correlation"`` for RSA, ``"cosine"`` for typicality), the RSA ``method``, ``n_perm`` permutations,
    ``n_boot`` bootstrap resamples (typicality) and the item ``template`` (plain text, no chat template)."""

    metric: str | None = None
    method: str = "spearman"
    n_perm: int = 1000
    n_boot: int = 1000
    template: str = TEMPLATE

    def __post_init__(self) -> None:
        if (self.metric is not None and self.metric not in METRICS) or self.method not in METHODS:
            raise ValueError(f"metric must be one of {list(METRICS)} (or None) and method one of {list(METHODS)}, "
                             f"got {self.metric!r}, {self.method!r}")
        if self.n_perm < 1 or self.n_boot < 1:
            raise ValueError(f"need n_perm >= 1 and n_boot >= 1, got {self.n_perm}, {self.n_boot}")
        if "{item}" not in self.template:
            raise ValueError(f"template must contain '{{item}}', got {self.template!r}")


SIMILARITY_MOVED = moved_into(SimilarityConfig)
"""The keywords the similarity studies took before ``config=`` / ``runtime=``, and where each went."""


def check_items(items: Sequence[str], categories: Sequence[Any] | None = None, minimum: int = 3) -> list[str]:
    """``items`` as a list of strings, at least ``minimum`` of them, with one category label each."""
    items = [str(x) for x in items]
    if len(items) < minimum:
        raise ValueError(f"need at least {minimum} items for representational similarity, got {len(items)}")
    if categories is not None and len(categories) != len(items):
        raise ValueError(f"{len(categories)} category labels for {len(items)} items: give one label per item")
    return items


def format_items(items: Sequence[str], template: str) -> list[str]:
    if "{item}" not in template:
        raise ValueError(f"template {template!r} has no {{item}} field; e.g. {TEMPLATE!r}")
    return [template.format(item=x) for x in items]


@dataclass
class RSAResult(Result):
    """RSA by layer: ``r [L]`` (model RDM vs target), permutation ``p [L]``, family-wise ``p_fwe [L]`` (max over layers),
    ``null [n_perm, L]``, the model ``rdms [L, n, n]``, the ``target [n, n]`` (the raters' mean when repeated) and
    the noise ceiling ``(lower, upper)`` or None."""

    layers: list[int]
    items: list[str]
    r: torch.Tensor
    p: torch.Tensor
    p_fwe: torch.Tensor
    null: torch.Tensor
    rdms: torch.Tensor
    target: torch.Tensor
    method: str
    metric: str
    ceiling: tuple[float, float] | None = None

    def to_frame(self) -> pd.DataFrame:
        lo, hi = self.null.quantile(0.025, dim=0), self.null.quantile(0.975, dim=0)
        rows = [{"layer": v, "r": float(self.r[k]), "p": float(self.p[k]), "p_fwe": float(self.p_fwe[k]),
                 "null_mean": float(self.null[:, k].mean()), "null_lo": float(lo[k]), "null_hi": float(hi[k]),
                 "significant": bool(self.p_fwe[k] < 0.05), "method": self.method, "metric": self.metric,
                 "ceiling_lower": None if self.ceiling is None else self.ceiling[0],
                 "ceiling_upper": None if self.ceiling is None else self.ceiling[1]} for k, v in enumerate(self.layers)]
        return pd.DataFrame(rows)

    def best_layer(self) -> int:
        """The layer with the highest RSA r (NaN counts as -2; ties: the lowest), by :data:`BEST_LAYER`."""
        return self.layers[choose(BEST_LAYER, {"r": torch.nan_to_num(self.r, nan=-2.0)}, self.layers).index]

    def summary(self) -> dict[str, Any]:
        """Headline numbers: the best layer, its r, p and family-wise p, and whether it beats the null."""
        k = self.layers.index(self.best_layer())
        return {"best_layer": self.layers[k], "r": float(self.r[k]), "p": float(self.p[k]),
                "p_fwe": float(self.p_fwe[k]), "above_null": bool(self.p_fwe[k] < 0.05), "method": self.method,
                "metric": self.metric, "n_perm": int(self.null.shape[0]), "layer_rule": BEST_LAYER.describe()}

    def report(self) -> str:
        """One line: the best layer's figure and whether any layer beats the null after the family-wise correction."""
        k = self.layers.index(self.best_layer())
        verdict = ("above the permutation null" if self.p_fwe[k] < 0.05 else
                   "a null result: no layer beats the permutation null (family-wise p >= 0.05)")
        return (f"best layer {self.layers[k]}: {self.method} r = {float(self.r[k]):.3f}, p = {float(self.p[k]):.3g}, "
                f"family-wise p = {float(self.p_fwe[k]):.3g} ({verdict}; {self.null.shape[0]} permutations)")

    def plot(self, layer: int | None = None) -> Any:
        """RSA by layer with the null band and noise ceiling; with ``layer``, that layer's RDM as a heatmap."""
        if layer is not None:
            return rdm_heatmap(self.rdms[self.layers.index(layer)], self.items, title=f"RDM at layer {layer} ({self.metric})")
        return rsa_by_layer(self.r, self.layers, self.null.quantile(0.025, dim=0), self.null.quantile(0.975, dim=0),
                            p=self.p, ceiling=self.ceiling, title=f"RSA by layer ({self.method}, {self.metric} RDMs)")


def rsa(X: torch.Tensor, target: Any, layers: Sequence[int] | None = None, items: Sequence[str] | None = None,
        metric: str = "correlation", method: str = "spearman", n_perm: int = 1000, seed: int = 0) -> RSAResult:
    """RSA of activations ``X [L, n, d]`` against ``target [n, n]`` or ``[n_raters, n, n]`` (no model needed)."""
    if metric not in METRICS or method not in METHODS:
        raise ValueError(f"metric must be one of {list(METRICS)} and method one of {list(METHODS)}, "
                         f"got {metric!r}, {method!r}")
    X = torch.as_tensor(X).double()
    n = X.shape[-2]
    check_items(items if items is not None else [str(i) for i in range(n)])
    t = check_target(target, n)
    ceiling = noise_ceiling(t, method) if t.dim() == 3 else None
    mean_t = t.mean(0) if t.dim() == 3 else t
    D = rdm(X, metric)
    test = mantel(D, mean_t, n_perm=n_perm, method=method, seed=seed)
    fwe = p_greater(test.r, torch.nan_to_num(test.null, nan=-2.0).max(1, keepdim=True).values.expand_as(test.null))
    return RSAResult(layers=list(layers) if layers is not None else list(range(X.shape[0])),
                     items=list(items) if items is not None else [str(i) for i in range(n)], r=test.r, p=test.p,
                     p_fwe=fwe, null=test.null, rdms=D, target=mean_t, method=method, metric=metric, ceiling=ceiling)


@moved_keywords(SIMILARITY_MOVED)
def category_rsa(model: Model, items: Sequence[str], categories: Sequence[Any], target: Any = None,
                 layers: Sequence[int] | None = None, positions: Any = "last", *,
                 config: SimilarityConfig | None = None, runtime: Runtime | None = None) -> RSAResult:
    """RSA of ``model``'s residual stream (after each block in ``layers``) over ``items`` against ``target``
    (default: :func:`category_matrix` of ``categories``, same category 0, different 1); permutations seeded by
    ``runtime.seed``."""
    cfg, run = config or SimilarityConfig(), Runtime.of(runtime)
    metric, template, batch_size = cfg.metric or "correlation", cfg.template, run.batch_size
    items = check_items(items, categories)
    target = category_matrix(categories) if target is None else target
    check_target(target, len(items))                 # fail before the forward passes
    X, layer_list = item_activations(model, format_items(items, template), layers, positions, batch_size)
    return rsa(X, target, layer_list, items, metric=metric, method=cfg.method, n_perm=cfg.n_perm, seed=run.seed)


__all__ = ["SIMILARITY_MOVED", "SimilarityConfig", "category_rsa", "check_items", "format_items", "rsa", "RSAResult", "TEMPLATE"]
