"""Batched logistic probes: same minimiser as scikit-learn's LogisticRegression, folds and layers in one solve."""

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

import probes
from probes.config import LogisticConfig
from probes.logistic import solve_logistic


def anisotropic(n=800, L=3, d=24, seed=0, signal=1.0):
    g = torch.Generator().manual_seed(seed)
    Q = torch.linalg.qr(torch.randn(d, d, generator=g))[0]
    scales = torch.logspace(-1, 1, d)
    y = (torch.rand(n, generator=g) < 0.4).long()
    u = torch.randn(L, d, generator=g)
    u = u / u.norm(dim=-1, keepdim=True)
    X = (torch.randn(n, L, d, generator=g) * scales) @ Q + 5.0 + (y.float() * signal)[:, None, None] * u
    return X, y


@pytest.mark.parametrize("l2", [1e-1, 1e-2, 1e-3])
def test_matches_sklearn_objective(l2):
    X, y = anisotropic()
    probe = probes.fit_logistic(X, y, l2=l2, tol=1e-7, max_iter=500)
    for layer in range(X.shape[1]):
        xs = X[:, layer].double().numpy()
        scaler = StandardScaler().fit(xs)
        ref = LogisticRegression(C=probes.logistic.sklearn_C(l2, len(y)), tol=1e-10, max_iter=10_000)
        ref.fit(scaler.transform(xs), y.numpy())
        ours = probe.coef_standardized[layer].double()
        theirs = torch.tensor(ref.coef_[0])
        assert (ours - theirs).norm() / theirs.norm() < 2e-3, (layer, l2)
        # decision values agree on raw inputs (our coef / intercept live in raw activation space)
        ours_z = probe.decision_function(X)[:, layer].double()
        theirs_z = torch.tensor(ref.decision_function(scaler.transform(xs)))
        assert (ours_z - theirs_z).abs().max() < 2e-2 * theirs_z.abs().max()
    assert probe.grad_max.max() < 1e-6


def test_C_argument_equals_l2():
    X, y = anisotropic(n=400)
    a = probes.fit_logistic(X, y, C=0.5)
    b = probes.fit_logistic(X, y, l2=probes.logistic.l2_from_C(0.5, 400))
    assert torch.allclose(a.coef, b.coef) and abs(a.l2 - 1 / (0.5 * 400)) < 1e-12


def test_batched_layers_and_folds_equal_separate_fits():
    X, y = anisotropic(n=500, L=4)
    Xl = X.transpose(0, 1)
    g = torch.Generator().manual_seed(0)
    train = torch.rand(3, 500, generator=g) < 0.7
    together = solve_logistic(Xl, y, train, 1e-2, LogisticConfig(tol=1e-7, max_iter=500))
    for f in range(3):
        for layer in range(4):
            alone = solve_logistic(Xl[layer:layer + 1, train[f]], y[train[f]], torch.ones(1, int(train[f].sum()),
                                   dtype=torch.bool), 1e-2, LogisticConfig(tol=1e-7, max_iter=500))
            a, b = together.coef[layer, f], alone.coef[0, 0]
            assert (a - b).norm() / b.norm() < 2e-4          # float32 passes: agreement to the gradient noise floor
            # standardisation was fitted on this fold's training samples only
            assert torch.allclose(together.mu[layer, f], X[train[f], layer].mean(0), atol=1e-4)


def test_per_fold_labels_and_heldout_logits():
    X, y = anisotropic(n=400, L=2, signal=3.0)
    train = torch.zeros(2, 400, dtype=torch.bool)
    train[0, :300] = True
    train[1, 100:] = True
    shuffled = y[torch.randperm(400, generator=torch.Generator().manual_seed(1))]
    fit = solve_logistic(X.transpose(0, 1), torch.stack([y, shuffled]), train, 1e-2)
    acc_real = ((fit.logits[:, 0, 300:] > 0).long() == y[300:]).float().mean()
    acc_ctrl = ((fit.logits[:, 1, :100] > 0).long() == shuffled[:100]).float().mean()
    assert acc_real > 0.9 and acc_ctrl < 0.7


def test_probe_methods_and_direction():
    X, y = anisotropic(n=600, signal=3.0)
    probe = probes.fit_logistic(X, y)
    assert probe.coef.shape == (3, 24) and probe.intercept.shape == (3,)
    p = probe.predict_proba(X)
    assert p.shape == (600, 3) and ((p >= 0) & (p <= 1)).all()
    assert (probe.score(X, y) > 0.9).all()
    d = probe.direction()
    assert torch.allclose(d.raw, probe.coef, atol=1e-6) and d.method == "logistic"
    assert len(probe.fitted_on) == 600


def test_sklearn_on_float32_inputs_handles_large_offsets():
    """A residual stream can carry a large constant offset; centring inside the solver keeps float32 exact enough."""
    X, y = anisotropic(n=600, L=1, signal=2.0)
    X = X + 300.0
    probe = probes.fit_logistic(X, y, l2=1e-2, tol=1e-7)
    xs = X[:, 0].double().numpy()
    scaler = StandardScaler().fit(xs)
    ref = LogisticRegression(C=probes.logistic.sklearn_C(1e-2, 600), tol=1e-10, max_iter=10_000).fit(scaler.transform(xs), y.numpy())
    theirs = torch.tensor(ref.coef_[0])
    assert (probe.coef_standardized[0].double() - theirs).norm() / theirs.norm() < 5e-3
    assert np.isfinite(probe.intercept.numpy()).all()
