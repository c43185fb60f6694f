"""Held-out validation of probes and directions: grouped CV, shuffled-label controls, fixed-direction scores.

Every score here is computed on samples the scored object was not fitted on; erasers are fitted inside
the training folds (see :mod:`probes.transfer` for erasure and cross-dataset transfer).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from interp.bundle import Result
from interp.coerce import layer_tensor
from interp.evals.metrics import accuracy, auroc, cohens_d
from interp.values import Runtime, moved_keywords
from probes._checks import ProbeData, as_data
from probes._choice import LayerChoice, choose_layer
from probes._frames import layer_order, layer_sorted, site_layer
from probes.config import CV_MOVED, CVConfig, LogisticConfig
from probes.directions import fit_direction
from probes.folds import Fold, check_folds, make_folds, masks
from probes.logistic import l2_from_C, solve_logistic
from probes.objects import Direction

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class ProbeScores(Result):
    """Held-out scores per fold and layer: ``accuracy``, ``auroc``, ``cohens_d`` each ``[n_folds, n_layers]``.

    ``control_*``: the same pipeline on shuffled labels (Hewitt & Liang's control task); ``selectivity`` =
    accuracy - control accuracy. ``folds`` lists the sample ids each fold trained and tested on.
    """

    method: str
    sites: list[str]
    accuracy: torch.Tensor
    auroc: torch.Tensor
    cohens_d: torch.Tensor
    control_accuracy: torch.Tensor | None = None
    control_auroc: torch.Tensor | None = None
    folds: list[dict[str, list[str]]] = field(default_factory=list)
    classes: list[Any] = field(default_factory=list)
    model_id: str = ""
    data_hash: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def selectivity(self) -> torch.Tensor | None:
        return None if self.control_accuracy is None else self.accuracy - self.control_accuracy

    def mean(self, metric: str = "auroc") -> torch.Tensor:
        """Mean over folds ``[n_layers]``, ignoring folds where the metric is undefined (NaN)."""
        return getattr(self, metric).nanmean(0)

    def layer_choice(self, metric: str = "auroc", tol: float = 1e-6) -> LayerChoice:
        """The best layer by mean held-out ``metric`` and how ties were broken, for inspection.

        Ties (within ``tol``) are broken by the next metric of ``auroc -> cohens_d -> accuracy`` (starting
        after ``metric``, wrapping round), then by the middle of the layers still tied. ``.tied`` lists the
        layers that tied on ``metric`` itself.
        """
        chain = ["auroc", "cohens_d", "accuracy"]
        if metric not in chain:
            raise ValueError(f"metric must be one of {chain}, got {metric!r}")
        start = chain.index(metric)
        order = chain[start:] + chain[:start]
        return choose_layer({m: self.mean(m) for m in order}, self.sites, tol)

    def best_layer(self, metric: str = "auroc", tol: float = 1e-6) -> int:
        """Index (into ``sites``) of the best layer; see :meth:`layer_choice` for the tie-breaking rule."""
        return self.layer_choice(metric, tol).index

    def summary(self) -> dict[str, Any]:
        """Headline numbers: the best layer (:meth:`layer_choice`) and its mean held-out scores over folds."""
        j = self.best_layer()
        out: dict[str, Any] = {"method": self.method, "n_folds": int(self.accuracy.shape[0]),
                               "best_site": self.sites[j], "best_layer": site_layer(self.sites[j]),
                               "layer_rule": self.layer_choice().rule}
        for m in ("accuracy", "auroc", "cohens_d", "control_accuracy", "control_auroc", "selectivity"):
            v = getattr(self, m)
            if v is not None:
                out[m] = float(v[:, j].nanmean())
        return out

    def by_site(self) -> pd.DataFrame:
        """One row per site in layer order: mean and std over folds of each metric, NaN folds ignored."""
        import pandas as pd

        cols: dict[str, Any] = {"site": list(self.sites), "layer": [site_layer(s) for s in self.sites]}
        for m in ("accuracy", "auroc", "cohens_d", "control_accuracy", "control_auroc", "selectivity"):
            v = getattr(self, m)
            if v is not None:
                cols[m] = v.nanmean(0).tolist()
                cols[m + "_std"] = _nanstd(v).tolist()
        return pd.DataFrame(cols).iloc[layer_order(self.sites)].reset_index(drop=True)

    def to_frame(self) -> pd.DataFrame:
        """Long form: one row per (metric, fold, site), with a numeric layer column; sorted by metric, fold, layer."""
        import pandas as pd

        rows = []
        for m in ("accuracy", "auroc", "cohens_d", "control_accuracy", "control_auroc", "selectivity"):
            v = getattr(self, m)
            if v is None:
                continue
            for f in range(v.shape[0]):
                for j in layer_order(self.sites):
                    rows.append({"method": self.method, "fold": f, "site": self.sites[j],
                                 "layer": site_layer(self.sites[j]), "metric": m, "value": float(v[f, j])})
        return pd.DataFrame(rows)

    def plot(self, metrics: tuple[str, ...] = ("accuracy", "auroc"), title: str | None = None) -> Any:
        from interp.viz.probes import layer_scores

        data = {m: getattr(self, m) for m in metrics if getattr(self, m) is not None}
        if self.control_accuracy is not None and "accuracy" in metrics:
            data["control_accuracy"] = self.control_accuracy
        return layer_scores(data, self.sites, title=title or f"{self.method}: held-out scores by layer")


def _nanstd(v: torch.Tensor) -> torch.Tensor:
    """Bessel-corrected std over folds (dim 0) ignoring NaN; 0 where fewer than two folds are defined."""
    ok = ~torch.isnan(v)
    n = ok.sum(0)
    dev = torch.where(ok, v - v.nanmean(0), torch.zeros_like(v))
    return torch.where(n > 1, (dev.pow(2).sum(0) / (n - 1).clamp_min(1)).sqrt(), torch.zeros_like(n, dtype=v.dtype))


def shuffled_labels(y: torch.Tensor, folds: list[Fold], groups: list[Any] | None, seed: int) -> torch.Tensor:
    """Control labels for Hewitt & Liang's control task, independent of content but shaped like ``y``.

    Labels are permuted inside each test fold, so every fold keeps its class counts (the control never
    fails for lack of a class where the real labels do not). With ``groups`` a group holding both labels
    (e.g. a contrastive pair) has its labels permuted inside it; groups holding one label exchange labels
    with the other one-label groups of the same fold, so a group's samples still share one label.
    """
    g = torch.Generator().manual_seed(seed + 7919)
    out = y.clone()
    for fold in folds:
        idx = fold.test
        if groups is None:
            out[idx] = y[idx[torch.randperm(len(idx), generator=g)]]
            continue
        members: dict[Any, list[int]] = {}
        for i in idx.tolist():
            members.setdefault(groups[i], []).append(i)
        pure = [k for k, m in members.items() if y[m].unique().numel() == 1]
        for k, m in members.items():
            if k not in pure:
                mt = torch.tensor(m)
                out[mt] = y[mt[torch.randperm(len(m), generator=g)]]
        values = [int(y[members[k][0]]) for k in pure]
        for k, j in zip(pure, torch.randperm(len(pure), generator=g).tolist(), strict=True):
            out[torch.tensor(members[k])] = values[j]
    return out


def metric_or_nan(metric: Any, scores: torch.Tensor, y: torch.Tensor, need: int) -> torch.Tensor:
    """``metric(scores, y)``, or NaN ``[...]`` where a class has fewer than ``need`` samples (undefined there)."""
    n1 = int(y.sum())
    if min(n1, y.numel() - n1) < need:
        return torch.full(scores.shape[:-1], float("nan"))
    return metric(scores, y)


def _score(scores: torch.Tensor, y: torch.Tensor, thr: torch.Tensor | float) -> tuple[torch.Tensor, ...]:
    """Accuracy, AUROC and Cohen's d; AUROC / d are NaN in a fold where they are undefined."""
    return accuracy(scores, y, thr), metric_or_nan(auroc, scores, y, 1), metric_or_nan(cohens_d, scores, y, 2)


def _logistic_cv(data: ProbeData, folds: list[Fold], y_rows: torch.Tensor, l2: float, **kw: Any) -> torch.Tensor:
    """Decision values ``[L, rows, n]`` of one batched solve; ``y_rows [rows, n]`` may repeat folds with controls.
    ``kw``: :class:`LogisticConfig` fields, ``runtime`` and ``desc``."""
    train = masks(folds, data.n).repeat(y_rows.shape[0] // len(folds), 1)
    runtime, desc = kw.pop("runtime", None), kw.pop("desc", None)
    fit = solve_logistic(data.X.transpose(0, 1), y_rows, train, l2, LogisticConfig(**kw), runtime, desc)
    return fit.logits


def _control(data: ProbeData, folds: list[Fold], seed: int) -> torch.Tensor | None:
    """Shuffled control labels on the same folds, or None (with a warning) where they cannot fill them."""
    ctrl = shuffled_labels(data.y, folds, data.groups, seed)
    try:
        check_folds(ctrl, folds, " (shuffled-label control)")
    except ValueError as err:
        warnings.warn(f"no shuffled-label control: {err}", stacklevel=3)
        return None
    return ctrl


def _cv_logistic(data: ProbeData, folds: list[Fold], ctrl: torch.Tensor | None, l2: float,
                 kw: dict[str, Any]) -> dict[str, list[torch.Tensor]]:
    """Held-out scores of logistic probes: real and control labels, every fold and layer in one batched solve."""
    F = len(folds)
    rows = [data.y.expand(F, -1)] + ([] if ctrl is None else [ctrl.expand(F, -1)])
    logits = _logistic_cv(data, folds, torch.cat(rows), l2, **kw)       # [L, rows, n]
    results: dict[str, list[torch.Tensor]] = {k: [] for k in ("acc", "auc", "d", "cacc", "cauc")}
    for f, fold in enumerate(folds):
        for key, value in zip(("acc", "auc", "d"), _score(logits[:, f, fold.test], data.y[fold.test], 0.0),
                              strict=True):
            results[key].append(value)
        if ctrl is not None:                                             # the control needs no Cohen's d
            yc, lc = ctrl[fold.test], logits[:, F + f, fold.test]
            results["cacc"].append(accuracy(lc, yc, 0.0))
            results["cauc"].append(metric_or_nan(auroc, lc, yc, 1))
    return results


def _cv_direction(data: ProbeData, folds: list[Fold], ctrl: torch.Tensor | None, method: str,
                  kw: dict[str, Any], progress: bool = False) -> dict[str, list[torch.Tensor]]:
    """Held-out scores of a direction method (projection; threshold halfway between training class means)."""
    results: dict[str, list[torch.Tensor]] = {k: [] for k in ("acc", "auc", "d", "cacc", "cauc")}
    for fold in tqdm(folds, desc=f"cross_validate {method}", unit="fold", disable=not progress, leave=False):
        for key_a, key_u, labels in (("acc", "auc", data.y), ("cacc", "cauc", ctrl)):
            if labels is None:
                continue
            direction = fit_direction(data.X[fold.train], labels[fold.train], method=method, **kw)
            proj = torch.einsum("nld,ld->ln", data.X.to(direction.vectors.dtype), direction.vectors)
            tr, te = proj[:, fold.train], proj[:, fold.test]
            ytr, yte = labels[fold.train].bool(), labels[fold.test]
            thr = (tr[:, ytr].mean(-1) + tr[:, ~ytr].mean(-1)) / 2
            results[key_a].append(accuracy(te, yte, thr))
            results[key_u].append(metric_or_nan(auroc, te, yte, 1))
            if key_a == "acc":                                           # the control needs no Cohen's d
                results["d"].append(metric_or_nan(cohens_d, te, yte, 2))
    return results


@moved_keywords(CV_MOVED)
def cross_validate(X: Any, y: Any = None, *, method: str = "logistic", groups: Any = None, positive: Any = None,
                   config: CVConfig | None = None, runtime: Runtime | None = None,
                   **method_kwargs: Any) -> ProbeScores:
    """Held-out accuracy, AUROC and Cohen's d of a probe/direction method at every layer.

    ``method``: ``logistic`` (all folds and layers in one batched solve) or a direction method
    (``mean_diff, pca_diff, pca, lda``; scored by projection, accuracy thresholded halfway between the
    training class means). ``groups``: samples sharing a group never straddle train/test. ``control``:
    repeat with shuffled labels for selectivity (see :func:`shuffled_labels`: permuted inside each test
    fold, respecting groups, so contrastive pairs work); the control reports accuracy and AUROC, not d.
    A metric undefined in a fold (AUROC without both classes, d with fewer than two of one) is NaN there.
    ``config``: folds, penalty and control (:class:`CVConfig`); ``method_kwargs``: the direction method's options,
    or :class:`LogisticConfig` fields for ``logistic``. ``runtime``: the seed of the folds and the control, and a
    bar over the solver's steps (logistic) or the folds (direction methods).
    """
    cfg, runtime = config or CVConfig(), Runtime.of(runtime)
    n_folds, control, l2, C, seed, progress = cfg.n_folds, cfg.control, cfg.l2, cfg.C, runtime.seed, runtime.progress
    data = as_data(X, y, groups=groups, positive=positive, max_classes=2)
    folds = make_folds(data.y, n_folds, data.groups, seed)
    ctrl = _control(data, folds, seed) if control else None
    F = len(folds)
    if method == "logistic":
        if C is not None:
            l2 = l2_from_C(C, data.n * (F - 1) // F)
        kw = {**method_kwargs, "runtime": runtime, "desc": f"cross_validate ({len(data.sites)} layers x {F} folds)"}
        results = _cv_logistic(data, folds, ctrl, l2, kw)
    else:
        results = _cv_direction(data, folds, ctrl, method, method_kwargs, progress)
    stack = {k: torch.stack(v) if v else None for k, v in results.items()}
    fold_ids = [{"train": [data.sample_ids[i] for i in f.train.tolist()],
                 "test": [data.sample_ids[i] for i in f.test.tolist()]} for f in folds]
    return ProbeScores(method=method, sites=list(data.sites), accuracy=stack["acc"], auroc=stack["auc"],
                       cohens_d=stack["d"], control_accuracy=stack["cacc"], control_auroc=stack["cauc"],
                       folds=fold_ids, classes=list(data.classes), model_id=data.model_id, data_hash=data.data_hash,
                       meta={"n_folds": F, "grouped": data.groups is not None, "l2": l2 if method == "logistic" else None,
                             "seed": seed, **{k: str(v) for k, v in method_kwargs.items()}})


@dataclass
class DirectionScores(Result):
    """AUROC and Cohen's d ``[n_layers]`` of a fixed direction's projections on labelled data (nothing fitted)."""

    sites: list[str]
    auroc: torch.Tensor
    cohens_d: torch.Tensor
    method: str = ""

    def summary(self) -> dict[str, Any]:
        """The layer where the direction separates the labels best (AUROC) and its AUROC and Cohen's d."""
        j = int(self.auroc.nan_to_num(-1.0).argmax())
        return {"method": self.method, "best_site": self.sites[j], "best_layer": site_layer(self.sites[j]),
                "auroc": float(self.auroc[j]), "cohens_d": float(self.cohens_d[j])}

    def to_frame(self) -> pd.DataFrame:
        """One row per site with a numeric layer column, sorted by layer."""
        return layer_sorted([{"site": s, "auroc": float(self.auroc[j]), "cohens_d": float(self.cohens_d[j]),
                              "method": self.method} for j, s in enumerate(self.sites)])

    def plot(self, title: str | None = None) -> Any:
        from interp.viz.probes import layer_scores

        return layer_scores({"auroc": self.auroc[None], "cohens_d": self.cohens_d[None]}, self.sites,
                            title=title or f"{self.method} direction: scores by layer")


def check_no_overlap(obj: Any, data: ProbeData, allow_overlap: bool) -> None:
    """Refuse to score an object on samples it was fitted on (same model, shared prompt ids)."""
    if allow_overlap or not getattr(obj, "fitted_on", None) or not data.model_id:
        return
    if getattr(obj, "model_id", "") != data.model_id:
        return
    shared = set(obj.fitted_on) & set(data.sample_ids)
    if shared:
        raise ValueError(f"{len(shared)} evaluation samples were used to fit this object (e.g. "
                         f"{sorted(shared)[:3]}); evaluate on held-out prompts or pass allow_overlap=True")


def evaluate_direction(X: Any, y: Any = None, direction: Direction | torch.Tensor | None = None, *,
                       allow_overlap: bool = False, positive: Any = None) -> DirectionScores:
    """Score a fixed direction (e.g. fitted elsewhere, or a random control) on labelled activations."""
    if direction is None:
        raise ValueError("pass direction=... (a Direction or a [n_layers, d] tensor)")
    data = as_data(X, y, positive=positive, max_classes=2)
    if isinstance(direction, Direction):
        check_no_overlap(direction, data, allow_overlap)
        vecs, method = direction.vectors, direction.method
        x = layer_tensor(X, direction.sites, check_finite=True) if not isinstance(X, torch.Tensor) else data.X
    else:
        vecs, method, x = (direction[None] if direction.dim() == 1 else direction), "tensor", data.X
    if vecs.shape[0] != x.shape[1]:
        raise ValueError(f"the direction has {vecs.shape[0]} layers but the activations have {x.shape[1]}")
    if vecs.shape[-1] != x.shape[-1]:
        raise ValueError(f"direction has width {vecs.shape[-1]} but the activations have width {x.shape[-1]}; "
                         f"use a direction fitted on the same model and site")
    proj = torch.einsum("nld,ld->ln", x.to(vecs.dtype), vecs)
    return DirectionScores(sites=list(data.sites), auroc=auroc(proj, data.y), cohens_d=cohens_d(proj, data.y),
                           method=method)
