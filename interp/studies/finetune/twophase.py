"""The two-phase shape of a curve over training steps: ``y(t) = c + a_fast exp(-k_fast t) + a_slow exp(-k_slow t)``
(fast then slow), fitted by least squares, with bootstrap intervals over prompts.

The fit: a grid over rate pairs (the linear parameters solved exactly for each), then Levenberg-Marquardt on all
five parameters (log rates) from the best pair. Torch only, float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from interp.evals.bootstrap import percentile_interval, resample_ids


@dataclass
class TwoPhaseFit:
    """Fitted rates (per step) and amplitudes, the residual RMS, and (bootstrap) 95% intervals by parameter;
    ``at_bound``: the fast phase is faster than the eval spacing resolves (a jump; ``k_fast`` is then the bound)."""

    k_fast: float
    k_slow: float
    a_fast: float
    a_slow: float
    c: float
    rmse: float
    n_points: int
    ci95: dict[str, list[float]] = field(default_factory=dict)
    n_boot: int = 0
    at_bound: bool = False

    def predict(self, t: torch.Tensor) -> torch.Tensor:
        t = torch.as_tensor(t, dtype=torch.float64)
        return self.c + self.a_fast * torch.exp(-self.k_fast * t) + self.a_slow * torch.exp(-self.k_slow * t)

    def record(self) -> dict[str, Any]:
        return {"k_fast": self.k_fast, "k_slow": self.k_slow, "a_fast": self.a_fast, "a_slow": self.a_slow,
                "c": self.c, "rmse": self.rmse, "n_points": self.n_points, "n_boot": self.n_boot,
                "fast_at_bound": self.at_bound,
                **{f"{k}_ci95": v for k, v in self.ci95.items()}}


def _model(theta: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Prediction and Jacobian for ``theta = (c, a1, a2, log k1, log k2)``."""
    c, a1, a2, l1, l2 = theta
    e1, e2 = torch.exp(-l1.exp() * t), torch.exp(-l2.exp() * t)
    jac = torch.stack([torch.ones_like(t), e1, e2, -a1 * t * l1.exp() * e1, -a2 * t * l2.exp() * e2], 1)
    return c + a1 * e1 + a2 * e2, jac


def bounds(t: torch.Tensor) -> tuple[float, float]:
    """The rates a curve sampled at ``t`` can resolve, as log rates: from a twentieth of one change over the whole
    span to a change within a fifth of the closest eval spacing (a faster one is a jump, reported at the bound)."""
    return math.log(0.05 / float(t.max() - t.min())), math.log(5.0 / float(torch.diff(t).min()))


def _grid(t: torch.Tensor, y: torch.Tensor, n_grid: int) -> torch.Tensor:
    lo, hi = bounds(t)
    ks = torch.logspace(lo / math.log(10), hi / math.log(10), n_grid, dtype=torch.float64)
    i, j = torch.triu_indices(n_grid, n_grid, 1)
    x = torch.stack([torch.ones(len(i), len(t), dtype=torch.float64), torch.exp(-ks[i, None] * t),
                     torch.exp(-ks[j, None] * t)], -1)                                    # [pairs, T, 3]
    beta = torch.linalg.lstsq(x, y.expand(len(i), -1)[..., None], driver="gelsd").solution[..., 0]
    sse = ((x @ beta[..., None])[..., 0] - y).pow(2).sum(-1)
    b = int(sse.nan_to_num(float("inf")).argmin())
    return torch.stack([beta[b, 0], beta[b, 1], beta[b, 2], ks[i[b]].log(), ks[j[b]].log()])


def _lm(theta: torch.Tensor, t: torch.Tensor, y: torch.Tensor, iters: int) -> torch.Tensor:
    lam, (lo, hi) = 1e-3, bounds(t)
    pred, jac = _model(theta, t)
    cost = float((pred - y).pow(2).sum())
    for _ in range(iters):
        a = jac.T @ jac
        g = jac.T @ (pred - y)
        step = torch.linalg.solve(a + lam * torch.diag(a.diagonal()) + 1e-30 * torch.eye(5, dtype=a.dtype), -g)
        new = theta + step
        new[3:] = new[3:].clamp(lo, hi)
        p2, j2 = _model(new, t)
        c2 = float((p2 - y).pow(2).sum())
        if math.isfinite(c2) and c2 <= cost:
            done = cost - c2 <= 1e-18 * max(cost, 1e-300) or float(step.abs().max()) < 1e-13
            theta, pred, jac, cost, lam = new, p2, j2, c2, max(lam / 3, 1e-12)
            if done:
                break
        else:
            lam *= 4
            if lam > 1e12:
                break
    return theta


def fit_two_phase(t: Any, y: Any, n_grid: int = 40, iters: int = 300) -> TwoPhaseFit:
    """Least-squares fit of the two-exponential shape to ``y [T]`` at steps ``t [T]`` (increasing, >= 5 points)."""
    t = torch.as_tensor(t, dtype=torch.float64).flatten()
    y = torch.as_tensor(y, dtype=torch.float64).flatten()
    if t.numel() != y.numel():
        raise ValueError(f"{t.numel()} steps for {y.numel()} values; give one value per step")
    if t.numel() < 5:
        raise ValueError(f"a two-phase fit has 5 parameters and needs at least 5 points, got {t.numel()}; "
                         f"evaluate more often (a smaller eval_every) or train longer")
    if not bool((torch.diff(t) > 0).all()):
        raise ValueError("steps must be strictly increasing")
    theta = _lm(_grid(t, y, n_grid), t, y, iters)
    c, a1, a2, l1, l2 = (float(v) for v in theta)
    k1, k2 = math.exp(l1), math.exp(l2)
    if k1 < k2:
        k1, k2, a1, a2 = k2, k1, a2, a1
    rmse = float((_model(theta, t)[0] - y).pow(2).mean().sqrt())
    return TwoPhaseFit(k1, k2, a1, a2, c, rmse, int(t.numel()), at_bound=math.log(k1) >= bounds(t)[1] - 1e-9)


def bootstrap_two_phase(t: Any, per_prompt: torch.Tensor, n_boot: int = 200, seed: int = 0) -> TwoPhaseFit:
    """The fit of the mean curve of ``per_prompt [T, n]`` (one column per prompt) with 95% percentile intervals
    from ``n_boot`` resamplings of the prompts (the same prompts at every step)."""
    y = per_prompt.double()
    fit = fit_two_phase(t, y.mean(1))
    if n_boot < 1:
        return fit
    gen = torch.Generator().manual_seed(seed)
    keys = ("k_fast", "k_slow", "a_fast", "a_slow", "c")
    draws = []
    for _ in range(n_boot):
        idx = resample_ids(y.shape[1], 1, gen)[0]
        f = fit_two_phase(t, y[:, idx].mean(1))
        draws.append([getattr(f, k) for k in keys])
    d = torch.tensor(draws, dtype=torch.float64)
    lo, hi = percentile_interval(d)
    fit.ci95 = {k: [float(lo[i]), float(hi[i])] for i, k in enumerate(keys)}
    fit.n_boot = n_boot
    return fit


__all__ = ["TwoPhaseFit", "bootstrap_two_phase", "fit_two_phase"]
