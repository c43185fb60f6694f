"""Bad input gets a clear error that says how to fix it."""

import pytest
import torch

import probes
from interp.activations import Activations


def data(n=40, L=2, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, L, d, generator=g), (torch.arange(n) % 2)


@pytest.mark.parametrize("fn", [probes.diff_of_means, probes.directions.pca_diff, probes.directions.pca_centered, probes.directions.lda,
                                probes.fit_logistic, probes.fit_leace, probes.fit_inlp, probes.cross_validate])
def test_one_class_only(fn):
    X, _ = data()
    with pytest.raises(ValueError, match="at least 2 classes.*add samples of the other class"):
        fn(X, torch.zeros(40, dtype=torch.long))


def test_fewer_samples_than_folds():
    X, y = data(n=4)
    with pytest.raises(ValueError, match="4 samples cannot fill 5 folds"):
        probes.cross_validate(X, y, config=probes.CVConfig(n_folds=5))
    with pytest.raises(ValueError, match="distinct groups"):
        probes.cross_validate(*data(n=40), groups=[i % 3 for i in range(40)], config=probes.CVConfig(n_folds=5))
    X, y = data(n=12)
    with pytest.raises(ValueError, match="lacks a class"):
        probes.cross_validate(X, torch.tensor([1] + [0] * 11), config=probes.CVConfig(n_folds=3))


@pytest.mark.parametrize("fn", [probes.diff_of_means, probes.fit_logistic, probes.cross_validate, probes.fit_leace])
def test_mismatched_lengths(fn):
    X, y = data()
    with pytest.raises(ValueError, match="39 labels for 40 samples"):
        fn(X, y[:39])


def test_mismatched_groups_and_datasets():
    X, y = data()
    with pytest.raises(ValueError, match="groups has 10 entries for 40 samples"):
        probes.cross_validate(X, y, groups=list(range(10)))
    with pytest.raises(ValueError, match="datasets"):
        probes.transfer_matrix(X, y, ["a"] * 5)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("fn", [probes.diff_of_means, probes.fit_logistic, probes.fit_leace, probes.cross_validate])
def test_nan_inf_activations(bad, fn):
    X, y = data()
    X[7, 1, 3] = bad
    with pytest.raises(ValueError, match="NaN or Inf.*first bad samples: \\[7\\]"):
        fn(X, y)


def test_wrong_width_direction():
    X, y = data(d=8)
    d16 = probes.diff_of_means(torch.randn(40, 2, 16), y)
    with pytest.raises(ValueError, match="width 16 but the activations have width 8"):
        probes.evaluate_direction(X, y, d16)
    with pytest.raises(ValueError, match="width"):
        probes.compare.project(X, d16)
    er = probes.fit_leace(torch.randn(40, 2, 16), y)
    with pytest.raises(ValueError, match="width"):
        er(X)
    probe = probes.fit_logistic(torch.randn(40, 2, 16), y)
    with pytest.raises(ValueError, match="width"):
        probe.decision_function(X)


def test_shapes_types_and_labels():
    with pytest.raises(ValueError, match=r"\[n, n_layers, d\]"):
        probes.diff_of_means(torch.randn(4, 2, 3, 5), [0, 1, 0, 1])
    with pytest.raises(TypeError, match="floating point"):
        probes.diff_of_means(torch.ones(4, 2, 3, dtype=torch.long), [0, 1, 0, 1])
    with pytest.raises(TypeError, match="Activations or a tensor"):
        probes.diff_of_means([[1.0]], [0])
    with pytest.raises(ValueError, match="no labels"):
        probes.diff_of_means(torch.randn(4, 1, 3))
    with pytest.raises(ValueError, match="at most 2 classes"):
        probes.diff_of_means(torch.randn(6, 1, 3), [0, 1, 2, 0, 1, 2])
    with pytest.raises(ValueError, match="positive="):
        probes.diff_of_means(torch.randn(4, 1, 3), ["a", "b", "a", "b"], positive="c")
    with pytest.raises(ValueError, match="None"):
        probes.diff_of_means(torch.randn(4, 1, 3), [0, None, 1, 0])
    with pytest.raises(ValueError, match="l2 must be > 0"):
        probes.fit_logistic(*data(), l2=0.0)
    with pytest.raises(ValueError, match="unknown method"):
        probes.fit_direction(*data(), method="magic")


def test_multi_position_activations_rejected():
    acts = Activations(tensor=torch.randn(4, 1, 3, 8), sites=["blocks.0.hook_resid_post"], positions="all",
                       labels=[0, 1, 0, 1], mask=torch.ones(4, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="positions='last'.*flat_tokens"):
        probes.diff_of_means(acts)


def test_missing_sites_on_activations():
    X, y = data()
    acts = Activations(tensor=X, sites=["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"], labels=y.tolist())
    d = probes.diff_of_means(acts)
    other = Activations(tensor=X, sites=["blocks.0.hook_resid_post", "blocks.2.hook_resid_post"], labels=y.tolist())
    with pytest.raises(ValueError, match="lack sites"):
        d.project(other)
