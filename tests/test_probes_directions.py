"""Direction methods on synthetic activations with a planted direction: recovery at high signal, chance at none."""

import pytest
import torch

import probes
from probes import Direction


def planted(n=1200, L=3, d=32, signal=3.0, seed=0, offset=2.0):
    """Isotropic noise + a random mean offset + ``+-signal/2`` along a unit ``u`` per layer (sign by label)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(L, d, generator=g)
    u = u / u.norm(dim=-1, keepdim=True)
    y = (torch.rand(n, generator=g) < 0.5).long()
    X = torch.randn(n, L, d, generator=g) + offset * torch.randn(L, d, generator=g)
    X = X + (y.float() - 0.5)[:, None, None] * signal * u
    return X, y, u


METHODS = ["mean_diff", "pca_diff", "pca", "lda", "logistic"]


@pytest.mark.parametrize("method", METHODS)
def test_recovers_planted_direction(method):
    X, y, u = planted(n=4000, signal=3.0)
    d = probes.fit_direction(X, y, method=method)
    assert isinstance(d, Direction) and d.vectors.shape == u.shape
    cos = (d.vectors * u).sum(-1)
    assert (cos > 0.99).all(), f"{method}: cosines {cos.tolist()}"
    assert torch.allclose(d.vectors.norm(dim=-1), torch.ones(3), atol=1e-5)
    assert d.method == method and len(d.fitted_on) == len(y)


@pytest.mark.parametrize("method", METHODS)
def test_chance_without_signal(method):
    X, y, _ = planted(n=600, signal=0.0, seed=1)
    scores = probes.cross_validate(X, y, method=method, config=probes.CVConfig(n_folds=5, control=False))
    assert scores.auroc.shape == (5, 3)
    assert (scores.mean("auroc") - 0.5).abs().max() < 0.08, scores.mean("auroc")
    assert (scores.mean("accuracy") - 0.5).abs().max() < 0.08


@pytest.mark.parametrize("method", METHODS)
def test_high_heldout_auroc_with_signal(method):
    X, y, _ = planted(n=600, signal=3.0, seed=2)
    scores = probes.cross_validate(X, y, method=method, config=probes.CVConfig(n_folds=4, control=False))
    assert (scores.mean("auroc") > 0.95).all(), scores.mean("auroc")  # Bayes AUROC here is 0.983
    assert (scores.mean("cohens_d") > 2.0).all()


def test_diff_of_means_raw_and_norms():
    X, y, _ = planted(n=400, signal=2.0)
    d = probes.diff_of_means(X, y)
    raw = X[y == 1].double().mean(0) - X[y == 0].double().mean(0)
    assert torch.allclose(d.raw.double(), raw, atol=1e-5)
    assert torch.allclose(d.norms.double(), raw.norm(dim=-1), atol=1e-5)
    # the sign follows the positive class
    flipped = probes.diff_of_means(X, y, positive=0)
    assert torch.allclose(flipped.vectors, -d.vectors, atol=1e-6)


def test_string_labels_and_positive():
    X, y, u = planted(n=400, signal=3.0)
    labels = ["harmful" if v else "harmless" for v in y.tolist()]
    d = probes.diff_of_means(X, labels, positive="harmful")
    assert ((d.vectors * u).sum(-1) > 0.95).all()
    assert d.meta["classes"] == ["harmless", "harmful"]


def test_pca_diff_with_explicit_pairs():
    g = torch.Generator().manual_seed(3)
    n, d = 300, 24
    u = torch.randn(d, generator=g)
    u /= u.norm()
    base = torch.randn(n, 1, d, generator=g) * 3                       # shared content per pair
    pos = base + 1.0 * u + 0.1 * torch.randn(n, 1, d, generator=g)
    neg = base - 1.0 * u + 0.1 * torch.randn(n, 1, d, generator=g)
    X = torch.cat([pos, neg])
    y = torch.cat([torch.ones(n), torch.zeros(n)]).long()
    pairs = [(i, n + i) for i in range(n)]
    dirn = probes.directions.pca_diff(X, y, pairs=pairs)
    assert (dirn.vectors[0] @ u) > 0.99
    # the centred PCA is dominated by the shared content and misses u
    assert abs(probes.directions.pca_centered(X, y).vectors[0] @ u) < 0.5


def test_lda_whitens_correlated_noise():
    """With strongly anisotropic noise the LDA/logistic direction is Sigma^-1 u, not u; LDA must find it."""
    g = torch.Generator().manual_seed(4)
    n, d = 4000, 16
    scales = torch.linspace(0.2, 5.0, d)
    y = (torch.rand(n, generator=g) < 0.5).long()
    u = torch.ones(d) / d ** 0.5
    X = (torch.randn(n, 1, d, generator=g) * scales) + (y.float() - 0.5)[:, None, None] * 2 * u
    target = u / scales ** 2
    target /= target.norm()
    assert probes.directions.lda(X, y, shrinkage=0.0).vectors[0] @ target > 0.99
    assert probes.diff_of_means(X, y).vectors[0] @ target < 0.8


def test_random_controls():
    X, y, u = planted(n=800, d=256, signal=3.0)
    rand = probes.random_directions(256, n=20, n_layers=3, seed=0)
    assert len(rand) == 20 and rand[0].vectors.shape == (3, 256)
    assert torch.allclose(rand[0].vectors.norm(dim=-1), torch.ones(3), atol=1e-6)
    gaps = torch.stack([(probes.evaluate_direction(X, y, r).auroc - 0.5).abs() for r in rand])
    assert gaps.median() < 0.08 and gaps.max() < 0.25, gaps      # a random unit vector has cos ~ 1/16 with u
    d = probes.diff_of_means(X, y)
    orth = probes.directions.random_orthogonal(d, n=4, seed=1)
    for o in orth:
        assert (o.vectors * d.vectors).sum(-1).abs().max() < 1e-5
        s = probes.evaluate_direction(X, y, o)
        assert (s.auroc - 0.5).abs().max() < 0.1     # orthogonal to the signal: at chance
    V = torch.stack([o.vectors for o in orth], 1)
    gram = torch.einsum("lkd,ljd->lkj", V, V)
    assert gram.shape == (3, 4, 4)
    assert torch.allclose(gram, torch.eye(4).expand(3, 4, 4), atol=1e-5)
    assert probes.evaluate_direction(X, y, d, allow_overlap=True).auroc.min() > 0.95


def test_activations_input_and_layers():
    from interp.activations import Activations

    X, y, u = planted(n=300, signal=3.0, L=4)
    acts = Activations(tensor=X, sites=[f"blocks.{i}.hook_resid_post" for i in range(4)], model_id="m",
                       labels=[bool(v) for v in y.tolist()], prompt_ids=[f"p{i}" for i in range(300)])
    d = probes.diff_of_means(acts)
    assert d.sites == acts.sites and d.model_id == "m" and d.fitted_on[:2] == ["p0", "p1"]
    assert d.data_hash and d.data_hash != probes.diff_of_means(acts[list(range(200))]).data_hash
    assert torch.equal(d.at(2), d.vectors[2]) and torch.equal(d.at("blocks.3.hook_resid_post"), d.vectors[3])
    assert torch.equal(d.at("resid_post.1"), d.vectors[1])
    assert ((d.vectors * u).sum(-1) > 0.95).all()
    with pytest.raises(KeyError, match="not among"):
        d.at(7)
