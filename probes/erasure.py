"""Concept erasure, batched over layers: LEACE (closed form) and INLP (iterated null-space projection).

LEACE (Belrose et al. 2023, "LEACE: Perfect linear concept erasure in closed form"): the least-squares
affine edit ``x - W^+ U U^T W (x - mean)`` with ``W`` the whitening matrix and ``U`` the orthonormal basis
of the whitened cross-covariance ``W Sigma_xz``; afterwards no linear predictor of the concept beats a
constant one on the fitting distribution. Options mirror the reference package (`concept-erasure`):
shrinkage of ``Sigma_xx``, dropping singular values below ``svd_tol``, and never increasing the trace
of the covariance (blending toward the orthogonal projection when it would).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float

from interp.activations import Activations
from interp.bundle import Fitted, from_provenance, read_object, register_kind, save_object
from interp.coerce import check_width, layer_tensor, site_indices
from probes._checks import ProbeData, as_data, layer_index
from probes._frames import layer_sorted
from probes._linalg import orthonormalize, shrink_covariance
from probes.logistic import solve_logistic
from probes.objects import Subspace


def _apply_erase(X: Any, sites: list[str], fn: Any) -> Any:
    """Run ``fn(tensor [n, L, d]) -> tensor`` on activations; Activations come back as Activations."""
    if isinstance(X, Activations):
        x = layer_tensor(X, sites, what="the eraser")
        out = X[slice(None)]
        t = out.tensor.clone()
        t[:, site_indices(X, sites, "the eraser")] = fn(x).to(t.dtype)
        out.tensor = t
        return out
    squeeze = torch.as_tensor(X).dim() == 2
    out = fn(layer_tensor(X, sites, what="the eraser"))
    return out[:, 0] if squeeze else out


@dataclass
class LeaceEraser(Fitted):
    """Per layer: ``x -> x - ((x - bias) @ right^T) @ left^T`` with ``left [L, d, r]``, ``right [L, r, d]``."""

    left: torch.Tensor
    right: torch.Tensor
    bias: torch.Tensor | None
    sites: list[str]

    @property
    def P(self) -> Float[torch.Tensor, "n_layers d d"]:
        """The linear part ``I - left @ right`` per layer."""
        eye = torch.eye(self.left.shape[1], dtype=self.left.dtype)
        return eye - self.left @ self.right

    def at(self, layer: int | str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(P [d, d], bias [d])`` at one layer."""
        i = layer_index(self.sites, layer)
        return self.P[i], None if self.bias is None else self.bias[i]

    def _erase(self, t: torch.Tensor) -> torch.Tensor:
        check_width(self.left.transpose(1, 2), t.shape[-1], "eraser")
        x = t.to(self.left.dtype).transpose(0, 1)                        # [L, n, d] view
        coef = x @ self.right.transpose(1, 2)                           # [L, n, r]
        if self.bias is not None:
            coef = coef - (self.bias[:, None, :] @ self.right.transpose(1, 2))
        return (x - coef @ self.left.transpose(1, 2)).transpose(0, 1).to(t.dtype)

    def __call__(self, X: Any) -> Any:
        """Erase the concept from ``X [n, n_layers, d]`` (or Activations at the fitted sites)."""
        return _apply_erase(X, self.sites, self._erase)

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> None:
        tensors = {"left": self.left, "right": self.right}
        if self.bias is not None:
            tensors["bias"] = self.bias
        save_object(path, "probes.LeaceEraser", tensors, self.provenance, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike) -> LeaceEraser:
        """Load what :meth:`save` wrote (also the older flat ``meta.json`` layout)."""
        b = read_object(path, "probes.LeaceEraser")
        t = b.tensors
        return cls(t["left"], t["right"], t.get("bias"), b.provenance.sites, **from_provenance(b.provenance))


def concept_matrix(data: ProbeData, y: Any = None) -> torch.Tensor:
    """Concept values ``z [n, k]``: class 1 indicator for two classes, one-hot for more, or given floats."""
    if isinstance(y, torch.Tensor) and y.is_floating_point() and y.dim() == 2:
        return y.double()
    if len(data.classes) == 2:
        return data.y.double()[:, None]
    return torch.nn.functional.one_hot(data.y, len(data.classes)).double()


def fit_leace(X: Any, y: Any = None, *, shrinkage: bool = True, svd_tol: float = 0.01,
              constrain_cov_trace: bool = True, affine: bool = True, method: str = "leace") -> LeaceEraser:
    """Fit a LEACE eraser for every layer at once (``method="orth"``: plain orthogonal projection instead).

    ``y``: class labels (two classes -> one indicator, more -> one-hot) or a float tensor ``z [n, k]``.
    Computed in float64. Matches ``concept_erasure.LeaceFitter`` with the same options.
    """
    if svd_tol <= 0:
        raise ValueError(f"svd_tol must be > 0 for stability, got {svd_tol}")
    if method not in ("leace", "orth"):
        raise ValueError(f"method must be 'leace' or 'orth', got {method!r}")
    zgiven = isinstance(y, torch.Tensor) and y.is_floating_point() and y.dim() == 2
    data = as_data(X, None if zgiven else y, need_labels=not zgiven, min_classes=2)
    z = concept_matrix(data, y)
    if z.shape[0] != data.n:
        raise ValueError(f"z has {z.shape[0]} rows for {data.n} samples")
    n, L, d = data.X.shape
    if n < 2:
        raise ValueError("LEACE needs at least two samples")
    # moments in the input dtype, one cache-sized block of layers at a time (centred in a reused buffer);
    # everything after them in float64
    dt = data.X.dtype
    mean_x = (torch.ones(1, n, dtype=dt) @ data.X.reshape(n, L * d)).reshape(L, d).double() / n
    zc = (z - z.mean(0)).to(dt)
    k = zc.shape[1]
    xz = torch.empty(L, d, k, dtype=dt)
    gram = torch.empty(L, d, d, dtype=dt) if method == "leace" else None
    buf = torch.empty(n, d, dtype=dt)
    for i in range(L):                                                  # moment sweep, not a solver
        torch.sub(data.X[:, i], mean_x[i].to(dt), out=buf)
        torch.matmul(buf.T, zc, out=xz[i])
        if gram is not None:
            torch.matmul(buf.T, buf, out=gram[i])
    del buf
    sigma_xz = xz.double() / (n - 1)                                    # [L, d, k]
    mix = torch.ones(L, dtype=torch.float64)
    path = "orth"
    if method == "leace":
        S = gram.double()
        S = (S + S.transpose(1, 2)) * 0.5
        sigma = shrink_covariance(S / n, n) if shrinkage else S / (n - 1)
        fast = _leace_cholesky(sigma, sigma_xz, svd_tol)
        if fast is not None:
            (left, right), path = fast, "cholesky"
        else:
            (left, right, mix), path = _leace_eigh(sigma, sigma_xz, svd_tol, constrain_cov_trace), "eigh"
    else:
        u, s, _ = torch.linalg.svd(sigma_xz, full_matrices=False)
        u = u * (s > svd_tol)[:, None, :]
        left, right = u, u.transpose(1, 2)
    return LeaceEraser(left=left.to(dt), right=right.to(dt), bias=mean_x.to(dt) if affine else None,
                       sites=list(data.sites), method=method, model_id=data.model_id, data_hash=data.data_hash,
                       fitted_on=list(data.sample_ids),
                       meta={"method": method, "shrinkage": shrinkage, "svd_tol": svd_tol,
                             "constrain_cov_trace": constrain_cov_trace, "affine": affine,
                             "trace_mix": mix.tolist(), "path": path, "classes": [str(c) for c in data.classes]})


def _leace_eigh(sigma: torch.Tensor, sigma_xz: torch.Tensor, svd_tol: float,
                constrain: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """General path: whitening by eigendecomposition (pseudo-inverse for singular ``Sigma``), trace constraint."""
    L, d, _ = sigma_xz.shape
    evals, V = torch.linalg.eigh(sigma)
    keep = evals > evals[:, -1:] * d * torch.finfo(torch.float64).eps
    evals = evals.clamp_min(0)
    root = torch.where(keep, evals.sqrt(), 0.0)
    inv_root = torch.where(keep, evals.clamp_min(1e-300).rsqrt(), 0.0)
    W = (V * inv_root[:, None]) @ V.transpose(1, 2)
    W_inv = (V * root[:, None]) @ V.transpose(1, 2)
    u, s, _ = torch.linalg.svd(W @ sigma_xz, full_matrices=False)       # u [L, d, k]
    u = u * (s > svd_tol)[:, None, :]
    left = W_inv @ u                                                    # [L, d, k]
    right = u.transpose(1, 2) @ W                                       # [L, k, d]
    mix = torch.ones(L, dtype=torch.float64)
    if constrain:
        mix = _trace_mix(sigma, left, right, u)
        left = torch.cat([left * mix[:, None, None], u * (1 - mix)[:, None, None]], 2)
        right = torch.cat([right, u.transpose(1, 2)], 1)
    return left, right, mix


def _leace_cholesky(sigma: torch.Tensor, sigma_xz: torch.Tensor,
                    svd_tol: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Fast path for a well-conditioned ``Sigma`` (always so with shrinkage): no ``d x d`` eigendecomposition.

    With ``W = Sigma^-1/2`` the factors reduce to ``left = Sigma_xz V / s`` and ``right = (Sigma^-1 Sigma_xz V / s)^T``
    where ``V, s^2`` are the eigenpairs of the ``k x k`` matrix ``Sigma_xz^T Sigma^-1 Sigma_xz`` (``s`` are the
    singular values of ``W Sigma_xz``). Returns None (use the general path) when ``Sigma`` is near singular
    or the result would raise the covariance trace.
    """
    L, d, _ = sigma_xz.shape
    chol, info = torch.linalg.cholesky_ex(sigma)
    if bool((info != 0).any()):
        return None
    diag = torch.diagonal(chol, dim1=-2, dim2=-1)
    if bool(((diag.amax(-1) / diag.amin(-1)) ** 2 > 1e-3 / (d * torch.finfo(torch.float64).eps)).any()):
        return None
    solved = torch.cholesky_solve(sigma_xz, chol)                      # Sigma^-1 Sigma_xz  [L, d, k]
    M = sigma_xz.transpose(1, 2) @ solved
    ev, V = torch.linalg.eigh((M + M.transpose(1, 2)) / 2)
    s = ev.clamp_min(0).sqrt()
    scale = torch.where(s > svd_tol, 1.0 / s.clamp_min(1e-300), 0.0)
    left = (sigma_xz @ V) * scale[:, None, :]
    right = ((solved @ V) * scale[:, None, :]).transpose(1, 2)
    tr = torch.diagonal(sigma, dim1=-2, dim2=-1).sum(-1)
    rS = right @ sigma
    new = tr - 2 * torch.diagonal(rS @ left, dim1=-2, dim2=-1).sum(-1) + \
        torch.diagonal((left.transpose(1, 2) @ left) @ (rS @ right.transpose(1, 2)), dim1=-2, dim2=-1).sum(-1)
    if bool((new > tr).any()):
        return None
    return left, right


def _trace_mix(sigma: torch.Tensor, left: torch.Tensor, right: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Weight ``a`` per layer of ``a P + (1 - a) Q`` (Q the orthogonal projection) keeping ``tr`` of Sigma.

    ``a = 1`` (pure LEACE) where erasure does not increase the trace. All traces via small ``k x k`` products.
    """
    tr = torch.diagonal(sigma, dim1=-2, dim2=-1).sum(-1)
    rSl = torch.diagonal(right @ sigma @ left, dim1=-2, dim2=-1).sum(-1)                 # tr(A S)
    rSr = right @ sigma @ right.transpose(1, 2)
    ASA = torch.diagonal((left.transpose(1, 2) @ left) @ rSr, dim1=-2, dim2=-1).sum(-1)  # tr(A S A^T)
    uSu = u.transpose(1, 2) @ sigma @ u
    tr_uSu = torch.diagonal(uSu, dim1=-2, dim2=-1).sum(-1)
    ASB = torch.diagonal((u.transpose(1, 2) @ left) @ (right @ sigma @ u), dim1=-2, dim2=-1).sum(-1)
    utu = u.transpose(1, 2) @ u
    BSB = torch.diagonal(uSu @ utu, dim1=-2, dim2=-1).sum(-1)
    new = tr - 2 * rSl + ASA                                            # tr(P S P^T)
    pq = tr - tr_uSu - rSl + ASB                                        # tr(P S Q^T)
    qq = tr - 2 * tr_uSu + BSB                                          # tr(Q S Q^T)
    a2 = new - 2 * pq + qq
    a1 = 2 * pq - 2 * qq
    a0 = qq - tr
    disc = (a1 * a1 - 4 * a2 * a0).clamp_min(0).sqrt()
    safe = torch.where(a2.abs() > 0, a2, torch.ones_like(a2))
    r1 = (-a1 - disc) / (2 * safe)
    r2 = (-a1 + disc) / (2 * safe)
    alpha = torch.where(r1 > 0, r1, r2).clamp(0, 1)
    return torch.where(new > tr, alpha, torch.ones_like(alpha))


@dataclass
class INLPEraser(Fitted):
    """Iterated null-space projection: ``x -> x - (x @ B^T) @ B`` with orthonormal ``basis [L, k, d]``.

    ``dev_accuracy [n_iter, L]``: held-out accuracy of the probe fitted at each iteration (before removing
    its direction), so you can see the decodable signal fall to chance.
    """

    basis: torch.Tensor
    dev_accuracy: torch.Tensor
    majority: float
    sites: list[str]

    def _erase(self, t: torch.Tensor) -> torch.Tensor:
        check_width(self.basis, t.shape[-1], "eraser")
        x = t.to(self.basis.dtype)
        return (x - torch.einsum("nlk,lkd->nld", torch.einsum("nld,lkd->nlk", x, self.basis), self.basis)).to(t.dtype)

    def __call__(self, X: Any) -> Any:
        return _apply_erase(X, self.sites, self._erase)

    def as_subspace(self) -> Subspace:
        return Subspace(self.basis, torch.ones(self.basis.shape[:2]), list(self.sites),
                        **self.provenance_kwargs(method="inlp"))

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> None:
        """``PATH/tensors.safetensors`` + ``PATH/meta.json``, atomically; refuses to overwrite by default."""
        save_object(path, "probes.INLPEraser", {"basis": self.basis, "dev_accuracy": self.dev_accuracy},
                    self.provenance, {"majority": self.majority}, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike) -> INLPEraser:
        """Load what :meth:`save` wrote."""
        b = read_object(path, "probes.INLPEraser")
        return cls(b.tensors["basis"], b.tensors["dev_accuracy"], b.fields["majority"], b.provenance.sites,
                   **from_provenance(b.provenance))

    def to_frame(self) -> Any:
        """One row per (iteration, site), with a numeric layer column; sorted by iteration, then layer."""
        rows = [{"iteration": i, "site": s, "dev_accuracy": float(self.dev_accuracy[i, j]), "majority": self.majority}
                for i in range(self.dev_accuracy.shape[0]) for j, s in enumerate(self.sites)]
        return layer_sorted(rows, ["iteration"])


def fit_inlp(X: Any, y: Any = None, *, n_iter: int = 8, l2: float = 1e-3, dev_fraction: float = 0.25,
             seed: int = 0, positive: Any = None) -> INLPEraser:
    """INLP (Ravfogel et al. 2020): fit a linear probe, project its direction out, repeat ``n_iter`` times.

    Every layer is handled in each iteration by one batched logistic solve. Probes train on a stratified
    ``1 - dev_fraction`` share of the data and report accuracy on the rest (``dev_accuracy``).
    """
    if n_iter < 1:
        raise ValueError(f"n_iter must be >= 1, got {n_iter}")
    if not 0.0 < dev_fraction < 1.0:
        raise ValueError(f"dev_fraction must be in (0, 1), got {dev_fraction}")
    data = as_data(X, y, positive=positive, max_classes=2)
    n, L, d = data.X.shape
    if n_iter > d - 1:
        raise ValueError(f"n_iter={n_iter} would remove {n_iter} of only d={d} dimensions; use fewer iterations")
    g = torch.Generator().manual_seed(seed)
    train = torch.ones(n, dtype=torch.bool)
    for c in (0, 1):
        idx = (data.y == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        n_dev = max(1, int(round(dev_fraction * len(idx))))
        if n_dev >= len(idx):
            raise ValueError(f"class {data.classes[c]!r} has {len(idx)} samples: too few to hold some out; add data")
        train[idx[:n_dev]] = False
    Xl = data.X.transpose(0, 1).contiguous()                              # [L, n, d]
    basis = torch.zeros(L, 0, d, dtype=torch.float64)
    accs = []
    for _ in range(n_iter):
        cur = Xl if basis.shape[1] == 0 else (Xl - ((Xl.double() @ basis.transpose(1, 2)) @ basis).to(Xl.dtype))
        fit = solve_logistic(cur, data.y, train[None], l2)
        pred = (fit.logits[:, 0] > 0).long()                              # [L, n]
        accs.append((pred[:, ~train] == data.y[~train]).float().mean(-1))
        w = fit.coef[:, 0].double()                                       # [L, d] raw-space normal
        stacked = torch.cat([basis, w[:, None]], 1)
        q, _ = orthonormalize(stacked)
        basis = q
    majority = float(max((data.y[~train] == c).float().mean() for c in (0, 1)))
    return INLPEraser(basis=basis.to(data.X.dtype), dev_accuracy=torch.stack(accs), majority=majority,
                      sites=list(data.sites), method="inlp", model_id=data.model_id, data_hash=data.data_hash,
                      fitted_on=list(data.sample_ids), meta={"l2": l2, "n_iter": n_iter, "seed": seed})


register_kind("probes.LeaceEraser", LeaceEraser.load)
register_kind("probes.INLPEraser", INLPEraser.load)
