"""Direction fitting, one call for every layer: difference of means, PCA (paired / centred), LDA, controls.

Each function takes ``Activations`` or ``X [n, n_layers, d]`` with labels ``y [n]`` and returns a
:class:`~probes.objects.Direction` (unit vector per layer, raw norms kept) that points toward class 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float

from probes._checks import ProbeData, as_data, default_sites
from probes._linalg import class_means, orthonormalize, shrink_covariance, sign_by_labels, top_components
from probes.objects import Direction

METHODS = ("mean_diff", "pca_diff", "pca", "lda", "logistic")


def _direction(raw: torch.Tensor, data: ProbeData, method: str, dtype: torch.dtype, **meta: Any) -> Direction:
    return Direction.from_vectors(raw.to(dtype), data.sites, method=method, model_id=data.model_id,
                                  data_hash=data.data_hash, fitted_on=list(data.sample_ids),
                                  meta={"classes": [str(c) for c in data.classes], **data.carried(), **meta})


def diff_of_means(X: Any, y: Any = None, *, positive: Any = None) -> Direction:
    """Mean of class 1 minus mean of class 0 per layer (refusal-direction / CAA recipe).

    ``.vectors`` are unit-normalised, ``.norms`` the raw lengths, ``.raw`` the raw difference ``[n_layers, d]``.
    """
    data = as_data(X, y, positive=positive, max_classes=2)
    mu, _ = class_means(data.X, data.y, 2)
    return _direction(mu[1] - mu[0], data, "mean_diff", data.X.dtype)


def _pairs(data: ProbeData, pairs: Sequence[tuple[int, int]] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Index tensors ``(pos, neg)`` of paired samples; default pairs the i-th class-1 with the i-th class-0 sample."""
    if pairs is not None:
        p = torch.as_tensor(list(pairs), dtype=torch.long)
        if p.dim() != 2 or p.shape[1] != 2 or p.shape[0] == 0:
            raise ValueError("pairs must be a non-empty list of (index_of_class_1, index_of_class_0) tuples")
        if p.min() < 0 or p.max() >= data.n:
            raise ValueError(f"pair indices must lie in 0..{data.n - 1}")
        if not ((data.y[p[:, 0]] == 1).all() and (data.y[p[:, 1]] == 0).all()):
            raise ValueError("each pair must be (index of a class-1 sample, index of a class-0 sample)")
        return p[:, 0], p[:, 1]
    pos = (data.y == 1).nonzero().flatten()
    neg = (data.y == 0).nonzero().flatten()
    m = min(len(pos), len(neg))
    return pos[:m], neg[:m]


def pca_diff(X: Any, y: Any = None, *, pairs: Sequence[tuple[int, int]] | None = None, center: bool = False,
             positive: Any = None) -> Direction:
    """First principal component of paired differences ``x_pos - x_neg`` (representation-engineering style).

    ``pairs``: ``(i_class1, i_class0)`` index pairs (e.g. the same prompt with and without a trait); default
    pairs class-1 and class-0 samples in order. The sign is fixed so class 1 projects higher. ``norms`` hold
    the singular value per pair (the RMS size of the differences along the direction).
    """
    data = as_data(X, y, positive=positive, max_classes=2)
    pos, neg = _pairs(data, pairs)
    D = (data.X[pos] - data.X[neg]).transpose(0, 1)                         # [L, m, d]
    V, s = top_components(D, 1, center=center)
    V = sign_by_labels(V, data.X, data.y)[:, 0]
    n_pairs = D.shape[1]
    return _direction(V * (s[:, 0] / n_pairs ** 0.5)[:, None], data, "pca_diff", data.X.dtype, n_pairs=n_pairs,
                      center=center)


def pca_centered(X: Any, y: Any = None, *, positive: Any = None) -> Direction:
    """First principal component of the centred activations, signed so class 1 projects higher.

    Unsupervised apart from the sign: it finds the concept only when the concept dominates the variance.
    """
    data = as_data(X, y, positive=positive, max_classes=2)
    V, s = top_components(data.X.transpose(0, 1), 1, center=True)
    V = sign_by_labels(V, data.X, data.y)[:, 0]
    return _direction(V * (s[:, 0] / data.n ** 0.5)[:, None], data, "pca", data.X.dtype)


def lda(X: Any, y: Any = None, *, shrinkage: float | str = "auto", positive: Any = None) -> Direction:
    """Covariance-whitened mean difference ``Sigma_w^-1 (mu_1 - mu_0)`` (Fisher LDA), pooled within-class Sigma.

    ``shrinkage``: ``"auto"`` (random-matrix optimal shrinkage toward a scaled identity) or a weight in
    [0, 1] toward ``(tr Sigma / d) I``; keeps the solve stable when ``d`` is near or above ``n``.
    """
    data = as_data(X, y, positive=positive, max_classes=2)
    mu, counts = class_means(data.X, data.y, 2)
    Xc = data.X.double() - mu[data.y]                                       # within-class residuals [n, L, d]
    S = torch.einsum("nld,nle->lde", Xc, Xc) / data.n
    if shrinkage == "auto":
        S = shrink_covariance(S, data.n)
    else:
        a = float(shrinkage)
        if not 0.0 <= a <= 1.0:
            raise ValueError(f"shrinkage must be 'auto' or in [0, 1], got {shrinkage}")
        m = torch.diagonal(S, dim1=-2, dim2=-1).mean(-1)
        S = (1 - a) * S + a * m[:, None, None] * torch.eye(data.d, dtype=S.dtype)
    w = torch.linalg.lstsq(S, (mu[1] - mu[0])[..., None]).solution[..., 0]
    return _direction(w, data, "lda", data.X.dtype, shrinkage=shrinkage)


def fit_direction(X: Any, y: Any = None, method: str = "mean_diff", **kwargs: Any) -> Direction:
    """Dispatch to a direction method by name: one of ``mean_diff, pca_diff, pca, lda, logistic``."""
    if method == "mean_diff":
        return diff_of_means(X, y, **kwargs)
    if method == "pca_diff":
        return pca_diff(X, y, **kwargs)
    if method == "pca":
        return pca_centered(X, y, **kwargs)
    if method == "lda":
        return lda(X, y, **kwargs)
    if method == "logistic":
        from probes.logistic import fit_logistic

        return fit_logistic(X, y, **kwargs).direction()
    raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")


def random_directions(d: int, n: int = 1, *, n_layers: int = 1, sites: list[str] | None = None,
                      seed: int = 0, dtype: torch.dtype = torch.float32) -> list[Direction]:
    """``n`` random unit directions (isotropic Gaussian, one per layer) as controls."""
    if d < 1 or n < 1:
        raise ValueError(f"need d >= 1 and n >= 1, got d={d}, n={n}")
    sites = list(sites) if sites is not None else default_sites(n_layers)
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(n, len(sites), d, generator=g, dtype=torch.float64)
    return [Direction.from_vectors(raw[i].to(dtype), sites, method="random", meta={"seed": seed, "index": i})
            for i in range(n)]


def random_orthogonal(direction: Direction | Float[torch.Tensor, "n_layers d"], n: int = 1, *,
                      seed: int = 0) -> list[Direction]:
    """``n`` random unit directions orthogonal, layer by layer, to ``direction`` (and to each other)."""
    if isinstance(direction, Direction):
        base, sites = direction.vectors, direction.sites
    else:
        base = direction[None] if direction.dim() == 1 else direction
        sites = default_sites(base.shape[0])
    L, d = base.shape
    if n > d - 1:
        raise ValueError(f"at most d - 1 = {d - 1} directions fit orthogonal to one direction, asked for {n}")
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(L, n, d, generator=g, dtype=torch.float64)
    stacked = torch.cat([base.double()[:, None], raw], 1)
    Q, _ = orthonormalize(stacked)
    return [Direction.from_vectors(Q[:, i + 1].to(base.dtype), sites, method="random_orthogonal",
                                   meta={"seed": seed, "index": i}) for i in range(n)]
