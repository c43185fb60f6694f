"""LEACE (equal to the concept-erasure package) and INLP, batched over layers."""

import pytest
import torch
from concept_erasure import LeaceFitter

import probes
from probes.erasure import _trace_mix


def correlated(n=600, L=3, d=20, seed=0, dtype=torch.float64, k=2):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(L, d, d, generator=g, dtype=dtype) * torch.logspace(-1, 0.5, d, dtype=dtype)
    y = torch.randint(0, k, (n,), generator=g)
    X = torch.einsum("nle,lde->nld", torch.randn(n, L, d, generator=g, dtype=dtype), A) + 3.0
    means = torch.randn(k, L, d, generator=g, dtype=dtype)
    return X + means[y], y


@pytest.mark.parametrize("options", [{}, {"shrinkage": False}, {"affine": False}, {"constrain_cov_trace": False},
                                     {"svd_tol": 0.5}, {"method": "orth"}])
def test_leace_equals_concept_erasure(options):
    X, y = correlated()
    ours = probes.fit_leace(X, y, **options)
    erased = ours(X)
    for layer in range(X.shape[1]):
        ref = LeaceFitter.fit(X[:, layer], y.double(), **options).eraser
        assert (ref(X[:, layer]) - erased[:, layer]).abs().max() < 1e-5
        assert (ref.P - ours.P[layer]).abs().max() < 1e-5


def test_leace_singular_covariance_takes_the_general_path():
    X, y = correlated(n=30, L=2, d=40)                                 # fewer samples than dimensions
    for options in ({"shrinkage": False}, {}):
        ours = probes.fit_leace(X, y, **options)
        assert ours.meta["path"] == ("eigh" if options else "cholesky")
        for layer in range(2):
            ref = LeaceFitter.fit(X[:, layer], y.double(), **options).eraser
            assert (ref(X[:, layer]) - ours(X)[:, layer]).abs().max() < 1e-5


def test_leace_multiclass_and_float32():
    X, y = correlated(k=4)
    ours = probes.fit_leace(X, y)
    z = torch.nn.functional.one_hot(y, 4).double()
    ref = LeaceFitter.fit(X[:, 1], z).eraser
    assert (ref(X[:, 1]) - ours(X)[:, 1]).abs().max() < 1e-5
    # float32 input: computed in float64 inside, stays within 1e-5 of the float64 reference (relative to scale)
    ours32 = probes.fit_leace(X.float(), y)
    scale = X.abs().max()
    assert ((ref(X[:, 1]) - ours32(X.float())[:, 1].double()).abs().max() / scale) < 1e-5
    assert ours32.left.dtype == torch.float32


def test_no_linear_probe_beats_constant_after_leace():
    X, y = correlated(n=800, k=2, seed=3)
    before = probes.fit_logistic(X, y, l2=1e-3)
    assert (before.score(X, y) > 0.9).all()
    erased = probes.fit_leace(X, y)(X)
    # class-conditional means coincide, so the cross-covariance with the label is zero ...
    gap = erased[y == 1].mean(0) - erased[y == 0].mean(0)
    assert gap.abs().max() < 1e-8
    # ... so the regularised logistic optimum is w = 0: it predicts the constant (majority) everywhere
    probe = probes.fit_logistic(erased, y, l2=1e-3, tol=1e-9)
    assert probe.coef.abs().max() < 1e-6
    majority = max(float((y == 1).float().mean()), float((y == 0).float().mean()))
    assert (probe.score(erased, y) <= majority + 1e-6).all()


def test_trace_mix_keeps_covariance_trace():
    """When a (mismatched) oblique projection would inflate the variance, the blend restores tr(Sigma)."""
    g = torch.Generator().manual_seed(0)
    d, k = 8, 2
    B = torch.randn(1, d, d, generator=g, dtype=torch.float64)
    sigma = B @ B.transpose(1, 2) + 0.1 * torch.eye(d, dtype=torch.float64)
    u, _ = torch.linalg.qr(torch.randn(1, d, k, generator=g, dtype=torch.float64))
    left = torch.randn(1, d, k, generator=g, dtype=torch.float64) * 3
    right = u.transpose(1, 2)
    eye = torch.eye(d, dtype=torch.float64)
    P = eye - left @ right
    assert torch.trace((P @ sigma @ P.transpose(1, 2))[0]) > torch.trace(sigma[0])
    a = _trace_mix(sigma, left, right, u)
    assert 0 <= float(a) < 1
    Q = eye - u @ u.transpose(1, 2)
    mixed = a * P + (1 - a) * Q
    assert torch.isclose(torch.trace((mixed @ sigma @ mixed.transpose(1, 2))[0]), torch.trace(sigma[0]), rtol=1e-9)


def test_leace_on_activations_and_save_load(tmp_path):
    from interp.activations import Activations

    X, y = correlated(n=200, L=2)
    acts = Activations(tensor=X.float(), sites=["blocks.0.hook_resid_post", "blocks.4.hook_resid_post"],
                       labels=y.tolist(), model_id="m")
    er = probes.fit_leace(acts)
    out = er(acts)
    assert isinstance(out, Activations) and out.sites == acts.sites and torch.equal(out.tensor, er(X.float()))
    er.save(tmp_path / "e")
    back = probes.erasure.LeaceEraser.load(tmp_path / "e")
    assert torch.equal(back.left, er.left) and back.fitted_on == er.fitted_on and back.meta == er.meta
    P, bias = er.at(4)
    assert P.shape == (20, 20) and bias.shape == (20,)
    with pytest.raises(FileExistsError):
        er.save(tmp_path / "e")


def test_inlp_removes_linear_signal():
    g = torch.Generator().manual_seed(0)
    n, L, d = 900, 2, 24
    y = (torch.rand(n, generator=g) < 0.5).long()
    U = torch.linalg.qr(torch.randn(d, 3, generator=g))[0].T          # signal spread over three directions
    sign = (y.float() * 2 - 1)[:, None]
    X = torch.randn(n, L, d, generator=g) + (sign * (1.2 * U[0] + 0.4 * torch.randn(n, 1, generator=g) * U[1]))[:, None]
    X = X + (sign * 0.8 * U[2])[:, None]
    er = probes.fit_inlp(X, y, n_iter=6)
    assert er.basis.shape == (L, 6, d)
    gram = torch.einsum("lkd,ljd->lkj", er.basis, er.basis)
    assert torch.allclose(gram, torch.eye(6).expand(L, 6, 6), atol=1e-5)
    assert (er.dev_accuracy[0] > 0.85).all()
    assert ((er.dev_accuracy[-1] - 0.5).abs() < 0.1).all(), er.dev_accuracy
    # a fresh probe cannot decode the concept from the erased activations on held-out folds
    after = probes.cross_validate(er(X), y, config=probes.CVConfig(n_folds=5, control=False))
    assert ((after.mean("accuracy") - 0.5).abs() < 0.08).all(), after.mean("accuracy")
    assert len(er.to_frame()) == 6 * L


def test_erasure_fitted_inside_folds():
    X, y = correlated(n=600, L=2, k=2, seed=5)
    res = probes.erasure_cv(X, y, eraser="leace", config=probes.CVConfig(n_folds=4))
    assert (res.before.mean("accuracy") > 0.9).all()
    # LEACE fitted on the training folds only: held-out accuracy drops to about chance
    assert (res.after.mean("auroc") < 0.62).all(), res.after.mean("auroc")
    assert res.before.folds == res.after.folds
    for f in res.before.folds:
        assert not set(f["train"]) & set(f["test"])
    frame = res.to_frame()
    assert set(frame["stage"]) == {"before", "after"}
