"""Preconditioners for the batched logistic solver: approximations of ``(s C + l2 I)^-1`` per layer.

``C`` is the covariance of the standardised activations (all samples, one per layer, shared by the folds)
and ``s`` the mean logistic curvature ``p (1 - p)``, so the matrix tracks the Hessian's scale. Either one
only changes how fast the solver converges, never its minimiser.
"""

from __future__ import annotations

import torch


class FullPreconditioner:
    """``(s C + l2 I)^-1`` per layer by Cholesky, ``C`` from every ``n // rows``-th sample, in float32 (a
    preconditioner needs no more); refactored only if ``s`` drifts by more than 4x. ``d x d`` per layer."""

    def __init__(self, Xl: torch.Tensor, shift: torch.Tensor, sd: torch.Tensor, rows: int, l2: float) -> None:
        L, n, d = Xl.shape
        Xs = Xl[:, :: max(1, n // rows)]                                 # a view, no gather
        m = Xs.shape[1]
        gram = torch.empty(L, d, d, dtype=Xl.dtype)
        buf = torch.empty(m, d, dtype=Xl.dtype)
        for i in range(L):                                              # centre one layer at a time (precision)
            torch.sub(Xs[i], shift[i], out=buf)
            torch.matmul(buf.T, buf, out=gram[i])                       # compute-bound
        inv = (1.0 / sd).float()
        gram = gram.float()
        gram.mul_(inv[:, :, None]).mul_(inv[:, None, :] / m)
        self.C = gram
        self.l2 = l2
        self.s: torch.Tensor | None = None
        self.chol: torch.Tensor | None = None

    def _factor(self, s: torch.Tensor) -> None:
        A = self.C * s.float()[:, None, None]
        A.diagonal(dim1=-2, dim2=-1).add_(self.l2)
        chol, info = torch.linalg.cholesky_ex(A)
        if bool((info != 0).any()):                                     # numerically indefinite: add a ridge
            A.diagonal(dim1=-2, dim2=-1).add_(1e-4 * A.diagonal(dim1=-2, dim2=-1).mean(-1, keepdim=True))
            chol = torch.linalg.cholesky(A)
        self.chol, self.s = chol, s

    def apply(self, g: torch.Tensor, curv: torch.Tensor, l2: float) -> torch.Tensor:
        """``P g`` for gradients ``g [L, F, d]`` at curvature ``curv [L, F]``."""
        s = curv.mean(1).clamp_min(1e-6)
        if self.s is None or bool(((s / self.s).log().abs() > 1.4).any()):
            self._factor(s)
        rhs = g.transpose(1, 2).float()
        half = torch.linalg.solve_triangular(self.chol, rhs, upper=False)
        return torch.linalg.solve_triangular(self.chol.mT, half, upper=True).transpose(1, 2).to(g.dtype)


class LowRankPreconditioner:
    """Top-``rank`` eigenpairs of ``C`` by a randomised range finder (two passes); the rest of the spectrum is
    replaced by its mean. For widths where a ``d x d`` matrix per layer is too large."""

    def __init__(self, Xl: torch.Tensor, shift: torch.Tensor, sd: torch.Tensor, second: torch.Tensor | None,
                 rank: int, seed: int) -> None:
        L, n, d = Xl.shape
        dt = Xl.dtype
        inv = (1.0 / sd.double()).to(dt)                                # [L, d]
        g = torch.Generator().manual_seed(seed)
        omega = torch.randn(L, d, rank + 8, generator=g, dtype=dt) * inv[..., None]
        Y = torch.matmul(Xl, omega) - shift @ omega                     # centred on the fly
        Q, _ = torch.linalg.qr(Y)
        B = ((torch.matmul(Q.transpose(1, 2), Xl) - Q.sum(1)[..., None] * shift) * inv[:, None]).double()
        if second is None:
            second = torch.stack([(Xl[i] - shift[i]).square().mean(0) for i in range(L)])
        _, s, Vt = torch.linalg.svd(B, full_matrices=False)
        self.evals = (s[:, :rank] ** 2) / n                              # [L, r]
        total = (second.double() * inv.double() ** 2).sum(-1)
        self.rest = ((total - self.evals.sum(-1)) / max(1, d - rank)).clamp_min(0)
        self.V = Vt[:, :rank]                                            # [L, r, d] float64

    def apply(self, g: torch.Tensor, curv: torch.Tensor, l2: float) -> torch.Tensor:
        top = 1.0 / (curv[..., None] * self.evals[:, None] + l2)        # [L, F, r]
        rest = 1.0 / (curv * self.rest[:, None] + l2)                   # [L, F]
        coords = torch.einsum("lrd,lfd->lfr", self.V, g)
        return g * rest[..., None] + torch.einsum("lfr,lrd->lfd", coords * (top - rest[..., None]), self.V)
