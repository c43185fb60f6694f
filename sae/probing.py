"""Sparse probing (SAEBench's definition): how well the top-``k`` latents of an SAE read a labelled binary concept.

Latents are mean-pooled over each prompt's real tokens, ranked by ``|mean(class 1) - mean(class 0)|`` on the
training split, and a logistic probe on the top ``k`` is scored on the held-out split. The probe is fitted by the
``solver`` the caller passes, :func:`probes.logistic.solve_logistic` (``sae`` shares a floor with ``probes`` and may
not import it; any function with its signature and ``.logits [L, F, n]`` / ``.coef [L, F, d]`` output works). Beside it: the same probe on the full pooled residual (the ceiling), on ``k`` random live latents
(the control) and on a bag of tokens (the lexical baseline the caller passes, e.g.
``interp.studies.directions.biases.lexical_features``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float

from interp.bundle import Result
from interp.evals.rates import wilson
from interp.sites import parse_site
from sae.model import SAE

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class SparseProbeConfig:
    """``ks``: probe sizes; ``concept``: the label's name; ``test_fraction`` of each class held out (seeded by ``seed``); ``l2``: the probes' ridge
    on standardised features; ``lexical_l2``: the bag-of-tokens probe's (sparse, wide features)."""

    ks: tuple[int, ...] = (1, 2, 5, 10, 20)
    concept: str = ""
    test_fraction: float = 0.3
    l2: float = 1e-3
    lexical_l2: float = 1.0
    seed: int = 0


@dataclass
class SparseProbing(Result):
    """Held-out accuracy by ``k`` (``accuracy [K]`` with Wilson ``low`` / ``high``), the ``k``-random-latent control
    (``control [K]``: random live latents other than the chosen, else any others), the full-residual ceiling and the lexical baseline; ``latents``: the ranking's top ``max(ks)``."""

    concept: str
    ks: torch.Tensor
    accuracy: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor
    control: torch.Tensor
    latents: torch.Tensor
    residual_accuracy: float
    residual_ci: list[float]
    lexical_accuracy: float
    n_train: int
    n_test: int

    def summary(self) -> dict[str, Any]:
        """Accuracy at each ``k`` with its interval, the control, the residual ceiling and the lexical baseline."""
        return {"concept": self.concept, "n_train": self.n_train, "n_test": self.n_test,
                **{f"acc_k{k}": round(float(a), 4) for k, a in zip(self.ks.tolist(), self.accuracy)},
                **{f"control_k{k}": round(float(a), 4) for k, a in zip(self.ks.tolist(), self.control)},
                "residual_accuracy": self.residual_accuracy, "residual_ci": self.residual_ci,
                "lexical_accuracy": self.lexical_accuracy, "top_latents": self.latents[:5].tolist()}

    def to_frame(self) -> pd.DataFrame:
        """One row per ``k``: ``accuracy`` with ``low`` / ``high`` (Wilson 95%), ``control``, ``residual``, ``lexical``."""
        import pandas as pd

        return pd.DataFrame({"concept": self.concept, "k": self.ks.tolist(), "accuracy": self.accuracy.tolist(),
                             "low": self.low.tolist(), "high": self.high.tolist(), "control": self.control.tolist(),
                             "residual": self.residual_accuracy, "lexical": self.lexical_accuracy})

    def plot(self, title: str | None = None) -> Any:
        """Accuracy by ``k`` (random-latent control dotted), with the residual ceiling and the lexical baseline."""
        from interp.viz.finetune import method_curves

        ks = self.ks.tolist()
        curves = {"top-k latents": (ks, self.accuracy.tolist()), "residual (ceiling)": (ks, [self.residual_accuracy] * len(ks)),
                  "bag of tokens": (ks, [self.lexical_accuracy] * len(ks))}
        return method_curves(curves, {"top-k latents": (ks, self.control.tolist())}, "k latents", "held-out accuracy",
                             title or f"sparse probing: {self.concept}")


def check_sae_site(sae: SAE, site: str | None) -> str | None:
    """The site the data come from, refusing one that differs from the SAE's own (``None``: the SAE's)."""
    if site is None or sae.site is None:
        return site or sae.site
    if parse_site(site).name != sae.site:
        raise ValueError(f"activations come from {site!r} but the SAE was trained at {sae.site!r}; capture at the "
                         f"SAE's site (site={sae.site!r}) or use an SAE trained at {site!r}")
    return sae.site


def pooled_latents(sae: SAE, model: Any, prompts: Any, site: str | None = None, batch_size: int = 8
                   ) -> tuple[Float[torch.Tensor, "n d_sae"], Float[torch.Tensor, "n d"]]:
    """Per prompt, the mean over its real non-special tokens of the SAE's latents ``[n, d_sae]`` and of the
    residual at the SAE's site ``[n, d]`` (prompts as :func:`sae.runner.sae_encodings` reads them)."""
    from sae.edits import check_site
    from sae.runner import site_tokens

    site = check_site(sae, model, check_sae_site(sae, site))
    zs, xs = [], []
    with torch.no_grad():
        for x, b in site_tokens(model, site, prompts, batch_size):
            keep = b.attention_mask.bool()
            if b.special_mask is not None:
                keep = keep & ~b.special_mask.bool()
            w = keep.float()[..., None]
            z = sae.encode(x.to(sae.device)).float().cpu()
            n = w.sum(1).clamp_min(1)
            zs.append((z * w).sum(1) / n)
            xs.append((x * w).sum(1) / n)
    return torch.cat(zs), torch.cat(xs)


def stratified_split(y: torch.Tensor, test_fraction: float, seed: int) -> torch.Tensor:
    """Boolean training mask ``[n]``: ``test_fraction`` of each class held out (at least one), seeded."""
    g = torch.Generator().manual_seed(seed)
    train = torch.ones(len(y), dtype=torch.bool)
    for c in y.unique():
        idx = (y == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        n_test = max(1, round(test_fraction * len(idx)))
        if n_test >= len(idx):
            raise ValueError(f"class {int(c)} has {len(idx)} sample(s); a train/test split needs at least 2 per class")
        train[idx[:n_test]] = False
    return train


Solver = Callable[..., Any]
SOLVER_HELP = "pass solver=probes.logistic.solve_logistic (sae shares a floor with probes and cannot import it)"


def check_solver(solver: Solver | None) -> Solver:
    if not callable(solver):
        raise TypeError(f"no logistic solver given: {SOLVER_HELP}")
    return solver


def heldout_accuracy(X: torch.Tensor, y: torch.Tensor, train: torch.Tensor, l2: float, solver: Solver
                     ) -> tuple[float, int]:
    """Fit a logistic probe on the ``train`` rows of ``X [n, d]`` and return (accuracy, correct count) on the rest."""
    fit = solver(X.float()[None], y, train[None], l2)
    pred = (fit.logits[0, 0] > 0).long()
    right = int((pred == y)[~train].sum())
    return right / int((~train).sum()), right


def rank_by_mean_diff(z: torch.Tensor, y: torch.Tensor, absolute: bool = True) -> torch.Tensor:
    """Latent order ``[d_sae]`` by the difference of class means (class 1 minus class 0), largest first."""
    diff = z[y == 1].mean(0) - z[y == 0].mean(0)
    return (diff.abs() if absolute else diff).argsort(descending=True, stable=True)


def _labels(y: Any) -> torch.Tensor:
    y = torch.as_tensor(y).long().flatten()
    if set(y.unique().tolist()) != {0, 1}:
        raise ValueError(f"sparse probing needs binary labels with both classes 0 and 1 present, got classes "
                         f"{sorted(set(y.unique().tolist()))}; pass a labelled set holding both")
    return y


def sparse_probing(latents: Float[torch.Tensor, "n d_sae"], residual: Float[torch.Tensor, "n d"], y: Any,
                   lexical: Float[torch.Tensor, "n v"] | None, solver: Solver | None = None,
                   config: SparseProbeConfig | None = None) -> SparseProbing:
    """k-sparse probes on pooled ``latents`` against the ``residual`` ceiling, ``k`` random live latents and the
    ``lexical`` bag of tokens (``None``: reported as NaN, say why); labels ``y [n]`` in {0, 1}; ``solver``:
    :func:`probes.logistic.solve_logistic`."""
    cfg = config or SparseProbeConfig()
    solver = check_solver(solver)
    y = _labels(y)
    if not (len(latents) == len(residual) == len(y)) or (lexical is not None and len(lexical) != len(y)):
        raise ValueError(f"latents ({len(latents)}), residual ({len(residual)}), labels ({len(y)}) and lexical "
                         f"features must have one row per prompt")
    d_sae = latents.shape[-1]
    if max(cfg.ks) > d_sae or min(cfg.ks) < 1:
        raise ValueError(f"ks {cfg.ks} must lie in 1..d_sae={d_sae}; drop the larger k")
    train = stratified_split(y, cfg.test_fraction, cfg.seed)
    order = rank_by_mean_diff(latents[train], y[train])
    live = (latents[train] != 0).any(0).nonzero().flatten()
    g = torch.Generator().manual_seed(cfg.seed + 1)
    acc, low, high, ctrl = [], [], [], []
    n_test = int((~train).sum())
    for k in cfg.ks:
        a, right = heldout_accuracy(latents[:, order[:k]], y, train, cfg.l2, solver)
        lo, hi = wilson(right, n_test)
        pool = live[~torch.isin(live, order[:k])]  # k random live latents, none of the chosen ones
        pool = pool if len(pool) >= k else order[k:]
        rand = pool[torch.randperm(len(pool), generator=g)[:k]]
        acc.append(a), low.append(lo), high.append(hi)
        ctrl.append(heldout_accuracy(latents[:, rand], y, train, cfg.l2, solver)[0])
    r_acc, r_right = heldout_accuracy(residual, y, train, cfg.l2, solver)
    lex = heldout_accuracy(lexical, y, train, cfg.lexical_l2, solver)[0] if lexical is not None else float("nan")
    return SparseProbing(cfg.concept, torch.tensor(cfg.ks), torch.tensor(acc), torch.tensor(low), torch.tensor(high),
                         torch.tensor(ctrl), order[: max(cfg.ks)].clone(), r_acc, list(wilson(r_right, n_test)),
                         lex, int(train.sum()), n_test)


def probe_concept(sae: SAE, model: Any, prompts: Sequence[str] | Any, y: Any, lexical: torch.Tensor | None,
                  solver: Solver | None = None, config: SparseProbeConfig | None = None, site: str | None = None
                  ) -> SparseProbing:
    """:func:`sparse_probing` on ``prompts`` run through ``model`` (latents pooled by :func:`pooled_latents`)."""
    _labels(y)
    check_solver(solver)
    z, x = pooled_latents(sae, model, prompts, site)
    return sparse_probing(z, x, y, lexical, solver, config)


__all__ = ["SparseProbeConfig", "SparseProbing", "check_sae_site", "check_solver", "heldout_accuracy", "pooled_latents",
           "probe_concept", "rank_by_mean_diff", "sparse_probing", "stratified_split"]
