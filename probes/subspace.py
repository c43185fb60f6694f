"""Rank-k subspaces per layer: per-category directions orthonormalised, top-k of class-mean differences, PCA."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from probes._checks import ProbeData, as_data, encode_labels
from probes._linalg import class_means, orthonormalize, sign_by_labels, top_components
from probes.directions import _pairs
from probes.objects import Direction, Subspace


def _subspace(bases: torch.Tensor, strengths: torch.Tensor, data: ProbeData, method: str,
              names: list[str] | None = None, **meta: Any) -> Subspace:
    return Subspace(bases.to(data.X.dtype), strengths.to(data.X.dtype), list(data.sites), names, method=method,
                    model_id=data.model_id, data_hash=data.data_hash, fitted_on=list(data.sample_ids), meta={**data.carried(), **meta})


def category_subspace(X: Any, categories: Any = None, *, reference: Any = None, order: str = "norm") -> Subspace:
    """One direction per category, orthonormalised (Gram-Schmidt) into a rank-``k`` subspace per layer.

    Each raw direction is the category mean minus the ``reference`` category's mean (e.g. ``"harmless"``),
    or, without a reference, minus the mean of every other sample. ``order="norm"`` orthonormalises the
    largest raw direction first (per layer, by mean norm over layers); ``"given"`` keeps the label order.
    ``strengths`` hold the norm each direction keeps after removing the earlier ones.
    """
    data = as_data(X, categories, min_classes=2)
    k = len(data.classes)
    mu, counts = class_means(data.X, data.y, k)                          # [k, L, d]
    cats = list(range(k))
    if reference is not None:
        if reference not in data.classes:
            raise ValueError(f"reference={reference!r} is not among the categories {data.classes}")
        r = data.classes.index(reference)
        cats = [c for c in cats if c != r]
        raw = mu[cats] - mu[r]
    else:
        total = (mu * counts[:, None, None]).sum(0)
        rest = (total - mu * counts[:, None, None]) / (data.n - counts)[:, None, None]
        raw = mu - rest
    if order == "norm":
        perm = raw.norm(dim=-1).mean(-1).argsort(descending=True)
    elif order == "given":
        perm = torch.arange(len(cats))
    else:
        raise ValueError(f"order must be 'norm' or 'given', got {order!r}")
    raw = raw[perm]
    names = [str(data.classes[cats[i]]) for i in perm.tolist()]
    Q, diag = orthonormalize(raw.transpose(0, 1))                        # [L, k', d]
    alive = (diag.abs().amax(0) > 0).nonzero().flatten()                  # drop directions spanned by earlier ones
    Q, diag, names = Q[:, alive], diag[:, alive], [names[i] for i in alive.tolist()]
    return _subspace(Q, diag, data, "category", names, reference=None if reference is None else str(reference))


def mean_diff_subspace(X: Any, y: Any = None, groups: Any = None, k: int | None = None,
                       positive: Any = None) -> Subspace:
    """Top-``k`` components of class-mean differences, signed so class 1 projects higher.

    With ``groups`` (e.g. harm category, template, source dataset) the rows are the per-group differences
    ``mean(class 1 in g) - mean(class 0 in g)``, so rank grows with the number of groups; without groups and
    with more than two classes, the rows are class means minus the grand mean (between-class scatter).
    """
    if groups is None:
        data = as_data(X, y, min_classes=2)
        mu, counts = class_means(data.X, data.y, len(data.classes))
        grand = (mu * counts[:, None, None]).sum(0) / counts.sum()
        rows = (mu - grand) * counts.sqrt()[:, None, None]
        V, s = top_components(rows.transpose(0, 1), k or len(data.classes) - 1)
        return _subspace(V, s, data, "mean_diff_subspace", meta_classes=[str(c) for c in data.classes])
    data = as_data(X, y, groups=groups, positive=positive, max_classes=2)
    gcodes, gnames = encode_labels(groups, data.n, name="groups")
    diffs, used = [], []
    for g in range(len(gnames)):
        m = gcodes == g
        yg = data.y[m]
        if yg.unique().numel() < 2:
            continue
        mu, _ = class_means(data.X[m], yg, 2)
        diffs.append(mu[1] - mu[0])
        used.append(str(gnames[g]))
    if not diffs:
        raise ValueError("no group holds both classes; each group needs class-0 and class-1 samples")
    D = torch.stack(diffs, 1)                                            # [L, G, d]
    V, s = top_components(D, k or len(diffs))
    V = sign_by_labels(V, data.X, data.y)
    return _subspace(V, s / len(diffs) ** 0.5, data, "mean_diff_subspace", groups=used)


def pca_subspace(X: Any, y: Any = None, k: int = 8, *, pairs: Sequence[tuple[int, int]] | None = None,
                 paired: bool = True, positive: Any = None) -> Subspace:
    """Top-``k`` principal components of paired differences (``paired=True``) or of centred activations."""
    data = as_data(X, y, positive=positive, max_classes=2)
    if paired:
        pos, neg = _pairs(data, pairs)
        M = (data.X[pos] - data.X[neg]).transpose(0, 1)
        V, s = top_components(M, k)
        s = s / M.shape[1] ** 0.5
    else:
        V, s = top_components(data.X.transpose(0, 1), k, center=True)
        s = s / data.n ** 0.5
    V = sign_by_labels(V, data.X, data.y)
    return _subspace(V, s, data, "pca_diff_subspace" if paired else "pca_subspace")


def _orth(A: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis ``[..., d, r]`` of the row space of ``A [..., k, d]`` (rank-deficient rows dropped)."""
    U, s, _ = torch.linalg.svd(A.transpose(-1, -2), full_matrices=False)
    keep = s > s.amax(-1, keepdim=True) * max(A.shape[-2:]) * torch.finfo(A.dtype).eps
    if not bool(keep.all()):
        if A.dim() > 2:
            raise ValueError("a basis is rank deficient; give full-rank bases when passing a batch of them")
        U = U[:, keep]
    return U


def principal_angles(A: Any, B: Any, layer: int | str | None = None) -> torch.Tensor:
    """Principal angles (radians, float64, ascending) between the spans of the rows of ``A [..., k_a, d]`` and ``B [..., k_b, d]``.

    Bases need not be orthonormal. ``A`` / ``B`` may be :class:`Subspace` s (all layers ``[n_layers, k]``, or one
    ``layer``) or :class:`Direction` s (one row per layer). Small angles come from sines, large ones from cosines
    (Knyazev and Argentati's rule), so both ends are accurate; ``min(k_a, k_b)`` angles per leading index.
    """
    A, B = (_basis_rows(t, layer) for t in (A, B))
    if A.shape[-1] != B.shape[-1]:
        raise ValueError(f"the bases have widths {A.shape[-1]} and {B.shape[-1]}; they come from different models")
    Qa, Qb = _orth(A.double()), _orth(B.double())
    if Qa.shape[-1] < Qb.shape[-1]:
        Qa, Qb = Qb, Qa
    cos = torch.linalg.svdvals(Qa.transpose(-1, -2) @ Qb).clamp(max=1.0)          # descending
    resid = Qb - Qa @ (Qa.transpose(-1, -2) @ Qb)
    sin = torch.linalg.svdvals(resid).clamp(max=1.0).flip(-1)                       # ascending -> pairs with cos
    return torch.where(cos ** 2 > 0.5, torch.arcsin(sin), torch.arccos(cos))


def _basis_rows(t: Any, layer: int | str | None) -> torch.Tensor:
    if isinstance(t, Subspace):
        return t.bases if layer is None else t.at(layer)
    if isinstance(t, Direction):
        return t.vectors[:, None] if layer is None else t.at(layer)[None]
    t = torch.as_tensor(t)
    if t.dim() < 2:
        raise ValueError(f"a basis is [k, d] (rows span the subspace), got shape {tuple(t.shape)}")
    return t
