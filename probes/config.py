"""The option values of the probe functions: the logistic solver's (:class:`LogisticConfig`) and the
cross-validation's (:class:`CVConfig`), each with the keywords it replaced and where they went."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class LogisticConfig:
    """The L-BFGS solver of :func:`solve_logistic`: at most ``max_iter`` steps to gradient tolerance ``tol``, a
    ``memory`` of past steps, ``inner_steps`` line-search steps, on standardised features when ``standardize``.
    ``precond``: ``"full"`` (Cholesky of the covariance, from about ``precond_rows`` samples; default ``2 d``),
    ``"lowrank"`` (top-64 eigenpairs, for widths where ``d x d`` per layer is too big), ``"none"`` or ``"auto"``;
    built only if ``precond_after`` steps have not converged. It changes the speed, never the minimiser."""

    standardize: bool = True
    max_iter: int = 100
    tol: float = 1e-5
    memory: int = 3
    inner_steps: int = 3
    precond: str = "auto"
    precond_after: int = 1
    precond_rows: int | None = None

    def __post_init__(self) -> None:
        if self.precond not in ("auto", "full", "lowrank", "none"):
            raise ValueError(f"precond must be 'auto', 'full', 'lowrank' or 'none', got {self.precond!r}")
        if self.max_iter < 0 or self.tol <= 0 or self.memory < 1 or self.inner_steps < 1:
            raise ValueError("max_iter must be >= 0, tol > 0, memory and inner_steps >= 1")


LOGISTIC_MOVED = {**{f.name: f"config=probes.LogisticConfig({f.name}=...)" for f in fields(LogisticConfig)},
                  "seed": "runtime=interp.Runtime(seed=...)",
                  "progress": "runtime=interp.Runtime(progress=...) (desc= names the bar)"}


@dataclass(frozen=True)
class CVConfig:
    """Cross-validation of probes: ``n_folds`` folds (stratified; grouped when groups are given), the logistic
    probe's penalty ``l2`` (or scikit-learn's ``C`` instead: ``l2 = 1 / (C n_train)``) and, for
    :func:`probes.cross_validate`, a shuffled-label ``control``."""

    n_folds: int = 5
    l2: float = 1e-3
    C: float | None = None
    control: bool = True

    def __post_init__(self) -> None:
        if self.l2 <= 0:
            raise ValueError(f"l2 must be > 0 (it keeps the problem strictly convex), got {self.l2}")
        if self.C is not None and self.C <= 0:
            raise ValueError(f"C must be > 0, got {self.C}")


CV_MOVED = {**{f.name: f"config=probes.CVConfig({f.name}=...)" for f in fields(CVConfig)},
            "seed": "runtime=interp.Runtime(seed=...)", "progress": "runtime=interp.Runtime(progress=...)"}


__all__ = ["CVConfig", "LogisticConfig"]
