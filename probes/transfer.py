"""Does it transfer, does it survive erasure: cross-dataset transfer matrices, erasure and rank ablation in CV."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.evals.metrics import accuracy, auroc, cohens_d
from interp.values import Runtime, moved_keywords
from probes._checks import as_data, encode_labels
from probes._choice import LayerChoice, choose_layer
from probes._frames import layer_sorted
from probes.config import CV_MOVED, CVConfig
from probes.erasure import fit_inlp, fit_leace
from probes.folds import make_folds, masks
from probes.logistic import solve_logistic
from probes.objects import Subspace
from probes.validation import ProbeScores, check_no_overlap, metric_or_nan

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class TransferScores(Result):
    """``matrix [n_datasets, n_datasets, n_layers]``: AUROC of a probe fitted on row dataset, tested on column
    dataset (diagonal: held-out CV within the dataset). ``lodo [n_datasets, n_layers]``: fitted on all other
    datasets, tested on this one (leave one dataset out)."""

    datasets: list[str]
    sites: list[str]
    matrix: torch.Tensor
    lodo: torch.Tensor
    method: str = "logistic"
    meta: dict[str, Any] = field(default_factory=dict)

    def layer_choice(self, tol: float = 1e-6) -> LayerChoice:
        """Best layer by mean leave-one-dataset-out AUROC; ties go to the mean off-diagonal (one-to-one transfer)
        AUROC, then the mean within-dataset AUROC, then the middle of the layers still tied."""
        k = len(self.datasets)
        off = ~torch.eye(k, dtype=torch.bool)
        return choose_layer({"lodo_auroc": self.lodo.mean(0), "transfer_auroc": self.matrix[off].mean(0),
                             "within_auroc": self.matrix.diagonal(dim1=0, dim2=1).mean(-1)}, self.sites, tol)

    def best_layer(self, tol: float = 1e-6) -> int:
        """Index (into ``sites``) of the best layer; see :meth:`layer_choice` for the tie-breaking rule."""
        return self.layer_choice(tol).index

    def at(self, layer: int | None = None) -> torch.Tensor:
        """The ``[n_datasets, n_datasets]`` matrix at a layer index (default: best mean LODO layer)."""
        return self.matrix[:, :, self.best_layer() if layer is None else layer]

    def summary(self) -> dict[str, Any]:
        """The best layer (:meth:`layer_choice`) and its mean leave-one-out, transfer and within-dataset AUROC."""
        c = self.layer_choice()
        return {"datasets": list(self.datasets), "method": self.method, "best_site": self.sites[c.index],
                "layer_rule": c.rule,
                **{k: float(v[c.index]) for k, v in c.values.items()}}

    def to_frame(self) -> pd.DataFrame:
        """One row per (site, train, test) plus the leave-one-out rows, with a numeric layer column, sorted by it."""
        rows = []
        for j, s in enumerate(self.sites):
            for a, da in enumerate(self.datasets):
                for b, db in enumerate(self.datasets):
                    rows.append({"site": s, "train": da, "test": db, "auroc": float(self.matrix[a, b, j]),
                                 "kind": "within (cv)" if a == b else "transfer"})
                rows.append({"site": s, "train": f"all but {da}", "test": da, "auroc": float(self.lodo[a, j]),
                             "kind": "lodo"})
        return layer_sorted(rows)

    def plot(self, layer: int | None = None, title: str | None = None) -> Any:
        from interp.viz.probes import transfer_heatmap

        j = self.best_layer() if layer is None else layer
        return transfer_heatmap(self.matrix[:, :, j], self.datasets, lodo=self.lodo[:, j],
                                title=title or f"transfer AUROC at {self.sites[j]}")


def transfer_matrix(X: Any, y: Any = None, datasets: Any = None, *, l2: float = 1e-3, n_folds: int = 5,
                    groups: Any = None, seed: int = 0, positive: Any = None) -> TransferScores:
    """Logistic probes fitted on each dataset and tested on every other; plus leave-one-dataset-out.

    ``datasets`` names each sample's dataset (e.g. the trait). All ``k`` (train on one) + ``k``
    (train on all but one) + ``k x n_folds`` (within-dataset CV) probes and all layers come from one
    batched solve.
    """
    data = as_data(X, y, groups=groups, positive=positive, max_classes=2)
    if datasets is None:
        raise ValueError("pass datasets=[...] naming each sample's dataset")
    ds_codes, names = encode_labels(datasets, data.n, name="datasets")
    k = len(names)
    if k < 2:
        raise ValueError("a transfer matrix needs at least two datasets")
    n = data.n
    rows, cv_index = [], []
    for a in range(k):
        rows.append(ds_codes == a)
    for a in range(k):
        rows.append(ds_codes != a)
    for a in range(k):
        idx = (ds_codes == a).nonzero().flatten()
        sub_groups = None if data.groups is None else [data.groups[i] for i in idx.tolist()]
        folds = make_folds(data.y[idx], n_folds, sub_groups, seed)
        for f in folds:
            m = torch.zeros(n, dtype=torch.bool)
            m[idx[f.train]] = True
            rows.append(m)
            cv_index.append((a, idx[f.test]))
    train = torch.stack(rows)
    for r in range(2 * k):
        cls = data.y[train[r]].unique()
        if cls.numel() < 2:
            which = names[r % k]
            raise ValueError(f"dataset {which!r} (or its complement) holds one class only; each dataset needs both")
    fit = solve_logistic(data.X.transpose(0, 1), data.y, train, l2)
    logits = fit.logits                                                   # [L, rows, n]
    L = data.n_layers
    matrix = torch.zeros(k, k, L)
    lodo = torch.zeros(k, L)
    for a in range(k):
        for b in range(k):
            if a != b:
                test = ds_codes == b
                matrix[a, b] = auroc(logits[:, a, test], data.y[test])
        test = ds_codes == a
        lodo[a] = auroc(logits[:, k + a, test], data.y[test])
    diag: dict[int, list[torch.Tensor]] = {a: [] for a in range(k)}
    for r, (a, test_idx) in enumerate(cv_index):
        diag[a].append(auroc(logits[:, 2 * k + r, test_idx], data.y[test_idx]))
    for a in range(k):
        matrix[a, a] = torch.stack(diag[a]).mean(0)
    return TransferScores(datasets=[str(s) for s in names], sites=list(data.sites), matrix=matrix, lodo=lodo,
                          meta={"l2": l2, "n_folds": n_folds, "data_hash": data.data_hash, "model_id": data.model_id})


@dataclass
class ErasureScores(Result):
    """Held-out probe scores before and after erasing a concept; the eraser was fitted on training folds only."""

    before: ProbeScores
    after: ProbeScores
    eraser: str

    def summary(self) -> dict[str, Any]:
        """Held-out accuracy and AUROC before and after erasure at the best layer before it (mean over folds)."""
        j = self.before.best_layer()
        return {"eraser": self.eraser, "site": self.before.sites[j],
                **{f"{m}_{when}": float(getattr(s, m)[:, j].nanmean()) for m in ("accuracy", "auroc")
                   for when, s in (("before", self.before), ("after", self.after))}}

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        a, b = self.before.to_frame(), self.after.to_frame()
        a["stage"], b["stage"] = "before", "after"
        return pd.concat([a, b], ignore_index=True)

    def plot(self, metric: str = "accuracy", title: str | None = None) -> Any:
        from interp.viz.probes import layer_scores

        return layer_scores({f"before ({metric})": getattr(self.before, metric),
                             f"after {self.eraser} ({metric})": getattr(self.after, metric)}, self.before.sites,
                            title=title or f"held-out {metric} before/after {self.eraser} erasure")


@moved_keywords(CV_MOVED)
def erasure_cv(X: Any, y: Any = None, *, eraser: str | Callable[..., Any] = "leace", erase_labels: Any = None,
               groups: Any = None, positive: Any = None, config: CVConfig | None = None,
               runtime: Runtime | None = None, **eraser_kwargs: Any) -> ErasureScores:
    """Probe accuracy/AUROC on held-out folds before and after erasing a concept fitted on the training folds.

    ``eraser``: ``"leace"``, ``"inlp"`` or a callable ``(X_train [n, L, d], labels_train) -> eraser`` whose
    result maps ``[m, L, d]`` tensors to erased tensors. ``erase_labels``: the concept to erase (default: ``y``),
    so you can ask whether concept ``y`` survives erasing another one. ``config``: ``n_folds`` and ``l2``
    (:class:`~probes.config.CVConfig`); ``runtime.seed``: the folds' seed.
    """
    cfg, seed = config or CVConfig(), Runtime.of(runtime).seed
    n_folds, l2 = cfg.n_folds, cfg.l2
    data = as_data(X, y, groups=groups, positive=positive, max_classes=2)
    conc = data.y if erase_labels is None else encode_labels(erase_labels, data.n, name="erase_labels")[0]
    if isinstance(eraser, str):
        if eraser not in ("leace", "inlp"):
            raise ValueError(f"eraser must be 'leace', 'inlp' or a callable, got {eraser!r}")
        fitter = (lambda Xt, zt: fit_leace(Xt, zt, **eraser_kwargs)) if eraser == "leace" else \
                 (lambda Xt, zt: fit_inlp(Xt, zt, **eraser_kwargs))
        name = eraser
    else:
        fitter, name = eraser, getattr(eraser, "__name__", "custom")
    folds = make_folds(data.y, n_folds, data.groups, seed)
    Xl = data.X.transpose(0, 1)
    before = solve_logistic(Xl, data.y, masks(folds, data.n), l2).logits
    acc_b, auc_b, d_b, acc_a, auc_a, d_a = [], [], [], [], [], []
    for f, fold in enumerate(folds):
        er = fitter(data.X[fold.train], conc[fold.train])
        erased = er(data.X)
        tr = torch.zeros(1, data.n, dtype=torch.bool)
        tr[0, fold.train] = True
        after = solve_logistic(erased.transpose(0, 1), data.y, tr, l2).logits[:, 0]
        yt = data.y[fold.test]
        for store, lg in (((acc_b, auc_b, d_b), before[:, f]), ((acc_a, auc_a, d_a), after)):
            s = lg[:, fold.test]
            store[0].append(accuracy(s, yt))
            store[1].append(metric_or_nan(auroc, s, yt, 1))
            store[2].append(metric_or_nan(cohens_d, s, yt, 2))
    fold_ids = [{"train": [data.sample_ids[i] for i in f.train.tolist()],
                 "test": [data.sample_ids[i] for i in f.test.tolist()]} for f in folds]

    def scores(a: list, u: list, d: list, tag: str) -> ProbeScores:
        return ProbeScores(method=f"logistic ({tag})", sites=list(data.sites), accuracy=torch.stack(a),
                           auroc=torch.stack(u), cohens_d=torch.stack(d), folds=fold_ids, classes=list(data.classes),
                           model_id=data.model_id, data_hash=data.data_hash, meta={"l2": l2, "eraser": name})

    return ErasureScores(before=scores(acc_b, auc_b, d_b, "before"), after=scores(acc_a, auc_a, d_a, f"after {name}"),
                         eraser=name)


@dataclass
class AblationScores(Result):
    """Held-out accuracy / AUROC ``[n_ranks, n_folds, n_layers]`` after projecting out the top-k components."""

    ranks: list[int]
    sites: list[str]
    accuracy: torch.Tensor
    auroc: torch.Tensor
    folds: list[dict[str, list[str]]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Held-out accuracy and AUROC per number of components removed, at the layer :meth:`plot` shows."""
        j = choose_layer({"auroc": self.auroc[0].mean(0)}, self.sites).index
        return {"site": self.sites[j], "accuracy": {str(k): float(self.accuracy[r, :, j].mean())
                                                    for r, k in enumerate(self.ranks)},
                "auroc": {str(k): float(self.auroc[r, :, j].mean()) for r, k in enumerate(self.ranks)}}

    def to_frame(self) -> pd.DataFrame:
        """One row per (rank, site), with a numeric layer column; sorted by rank, then layer."""
        rows = []
        for r, k in enumerate(self.ranks):
            for j, s in enumerate(self.sites):
                rows.append({"rank": k, "site": s, "accuracy": float(self.accuracy[r, :, j].mean()),
                             "accuracy_std": float(self.accuracy[r, :, j].std()) if self.accuracy.shape[1] > 1 else 0.0,
                             "auroc": float(self.auroc[r, :, j].mean())})
        return layer_sorted(rows, ["rank"])

    def plot(self, layer: int | None = None, title: str | None = None) -> Any:
        from interp.viz.probes import rank_curve

        j = choose_layer({"auroc": self.auroc[0].mean(0)}, self.sites).index if layer is None else layer
        return rank_curve(self.ranks, self.accuracy[:, :, j], self.auroc[:, :, j],
                          title=title or f"held-out probe after ablating top-k components at {self.sites[j]}")


@moved_keywords(CV_MOVED)
def rank_ablation(X: Any, y: Any = None, subspace: Subspace | Callable[[torch.Tensor], Subspace] | None = None,
                  ranks: Any = range(1, 13), *, groups: Any = None, positive: Any = None, allow_overlap: bool = False,
                  config: CVConfig | None = None, runtime: Runtime | None = None) -> AblationScores:
    """What survives removing rank 1..k: held-out probe scores after projecting out the subspace's top-k.

    ``subspace``: a fitted :class:`Subspace` (must not have been fitted on these samples unless
    ``allow_overlap``), or a callable ``train_indices (LongTensor) -> Subspace`` fitted inside each fold.
    ``config``: ``n_folds`` and ``l2`` (:class:`~probes.config.CVConfig`); ``runtime.seed``: the folds' seed.
    """
    cfg, seed = config or CVConfig(), Runtime.of(runtime).seed
    n_folds, l2 = cfg.n_folds, cfg.l2
    data = as_data(X, y, groups=groups, positive=positive, max_classes=2)
    if subspace is None:
        raise ValueError("pass subspace=... (a Subspace, or a callable fitting one from training indices)")
    if isinstance(subspace, Subspace):
        check_no_overlap(subspace, data, allow_overlap)
    ranks = list(ranks)
    folds = make_folds(data.y, n_folds, data.groups, seed)
    acc = torch.zeros(len(ranks), len(folds), data.n_layers)
    auc = torch.zeros_like(acc)
    for f, fold in enumerate(folds):
        sub = subspace(fold.train) if callable(subspace) and not isinstance(subspace, Subspace) else subspace
        if max(ranks) > sub.rank or min(ranks) < 0:
            raise ValueError(f"ranks must lie in 0..{sub.rank} (the subspace's rank), got {ranks}")
        tr = torch.zeros(1, data.n, dtype=torch.bool)
        tr[0, fold.train] = True
        yt = data.y[fold.test]
        for r, k in enumerate(ranks):
            Xk = data.X if k == 0 else sub.truncate(k).project_out(data.X).to(data.X.dtype)
            lg = solve_logistic(Xk.transpose(0, 1), data.y, tr, l2).logits[:, 0, fold.test]
            acc[r, f], auc[r, f] = accuracy(lg, yt), auroc(lg, yt)
    fold_ids = [{"train": [data.sample_ids[i] for i in f.train.tolist()],
                 "test": [data.sample_ids[i] for i in f.test.tolist()]} for f in folds]
    return AblationScores(ranks=ranks, sites=list(data.sites), accuracy=acc, auroc=auc, folds=fold_ids)
