"""Shuffled-label controls on grouped and small data, class counting in folds, and best-layer tie-breaking."""

import pytest
import torch

import probes


def pairs(n_pairs=60, L=3, d=16, signal=5.0, one_first=False, seed=0):
    """Contrastive pairs: each group (source item) holds one sample of each label."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(L, d, generator=g)
    u = u / u.norm(dim=-1, keepdim=True)
    base = torch.randn(n_pairs, 1, L, d, generator=g) * 2                # shared per pair
    first, second = (1, 0) if one_first else (0, 1)
    y = torch.tensor([first, second] * n_pairs)
    X = base.expand(-1, 2, -1, -1).reshape(2 * n_pairs, L, d) + torch.randn(2 * n_pairs, L, d, generator=g)
    X = X + (y.float() - 0.5)[:, None, None] * signal * u
    return X, y, [i // 2 for i in range(2 * n_pairs)]


@pytest.mark.parametrize("one_first", [False, True])
@pytest.mark.parametrize("method", ["logistic", "mean_diff"])
def test_grouped_control_on_contrastive_pairs(one_first, method):
    X, y, groups = pairs(one_first=one_first)
    res = probes.cross_validate(X, y, groups=groups, method=method, config=probes.CVConfig(n_folds=5))
    assert res.control_accuracy is not None and res.control_auroc is not None
    summary = res.by_site()
    assert {"control_accuracy", "control_auroc", "selectivity"} <= set(summary.columns)
    assert (res.mean("auroc") > 0.85).all()
    assert ((res.control_auroc.nanmean(0) - 0.5).abs() < 0.15).all(), res.control_auroc
    assert (res.selectivity.mean(0) > 0.2).all()


def test_control_labels_keep_groups_and_fold_counts():
    X, y, groups = pairs()
    folds = probes.folds.make_folds(y, 5, groups, seed=0)
    from probes.validation import shuffled_labels

    ctrl = shuffled_labels(y, folds, groups, seed=0)
    assert not torch.equal(ctrl, y)
    for f in folds:
        assert int(ctrl[f.test].sum()) == int(y[f.test].sum())           # every fold keeps its class counts
    for gid in set(groups):                                              # a pair still holds one of each label
        idx = [i for i, k in enumerate(groups) if k == gid]
        assert sorted(ctrl[idx].tolist()) == [0, 1]
    pure = [i // 4 for i in range(80)]                                   # groups holding one label: labels swap
    yp = torch.tensor([(i // 4) % 2 for i in range(80)])
    fp = probes.folds.make_folds(yp, 4, pure, seed=0)
    cp = shuffled_labels(yp, fp, pure, seed=1)
    for gid in set(pure):
        assert cp[[i for i, k in enumerate(pure) if k == gid]].unique().numel() == 1


def test_make_folds_counts_classes_present():
    y = torch.tensor([1, 2] * 20)                                        # no class 0: y.max() + 1 would say 3
    folds = probes.folds.make_folds(y, 5)
    assert len(folds) == 5
    with pytest.raises(ValueError, match="lacks a class"):
        probes.folds.make_folds(torch.tensor([1] * 38 + [2] * 2), 5)


@pytest.mark.parametrize("method", ["logistic", "mean_diff"])
def test_small_data_control_does_not_crash_real_scores(method):
    g = torch.Generator().manual_seed(5)
    y = torch.tensor([0] * 12 + [1] * 12)
    X = torch.randn(24, 2, 8, generator=g) + (y.float() - 0.5)[:, None, None] * 4
    res = probes.cross_validate(X, y, method=method, config=probes.CVConfig(n_folds=5))
    assert torch.isfinite(res.cohens_d).all() and (res.mean("cohens_d") > 1).all()
    assert res.control_accuracy is not None and res.control_accuracy.shape == (5, 2)


def test_best_layer_breaks_ties_by_next_metric_then_middle():
    from probes.validation import ProbeScores

    sites = [f"blocks.{i}.hook_resid_post" for i in range(6)]
    ones = torch.ones(3, 6)
    d = torch.tensor([[1.0, 2.0, 5.0, 5.0, 5.0, 3.0]]).expand(3, -1)
    res = ProbeScores(method="logistic", sites=sites, accuracy=ones, auroc=ones, cohens_d=d)
    choice = res.layer_choice()
    assert choice.tied == [0, 1, 2, 3, 4, 5] and choice.remaining == [2, 3, 4]
    assert res.best_layer() == 3 == choice.index and choice.site == sites[3]
    assert "cohens_d" in choice.rule and "middle" in choice.rule
    flat = ProbeScores(method="logistic", sites=sites, accuracy=ones, auroc=ones, cohens_d=ones)
    assert flat.best_layer() == 2                                        # all tied: the middle, not layer 0
    assert ProbeScores(method="x", sites=sites, accuracy=ones, auroc=torch.eye(3, 6), cohens_d=ones).best_layer() in (0, 1, 2)


def test_transfer_frame_has_numeric_layer_sorted():
    g = torch.Generator().manual_seed(6)
    sites = [f"blocks.{i}.hook_resid_post" for i in (2, 10, 1)]
    y = torch.tensor([0, 1] * 60)
    X = torch.randn(120, 3, 8, generator=g) + (y.float() - 0.5)[:, None, None] * 3
    from interp.activations import Activations

    acts = Activations(tensor=X, sites=sites, labels=y.tolist(), model_id="m",
                       prompt_ids=[f"p{i}" for i in range(120)])
    res = probes.transfer_matrix(acts, datasets=["a"] * 60 + ["b"] * 60, n_folds=3)
    frame = res.to_frame()
    assert "layer" in frame and frame["layer"].tolist() == sorted(frame["layer"].tolist())
    assert frame["layer"].iloc[0] == 1 and frame["layer"].iloc[-1] == 10
    choice = res.layer_choice()
    assert choice.index in range(3) and res.best_layer() == choice.index


def test_undefined_d_in_a_fold_is_nan_not_a_crash():
    """Grouped folds can leave a test fold with one sample of a class: d is NaN there, the rest is scored."""
    g = torch.Generator().manual_seed(7)
    y = torch.tensor([0] * 6 + [1] * 6 + [0] * 6 + [1] + [0] * 5 + [1] * 6)
    groups = [i // 6 for i in range(30)]
    X = torch.randn(30, 2, 8, generator=g) + (y.float() - 0.5)[:, None, None] * 4
    assert [int(y[f.test].sum()) for f in probes.folds.make_folds(y, 2, groups, seed=0)] == [12, 1]
    for res in (probes.cross_validate(X, y, groups=groups, config=probes.CVConfig(n_folds=2, control=False)),
                probes.erasure_cv(X, y, groups=groups, config=probes.CVConfig(n_folds=2)).before):
        assert torch.isnan(res.cohens_d[1]).all() and torch.isfinite(res.cohens_d[0]).all()
        assert torch.isfinite(res.mean("cohens_d")).all() and torch.isfinite(res.auroc).all()
        assert res.by_site()["cohens_d_std"].eq(0).all()                 # one defined fold: no spread
