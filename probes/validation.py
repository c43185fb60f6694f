"""Held-out validation of probes and directions: grouped CV, shuffled-label controls, fixed-direction scores.

Every score here is computed on samples the scored object was not fitted on; erasers are fitted inside
the training folds (see :mod:`probes.transfer` for erasure and cross-dataset transfer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from evals.metrics import accuracy, auroc, cohens_d
from interp.coerce import layer_tensor
from probes._checks import ProbeData, as_data
from probes.directions import fit_direction
from probes.folds import Fold, make_folds, masks
from probes.logistic import l2_from_C, solve_logistic
from probes.objects import Direction


@dataclass
class ProbeScores:
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
        return getattr(self, metric).mean(0)

    def best_layer(self, metric: str = "auroc") -> int:
        """Index (into ``sites``) of the layer with the best mean held-out ``metric``."""
        return int(self.mean(metric).argmax())

    def summary(self) -> Any:
        """One row per layer: mean and std over folds of each metric."""
        import pandas as pd

        from interp.sites import parse_site

        rows = []
        for j, s in enumerate(self.sites):
            row = {"site": s, "layer": parse_site(s).layer}
            for m in ("accuracy", "auroc", "cohens_d", "control_accuracy", "control_auroc", "selectivity"):
                v = getattr(self, m)
                if v is not None:
                    row[m] = float(v[:, j].mean())
                    row[m + "_std"] = float(v[:, j].std()) if v.shape[0] > 1 else 0.0
            rows.append(row)
        return pd.DataFrame(rows)

    def to_frame(self) -> Any:
        """Long form: one row per (fold, site, metric)."""
        import pandas as pd

        from interp.sites import parse_site

        rows = []
        for m in ("accuracy", "auroc", "cohens_d", "control_accuracy", "control_auroc", "selectivity"):
            v = getattr(self, m)
            if v is None:
                continue
            for f in range(v.shape[0]):
                for j, s in enumerate(self.sites):
                    rows.append({"method": self.method, "fold": f, "site": s, "layer": parse_site(s).layer,
                                 "metric": m, "value": float(v[f, j])})
        return pd.DataFrame(rows)

    def plot(self, metrics: tuple[str, ...] = ("accuracy", "auroc"), title: str | None = None) -> Any:
        from viz.probes import layer_scores

        data = {m: getattr(self, m) for m in metrics if getattr(self, m) is not None}
        if self.control_accuracy is not None and "accuracy" in metrics:
            data["control_accuracy"] = self.control_accuracy
        return layer_scores(data, self.sites, title=title or f"{self.method}: held-out scores by layer")


def _shuffled(y: torch.Tensor, groups: list[Any] | None, seed: int) -> torch.Tensor:
    """Control labels: a random permutation of ``y`` (whole groups keep one label when groups are given)."""
    g = torch.Generator().manual_seed(seed + 7919)
    if groups is None:
        return y[torch.randperm(len(y), generator=g)]
    keys = list(dict.fromkeys(groups))
    first = {k: y[groups.index(k)] for k in keys}
    vals = torch.stack([first[k] for k in keys])[torch.randperm(len(keys), generator=g)]
    table = dict(zip(keys, vals.tolist(), strict=True))
    return torch.tensor([table[k] for k in groups], dtype=torch.long)


def _score(scores: torch.Tensor, y: torch.Tensor, thr: torch.Tensor | float) -> tuple[torch.Tensor, ...]:
    return accuracy(scores, y, thr), auroc(scores, y), cohens_d(scores, y)


def _logistic_cv(data: ProbeData, folds: list[Fold], y_rows: torch.Tensor, l2: float, **kw: Any) -> torch.Tensor:
    """Decision values ``[L, rows, n]`` of one batched solve; ``y_rows [rows, n]`` may repeat folds with controls."""
    train = masks(folds, data.n).repeat(y_rows.shape[0] // len(folds), 1)
    fit = solve_logistic(data.X.transpose(0, 1), y_rows, train, l2, **kw)
    return fit.logits


def cross_validate(X: Any, y: Any = None, *, method: str = "logistic", groups: Any = None, n_folds: int = 5,
                   control: bool = True, l2: float = 1e-3, C: float | None = None, seed: int = 0,
                   positive: Any = None, **method_kwargs: Any) -> ProbeScores:
    """Held-out accuracy, AUROC and Cohen's d of a probe/direction method at every layer.

    ``method``: ``logistic`` (all folds and layers in one batched solve) or a direction method
    (``mean_diff, pca_diff, pca, lda``; scored by projection, accuracy thresholded halfway between the
    training class means). ``groups``: samples sharing a group never straddle train/test. ``control``:
    repeat with shuffled labels for selectivity.
    """
    data = as_data(X, y, groups=groups, positive=positive, max_classes=2)
    folds = make_folds(data.y, n_folds, data.groups, seed)
    ctrl = _shuffled(data.y, data.groups, seed) if control else None
    if control:
        try:
            make_folds(ctrl, n_folds, data.groups, seed)
        except ValueError:
            ctrl = None                                                  # shuffled labels cannot fill folds
    F = len(folds)
    results: dict[str, list[torch.Tensor]] = {k: [] for k in ("acc", "auc", "d", "cacc", "cauc")}
    if method == "logistic":
        if C is not None:
            l2 = l2_from_C(C, data.n * (F - 1) // F)
        rows = [data.y.expand(F, -1)]
        if ctrl is not None:
            rows.append(ctrl.expand(F, -1))
        logits = _logistic_cv(data, folds, torch.cat(rows), l2, **method_kwargs)   # [L, rows, n]
        for f, fold in enumerate(folds):
            for key, value in zip(("acc", "auc", "d"), _score(logits[:, f, fold.test], data.y[fold.test], 0.0),
                                  strict=True):
                results[key].append(value)
            if ctrl is not None:
                a, u, _ = _score(logits[:, F + f, fold.test], ctrl[fold.test], 0.0)
                results["cacc"].append(a)
                results["cauc"].append(u)
    else:
        for fold in folds:
            for key_a, key_u, labels in (("acc", "auc", data.y), ("cacc", "cauc", ctrl)):
                if labels is None:
                    continue
                direction = fit_direction(data.X[fold.train], labels[fold.train], method=method, **method_kwargs)
                proj = torch.einsum("nld,ld->ln", data.X.to(direction.vectors.dtype), direction.vectors)
                tr, te = proj[:, fold.train], proj[:, fold.test]
                ytr = labels[fold.train].bool()
                thr = (tr[:, ytr].mean(-1) + tr[:, ~ytr].mean(-1)) / 2
                a, u, d = _score(te, labels[fold.test], thr)
                results[key_a].append(a)
                results[key_u].append(u)
                if key_a == "acc":
                    results["d"].append(d)
    stack = {k: torch.stack(v) if v else None for k, v in results.items()}
    fold_ids = [{"train": [data.sample_ids[i] for i in f.train.tolist()],
                 "test": [data.sample_ids[i] for i in f.test.tolist()]} for f in folds]
    return ProbeScores(method=method, sites=list(data.sites), accuracy=stack["acc"], auroc=stack["auc"],
                       cohens_d=stack["d"], control_accuracy=stack["cacc"], control_auroc=stack["cauc"],
                       folds=fold_ids, classes=list(data.classes), model_id=data.model_id, data_hash=data.data_hash,
                       meta={"n_folds": F, "grouped": data.groups is not None, "l2": l2 if method == "logistic" else None,
                             "seed": seed, **{k: str(v) for k, v in method_kwargs.items()}})


@dataclass
class DirectionScores:
    """AUROC and Cohen's d ``[n_layers]`` of a fixed direction's projections on labelled data (nothing fitted)."""

    sites: list[str]
    auroc: torch.Tensor
    cohens_d: torch.Tensor
    method: str = ""

    def to_frame(self) -> Any:
        import pandas as pd

        return pd.DataFrame({"site": self.sites, "auroc": self.auroc.tolist(), "cohens_d": self.cohens_d.tolist(),
                             "method": self.method})

    def plot(self, title: str | None = None) -> Any:
        from viz.probes import layer_scores

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
