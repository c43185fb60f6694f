"""L2 logistic-regression probes in torch, batched over layers *and* folds (one solve for all of them).

Objective per layer and fold (the same as scikit-learn's with ``C = 1 / (l2 * n_train)``)::

    mean_i log(1 + exp(-s_i z_i)) + l2/2 |w|^2,   z_i = ((x_i - mu) / sd) . w + b

with ``mu``/``sd`` the standardisation fitted on that fold's training samples only (the bias is not
penalised). The solver is a sequential-subspace Newton method: each outer step minimises the objective
exactly (a few small Newton steps) over the span of the preconditioned gradient and the last few steps.
The preconditioner is ``(s C + l2 I)^-1`` with ``C`` the standardised covariance of the layer, which makes
the ill-conditioned spectra of real residual streams cheap (about 10 steps where L-BFGS takes hundreds).
Each step needs two passes over the data (one for the gradient, one to map the new direction to logits),
read in place, and each pass serves every layer and fold at once. Folds never see their held-out samples:
the training masks weight the loss, and standardisation uses training samples only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from tqdm.auto import tqdm

from interp.bundle import Fitted, from_provenance, read_object, register_kind, save_object
from interp.coerce import check_width, layer_tensor
from interp.values import Runtime, moved_keywords
from probes._checks import as_data
from probes._precond import FullPreconditioner, LowRankPreconditioner
from probes.config import LOGISTIC_MOVED, LogisticConfig
from probes.objects import Direction

_STEPS = torch.tensor([1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125, 0.0078125, 0.0])


def sklearn_C(l2: float, n_train: int) -> float:
    """scikit-learn's ``C`` for our ``l2`` weight on ``n_train`` samples (same minimiser)."""
    return 1.0 / (l2 * n_train)


def l2_from_C(C: float, n_train: int) -> float:
    return 1.0 / (C * n_train)


@dataclass
class LogisticFit:
    """Raw solver output for ``L`` layers x ``F`` folds (standardised coordinates)."""

    w: torch.Tensor         # [L, F, d]   weights on standardised features
    b: torch.Tensor         # [L, F]      bias on standardised features
    mu: torch.Tensor        # [L, F, d]   training mean per fold
    sd: torch.Tensor        # [L, F, d]   training std per fold (1 where constant or standardize=False)
    logits: torch.Tensor    # [L, F, n]   decision values of every sample under each fold's probe
    n_iter: int
    grad_max: torch.Tensor  # [L, F]      max |gradient| at exit

    @property
    def coef(self) -> torch.Tensor:
        """Weights in raw activation space ``[L, F, d]``."""
        return self.w / self.sd

    @property
    def intercept(self) -> torch.Tensor:
        return self.b - (self.mu * self.coef).sum(-1)


@moved_keywords(LOGISTIC_MOVED)
def solve_logistic(Xl: Float[torch.Tensor, "L n d"], y: torch.Tensor, train: torch.Tensor, l2: float,
                   config: LogisticConfig | None = None, runtime: Runtime | None = None,
                   desc: str | None = None) -> LogisticFit:
    """Fit ``L x F`` probes: ``Xl [L, n, d]`` (layers first), ``y [n]`` or ``[F, n]`` in {0, 1} (per-fold labels,
    e.g. shuffled controls), ``train [F, n]`` bool masks; the solver's options in ``config``. ``runtime``: the
    seed of the low-rank preconditioner and a bar over the solver's iterations (default off; ``desc`` names it),
    with the share of probes converged.
    """
    cfg = config or LogisticConfig()
    runtime = runtime if runtime is not None else Runtime(progress=False)
    standardize, max_iter, tol, precond, seed = cfg.standardize, cfg.max_iter, cfg.tol, cfg.precond, runtime.seed
    M, n_f, yd, pos = _check_problem(y, train, l2, precond)
    L, n, d = Xl.shape
    Fo = train.shape[0]
    shift, mu_all, sq, sd_all = _moments(Xl, M, n_f, standardize)
    mu, sd = mu_all[:, :Fo].contiguous(), sd_all[:, :Fo].contiguous()
    prob = _Problem(Xl, yd, M, n_f, M / n_f[:, None], sd, shift.double() + mu.double(), l2)  # centre: fold means
    if precond == "auto":
        precond = "full" if L * d * d <= 2 ** 26 else "lowrank"

    def make_precond() -> FullPreconditioner | LowRankPreconditioner | None:
        if precond == "full":
            return FullPreconditioner(Xl, shift, sd_all[:, Fo], cfg.precond_rows or 2 * d, l2)
        if precond == "lowrank":
            return LowRankPreconditioner(Xl, shift, sd_all[:, Fo], sq[:, Fo] if standardize else None, 64, seed)
        return None

    desc = desc or f"logistic probes ({L} layers x {Fo} fits)"
    with tqdm(total=max_iter, desc=desc, unit="step", disable=not runtime.progress, leave=False) as bar:
        w, b, it, gmax = _descend(prob, pos, max_iter, tol, cfg.memory, cfg.inner_steps, make_precond,
                                  cfg.precond_after, bar)
    z = prob.image(w) + b[..., None]
    return LogisticFit(w=w.to(prob.dt), b=b.to(prob.dt), mu=prob.centre.to(prob.dt), sd=sd, logits=z.to(prob.dt),
                       n_iter=it, grad_max=gmax.to(prob.dt))


def _check_problem(y: torch.Tensor, train: torch.Tensor, l2: float, precond: str
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate the options and labels; returns fold masks ``M [F, n]``, fold sizes, labels (float64), positives."""
    if precond not in ("auto", "full", "lowrank", "none"):
        raise ValueError(f"precond must be 'auto', 'full', 'lowrank' or 'none', got {precond!r}")
    if l2 <= 0:
        raise ValueError(f"l2 must be > 0 (it keeps the problem strictly convex), got {l2}")
    M = train.to(torch.float64)
    n_f = M.sum(1)                                                      # [F]
    yd = y.to(torch.float64)
    if yd.dim() == 2 and yd.shape != M.shape:
        raise ValueError(f"per-fold labels have shape {tuple(yd.shape)}; expected {tuple(M.shape)}")
    pos = (M * yd).sum(1)
    if ((pos == 0) | (pos == n_f)).any():
        raise ValueError("a training fold holds only one class; use fewer folds or stratified / grouped folds "
                         "with both classes in each")
    return M, n_f, yd, pos


def _moments(Xl: torch.Tensor, M: torch.Tensor, n_f: torch.Tensor, standardize: bool
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-layer shift, per-fold (and whole-set, last row) means, squares and standard deviations.

    The passes read the caller's tensor in place (a strided view is fine for BLAS): no [L, n, d] copy.
    Moments come from one sweep over cache-sized blocks of layers, centred per layer in a reused buffer
    so float32 keeps its precision under large offsets. ``shift + mu`` is each fold's training mean.
    """
    L, n, d = Xl.shape
    Fo, dt = M.shape[0], Xl.dtype
    Mx = torch.cat([M / n_f[:, None], torch.full((1, n), 1.0 / n, dtype=torch.float64)]).to(dt)
    shift = torch.empty(L, 1, d, dtype=dt)
    mu_all = torch.empty(L, Fo + 1, d, dtype=dt)
    sq = torch.empty(L, Fo + 1, d, dtype=dt)
    block = max(1, (8 << 20) // max(1, n * d * Xl.element_size()))
    buf = torch.empty(min(block, L), n, d, dtype=dt)
    for lo in range(0, L, block):
        hi = min(L, lo + block)
        b = buf[: hi - lo]
        shift[lo:hi] = Xl[lo:hi].mean(1, keepdim=True)
        torch.sub(Xl[lo:hi], shift[lo:hi], out=b)
        torch.matmul(Mx, b, out=mu_all[lo:hi])
        if standardize:
            b.mul_(b)
            torch.matmul(Mx, b, out=sq[lo:hi])
    del buf
    if standardize:
        var = (sq.double() - mu_all.double() ** 2).clamp_min(0)
        sd_all = torch.where(var > 1e-12 * var.amax(-1, keepdim=True).clamp_min(1e-30), var.sqrt(),
                             torch.ones_like(var)).to(dt)
    else:
        sd_all = torch.ones_like(mu_all)
    return shift, mu_all, sq, sd_all


@dataclass
class _Problem:
    """The data terms every step needs: ``Xl [L, n, d]``, labels, fold masks and weights, standardisation."""

    Xl: torch.Tensor
    yd: torch.Tensor
    M: torch.Tensor
    n_f: torch.Tensor
    wts: torch.Tensor
    sd: torch.Tensor
    centre: torch.Tensor
    l2: float

    @property
    def dt(self) -> torch.dtype:
        return self.Xl.dtype

    def image(self, G: torch.Tensor) -> torch.Tensor:
        """Logits contribution ``((x - mean)/sd) . g`` for every sample: ``G [L, F, d] -> [L, F, n]`` (one pass)."""
        v = G / self.sd.double()
        return torch.matmul(v.to(self.dt), self.Xl.transpose(1, 2)).double() - (self.centre * v).sum(-1, keepdim=True)

    def gradient(self, z: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = (torch.sigmoid(z) - self.yd) * self.M / self.n_f[:, None]  # [L, F, n]
        xr = torch.matmul(r.to(self.dt), self.Xl).double()              # one pass
        g = (xr - self.centre * r.sum(-1, keepdim=True)) / self.sd.double() + self.l2 * w
        return g, r.sum(-1)

    def objective(self, z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return _objective(z, self.yd, self.wts) + 0.5 * self.l2 * (w * w).sum(-1)


def _descend(prob: _Problem, pos: torch.Tensor, max_iter: int, tol: float, memory: int, inner_steps: int,
             make_precond: Any, precond_after: int, bar: Any = None
             ) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """The outer sequential-subspace Newton loop from the prior-only start; returns ``w, b, n_iter, grad_max``."""
    L, n, d = prob.Xl.shape
    Fo = prob.M.shape[0]
    prior = (pos / prob.n_f).clamp(1e-6, 1 - 1e-6)
    w = torch.zeros(L, Fo, d, dtype=torch.float64)
    b = torch.log(prior / (1 - prior)).expand(L, Fo).clone()
    z = b[..., None].expand(L, Fo, n).clone()
    steps: list[torch.Tensor] = []
    step_imgs: list[torch.Tensor] = []
    pre, built, it = None, False, 0
    g, gb = prob.gradient(z, w)
    gmax = torch.maximum(g.abs().amax(-1), gb.abs())
    active = gmax > tol
    obj = prob.objective(z, w)
    while it < max_iter and bool(active.any()):
        it += 1
        if not built and it > precond_after:
            pre, built = make_precond(), True
        if pre is not None:
            curv = (torch.sigmoid(z) * torch.sigmoid(-z) * prob.M).sum(-1) / prob.n_f   # mean p(1-p) [L, F]
            g = pre.apply(g, curv, prob.l2)
        D = torch.stack([g] + steps, 2)                                 # [L, F, k, d]
        Zd = torch.stack([prob.image(g)] + step_imgs, 2)                # [L, F, k, n]
        scale = D.norm(dim=-1).clamp_min(1e-300)
        D, Zd = D / scale[..., None], Zd / scale[..., None]
        alpha, beta = _subspace_newton(z, Zd, D, w, prob.yd, prob.wts, prob.l2, inner_steps)
        alpha, beta = alpha * active[..., None], beta * active          # converged probes stay put
        step = (alpha[..., None] * D).sum(2)
        step_img = (alpha[..., None] * Zd).sum(2)
        w, b = w + step, b + beta
        z = z + step_img + beta[..., None]
        if it % 10 == 0:                                                # undo drift of the running logits
            z = prob.image(w) + b[..., None]
        steps = [step] + steps[: memory - 1]
        step_imgs = [step_img] + step_imgs[: memory - 1]
        g, gb = prob.gradient(z, w)
        gmax = torch.maximum(g.abs().amax(-1), gb.abs())
        new_obj = prob.objective(z, w)
        stalled = (obj - new_obj) <= 1e-13 * obj.abs()                  # at the precision floor
        active = active & (gmax > tol) & ~stalled
        obj = new_obj
        if bar is not None:
            bar.update(1)
            bar.set_postfix(converged=f"{int((~active).sum())}/{active.numel()}", refresh=False)
    return w, b, it, gmax


def _objective(z: torch.Tensor, yd: torch.Tensor, wts: torch.Tensor) -> torch.Tensor:
    return ((F.softplus(z) - yd * z) * wts).sum(-1)


def _subspace_newton(z: torch.Tensor, Zd: torch.Tensor, D: torch.Tensor, w: torch.Tensor, yd: torch.Tensor,
                     wts: torch.Tensor, l2: float, n_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Minimise the objective over ``w + D^T alpha``, ``b + beta`` (``k + 1`` unknowns per layer/fold).

    Damped Newton: a full step when it decreases the objective enough (Armijo), else the best of a few
    shorter steps; stops early once the Newton decrement is negligible.
    """
    L, Fo, k, n = Zd.shape
    A = torch.cat([Zd, torch.ones(L, Fo, 1, n, dtype=Zd.dtype)], 2)     # [L, F, k+1, n]
    gram = torch.einsum("lfkd,lfjd->lfkj", D, D)
    Dw = torch.einsum("lfkd,lfd->lfk", D, w)
    theta = torch.zeros(L, Fo, k + 1, dtype=torch.float64)
    reg = torch.zeros(L, Fo, k + 1, k + 1, dtype=torch.float64)
    reg[..., :k, :k] = l2 * gram
    eye = torch.eye(k + 1, dtype=torch.float64)

    def quad(a: torch.Tensor) -> torch.Tensor:                          # penalty part that depends on alpha
        return l2 * (a * Dw).sum(-1) + 0.5 * l2 * torch.einsum("lfk,lfkj,lfj->lf", a, gram, a)

    zz = z
    cur = _objective(zz, yd, wts)
    for _ in range(n_steps):
        p = torch.sigmoid(zz)
        grad = torch.einsum("lfkn,lfn->lfk", A, (p - yd) * wts)
        grad[..., :k] += l2 * (Dw + torch.einsum("lfkj,lfj->lfk", gram, theta[..., :k]))
        H = torch.einsum("lfkn,lfjn->lfkj", A * (p * (1 - p) * wts)[:, :, None], A) + reg
        ridge = 1e-10 * torch.diagonal(H, dim1=-2, dim2=-1).amax(-1).clamp_min(1e-30)
        delta = -torch.linalg.solve(H + ridge[..., None, None] * eye, grad[..., None])[..., 0]
        slope = (grad * delta).sum(-1)                                  # <= 0
        if bool((slope.abs() <= 1e-15 * cur.abs().clamp_min(1e-30)).all()):
            break
        dz = torch.einsum("lfk,lfkn->lfn", delta, A)
        base = cur - quad(theta[..., :k])
        new = _objective(zz + dz, yd, wts) + quad(theta[..., :k] + delta[..., :k])
        t = torch.ones(L, Fo, dtype=torch.float64)
        bad = new > base + quad(theta[..., :k]) + 1e-4 * slope
        if bool(bad.any()):
            ts = _STEPS.to(torch.float64)
            yc = yd[:, None] if yd.dim() == 2 else yd
            cand = _objective(zz[:, :, None] + ts[:, None] * dz[:, :, None], yc, wts[:, None])
            cand = cand + torch.stack([quad(theta[..., :k] + s * delta[..., :k]) for s in ts.tolist()], -1)
            t = torch.where(bad, ts[cand.argmin(-1)], t)
            new = torch.where(bad, cand.min(-1).values, new)
        theta = theta + t[..., None] * delta
        zz = zz + t[..., None] * dz
        cur = new
    return theta[..., :k], theta[..., k]


@dataclass
class LogisticProbe(Fitted):
    """Fitted probe per layer: ``coef [n_layers, d]`` and ``intercept [n_layers]`` in raw activation space."""

    coef: torch.Tensor
    intercept: torch.Tensor
    mean: torch.Tensor
    scale: torch.Tensor
    l2: float
    sites: list[str]
    classes: list[Any]
    n_iter: int = 0
    grad_max: torch.Tensor | None = None

    @property
    def coef_standardized(self) -> torch.Tensor:
        return self.coef * self.scale

    def decision_function(self, X: Any) -> Float[torch.Tensor, "n n_layers"]:
        x = layer_tensor(X, self.sites, check_finite=True)
        check_width(self.coef, x.shape[-1], "probe")
        return torch.einsum("nld,ld->nl", x.to(self.coef.dtype), self.coef) + self.intercept

    def predict_proba(self, X: Any) -> Float[torch.Tensor, "n n_layers"]:
        return torch.sigmoid(self.decision_function(X))

    def predict(self, X: Any) -> torch.Tensor:
        return (self.decision_function(X) > 0).long()

    def score(self, X: Any, y: Any = None) -> Float[torch.Tensor, " n_layers"]:
        """Accuracy per layer on ``X`` with labels ``y`` (encoded with the classes seen in fitting)."""
        data = as_data(X, y, min_classes=1)
        codes = _recode(data.classes, data.y, self.classes)
        return (self.predict(data.X) == codes[:, None]).float().mean(0)

    def direction(self) -> Direction:
        """The probe's normal vector in activation space, unit per layer (norm = |coef|)."""
        return Direction.from_vectors(self.coef, self.sites, **self.provenance_kwargs(
            method="logistic", meta={"l2": self.l2, "classes": [str(c) for c in self.classes]}))

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> None:
        """``PATH/tensors.safetensors`` + ``PATH/meta.json``, atomically; refuses to overwrite by default."""
        tensors = {"coef": self.coef, "intercept": self.intercept, "mean": self.mean, "scale": self.scale}
        if self.grad_max is not None:
            tensors["grad_max"] = self.grad_max
        own = {"l2": self.l2, "classes": list(self.classes), "n_iter": self.n_iter}
        save_object(path, "probes.LogisticProbe", tensors, self.provenance, own, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike) -> LogisticProbe:
        """Load what :meth:`save` wrote."""
        b = read_object(path, "probes.LogisticProbe")
        t, f = b.tensors, b.fields
        return cls(t["coef"], t["intercept"], t["mean"], t["scale"], f["l2"], b.provenance.sites, f["classes"],
                   f["n_iter"], t.get("grad_max"), **from_provenance(b.provenance))


register_kind("probes.LogisticProbe", LogisticProbe.load)


def _recode(got: list[Any], codes: torch.Tensor, want: list[Any]) -> torch.Tensor:
    unknown = [c for c in got if c not in want]
    if unknown:
        raise ValueError(f"labels {unknown} were not seen when fitting (classes {want})")
    table = torch.tensor([want.index(c) for c in got], dtype=torch.long)
    return table[codes]


def fit_logistic(X: Any, y: Any = None, *, l2: float = 1e-3, C: float | None = None, standardize: bool = True,
                 max_iter: int = 100, tol: float = 1e-5, positive: Any = None) -> LogisticProbe:
    """Fit one L2 logistic probe per layer, all layers in one batched solve.

    ``l2``: weight of ``l2/2 |w|^2`` on the mean log-loss (on standardised features when ``standardize``);
    or give scikit-learn's ``C`` instead (``l2 = 1 / (C n)``). Returns a :class:`LogisticProbe`.
    """
    data = as_data(X, y, positive=positive, max_classes=2)
    if C is not None:
        l2 = l2_from_C(C, data.n)
    Xl = data.X.transpose(0, 1)
    fit = solve_logistic(Xl, data.y, torch.ones(1, data.n, dtype=torch.bool), l2,
                         LogisticConfig(standardize=standardize, max_iter=max_iter, tol=tol))
    return LogisticProbe(coef=fit.coef[:, 0], intercept=fit.intercept[:, 0], mean=fit.mu[:, 0], scale=fit.sd[:, 0],
                         l2=l2, sites=data.sites, classes=data.classes, method="logistic", model_id=data.model_id,
                         data_hash=data.data_hash, fitted_on=list(data.sample_ids), n_iter=fit.n_iter,
                         grad_max=fit.grad_max[:, 0])
