"""Batched linear algebra used across the package (all batched over a leading layer axis)."""

from __future__ import annotations

import torch


def class_means(X: torch.Tensor, y: torch.Tensor, n_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class means of ``X [n, L, d]``: ``([n_classes, L, d] float64, counts [n_classes])`` in one matmul pass."""
    n, L, d = X.shape
    onehot = torch.zeros(n_classes, n, dtype=X.dtype)
    onehot[y, torch.arange(n)] = 1.0
    counts = onehot.sum(1).double()
    if (counts == 0).any():
        missing = (counts == 0).nonzero().flatten().tolist()
        raise ValueError(f"classes {missing} have no samples")
    sums = (onehot @ X.reshape(n, L * d)).reshape(n_classes, L, d).double()
    return sums / counts[:, None, None], counts


def shrink_covariance(S: torch.Tensor, n: int | float) -> torch.Tensor:
    """Linear shrinkage of sample covariances ``S [..., d, d]`` (normalised by n) toward ``(tr S / d) I``.

    Weight from random-matrix theory (Chen, Wiesel, Eldar & Hero; Ledoit-Wolf style): with ``m = tr S / d``,
    ``rho = (d m)^2 / n / (|S|_F^2 - d m^2)``; the estimate is ``(1 - rho) S + rho m I`` (rho clipped to [0, 1]).
    """
    d = S.shape[-1]
    m = torch.diagonal(S, dim1=-2, dim2=-1).sum(-1) / d                    # [...]
    spread = (S * S).sum((-2, -1)) - d * m * m                              # |S - mI|_F^2
    tiny = torch.finfo(S.dtype).eps
    rho = ((d * m) ** 2 / n + tiny) / (spread + tiny)
    rho = rho.clamp(0.0, 1.0)
    out = S * (1 - rho)[..., None, None]
    out.diagonal(dim1=-2, dim2=-1).add_((rho * m)[..., None])
    return out


def top_components(M: torch.Tensor, k: int, center: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` right singular vectors of ``M [L, m, d]`` (rows = samples): ``(V [L, k, d], s [L, k])``.

    Works on the smaller of ``M^T M`` / ``M M^T`` in float64, so it is exact and batched over layers.
    """
    A = M.double()
    if center:
        A = A - A.mean(1, keepdim=True)
    L, m, d = A.shape
    k = min(k, m, d)
    if d <= m:
        evals, evecs = torch.linalg.eigh(A.transpose(1, 2) @ A)            # ascending
        V = evecs.flip(-1)[..., :k].transpose(1, 2)                         # [L, k, d]
        s = evals.flip(-1)[..., :k].clamp_min(0).sqrt()
    else:
        evals, evecs = torch.linalg.eigh(A @ A.transpose(1, 2))             # [L, m, m]
        U = evecs.flip(-1)[..., :k]                                         # [L, m, k]
        s = evals.flip(-1)[..., :k].clamp_min(0).sqrt()
        V = (U.transpose(1, 2) @ A) / s.clamp_min(1e-300)[..., None]
    return V, s


def orthonormalize(V: torch.Tensor, tol: float = 1e-10) -> tuple[torch.Tensor, torch.Tensor]:
    """Gram-Schmidt (via QR) of rows ``V [L, k, d]`` in the given order: ``(Q [L, k, d], diag(R) [L, k])``.

    A row that is (numerically) inside the span of the earlier ones comes back as zeros.
    """
    Q, R = torch.linalg.qr(V.double().transpose(1, 2))                     # Q [L, d, k]
    diag = torch.diagonal(R, dim1=-2, dim2=-1)
    sign = torch.where(diag < 0, -1.0, 1.0).to(Q.dtype)
    Q = Q * sign[:, None, :]
    diag = diag * sign
    scale = V.double().norm(dim=-1).amax(-1, keepdim=True).clamp_min(1e-300)
    keep = (diag / scale) > tol
    return (Q * keep[:, None, :]).transpose(1, 2), diag * keep


def sign_by_labels(V: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Flip rows of ``V [L, k, d]`` so class 1 projects above class 0 on every component."""
    mu, _ = class_means(X, y, 2)
    gap = torch.einsum("lkd,ld->lk", V.double(), (mu[1] - mu[0]))
    return V * torch.where(gap < 0, -1.0, 1.0).to(V.dtype)[..., None]
