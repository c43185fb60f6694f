"""Grouped CV, shuffled-label controls, transfer matrices, rank ablation and the metrics themselves."""

import numpy as np
import pytest
import torch
from scipy.stats import rankdata
from sklearn.metrics import roc_auc_score

import interp
import probes
from interp.evals.metrics import auroc, average_ranks, cohens_d


def planted(n=600, L=3, d=24, signal=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(L, d, generator=g)
    u = u / u.norm(dim=-1, keepdim=True)
    y = (torch.rand(n, generator=g) < 0.5).long()
    X = torch.randn(n, L, d, generator=g) + (y.float() - 0.5)[:, None, None] * signal * u
    return X, y


def test_metrics_match_sklearn_and_scipy():
    g = torch.Generator().manual_seed(0)
    y = (torch.rand(300, generator=g) < 0.3).long()
    s = torch.randn(4, 300, generator=g) + y
    s[1] = torch.round(s[1] * 2) / 2                                    # many ties
    s[3] = 1.0                                                          # all tied: exactly chance
    ours = auroc(s, y)
    for i in range(4):
        assert abs(float(ours[i]) - roc_auc_score(y.numpy(), s[i].numpy())) < 1e-6
        assert np.allclose(average_ranks(s[i]).numpy(), rankdata(s[i].numpy()))
    assert float(ours[3]) == 0.5
    d = cohens_d(s[0], y)
    a, b = s[0][y == 1].double(), s[0][y == 0].double()
    pooled = (((len(a) - 1) * a.var() + (len(b) - 1) * b.var()) / (len(a) + len(b) - 2)).sqrt()
    assert abs(float(d) - float((a.mean() - b.mean()) / pooled)) < 1e-5


def test_grouped_folds_never_straddle():
    y = torch.tensor([0, 1] * 60)
    groups = [f"q{i // 4}" for i in range(120)]                        # 30 questions, 4 paraphrases each
    folds = probes.folds.make_folds(y, 5, groups, seed=1)
    seen = set()
    for f in folds:
        train_g = {groups[i] for i in f.train.tolist()}
        test_g = {groups[i] for i in f.test.tolist()}
        assert not train_g & test_g
        assert not seen & set(f.test.tolist())
        seen |= set(f.test.tolist())
    assert seen == set(range(120))


def test_cv_with_groups_reports_samples_and_selectivity():
    X, y = planted()
    groups = [i // 3 for i in range(len(y))]
    res = probes.cross_validate(X, y, groups=groups, config=probes.CVConfig(n_folds=5))
    assert res.accuracy.shape == (5, 3) and res.control_accuracy.shape == (5, 3)
    assert (res.mean("auroc") > 0.95).all()
    assert ((res.control_accuracy.mean(0) - 0.5).abs() < 0.1).all()    # shuffled labels: chance
    assert (res.selectivity.mean(0) > 0.3).all()
    for f in res.folds:
        tr = {int(i) // 3 for i in f["train"]}
        te = {int(i) // 3 for i in f["test"]}
        assert not tr & te
    frame = res.to_frame()
    assert {"fold", "site", "metric", "value"} <= set(frame.columns)
    by_site = res.by_site()
    assert len(by_site) == 3 and "auroc_std" in by_site
    s = res.summary()  # the best layer's mean scores
    assert s["best_site"] == res.sites[res.best_layer()]
    assert s["auroc"] == pytest.approx(float(res.auroc[:, res.best_layer()].mean()))
    fig = res.plot()  # per metric a +-1 std band and the mean line over folds
    lines = [t for t in fig.data if t.mode == "lines+markers"]
    assert [t.name for t in lines] == ["accuracy", "auroc", "control_accuracy"] and len(fig.data) == 6
    for t in lines:
        assert list(t.y) == pytest.approx(getattr(res, t.name).mean(0).tolist())
    assert fig.layout.xaxis.title.text == "site" and fig.layout.yaxis.title.text == "held-out score"
    assert 0 <= res.best_layer() < 3


def test_layers_with_and_without_signal():
    g = torch.Generator().manual_seed(2)
    n, d = 500, 16
    y = (torch.rand(n, generator=g) < 0.5).long()
    X = torch.randn(n, 4, d, generator=g)
    X[:, 2, 0] += 2.5 * (y.float() - 0.5)                               # only layer 2 carries the concept
    res = probes.cross_validate(X, y, config=probes.CVConfig(n_folds=5))
    auc = res.mean("auroc")
    assert res.best_layer() == 2 and auc[2] > 0.85
    assert ((auc[[0, 1, 3]] - 0.5).abs() < 0.08).all(), auc


def test_transfer_matrix():
    g = torch.Generator().manual_seed(3)
    n_per, d = 300, 20
    shared = torch.randn(d, generator=g)
    shared /= shared.norm()
    own = torch.randn(3, d, generator=g)
    own /= own.norm(dim=-1, keepdim=True)
    Xs, ys, ds = [], [], []
    for name in ["a", "b", "c"]:
        y = (torch.rand(n_per, generator=g) < 0.5).long()
        axis = shared if name != "c" else own[2]                        # c's concept lives elsewhere
        X = torch.randn(n_per, 2, d, generator=g) + (y.float() - 0.5)[:, None, None] * 3 * axis
        Xs.append(X)
        ys.append(y)
        ds += [name] * n_per
    X, y = torch.cat(Xs), torch.cat(ys)
    res = probes.transfer_matrix(X, y, ds)
    m = res.matrix.mean(-1)
    assert m.shape == (3, 3)
    assert (torch.diagonal(m) > 0.9).all()
    assert m[0, 1] > 0.9 and m[1, 0] > 0.9
    assert (m[0, 2] - 0.5).abs() < 0.15 and (m[2, 0] - 0.5).abs() < 0.15
    assert res.lodo.mean(-1)[0] > 0.9 and res.lodo.mean(-1)[2] < 0.7
    assert len(res.to_frame()) == 2 * (9 + 3)
    fig = res.plot(layer=1)  # train x test AUROC at layer 1, and the leave-one-out row
    assert len(fig.data) == 1 and fig.data[0].type == "heatmap"
    assert list(fig.data[0].y) == ["train a", "train b", "train c", "train all but column"]
    z = torch.tensor(fig.data[0].z, dtype=torch.float64)
    torch.testing.assert_close(z[:3], res.matrix[:, :, 1].double())
    torch.testing.assert_close(z[3], res.lodo[:, 1].double())


def test_rank_ablation_inside_folds():
    g = torch.Generator().manual_seed(4)
    n, d, k = 800, 32, 4
    cats = torch.randint(0, k, (n,), generator=g)
    y = (torch.rand(n, generator=g) < 0.5).long()
    axes = torch.linalg.qr(torch.randn(d, k, generator=g))[0].T         # each category's concept on its own axis
    X = torch.randn(n, 1, d, generator=g) + ((y.float() - 0.5) * 4)[:, None, None] * axes[cats][:, None]

    def fit(train_idx):
        return probes.subspace.mean_diff_subspace(X[train_idx], y[train_idx], groups=cats[train_idx].tolist())

    res = probes.transfer.rank_ablation(X, y, fit, ranks=[0, 1, 2, 4], config=probes.CVConfig(n_folds=4))
    acc = res.accuracy.mean(1)[:, 0]
    assert acc[0] > 0.75 and acc[1] < acc[0] - 0.03 and acc[2] < acc[1] - 0.03, acc
    assert (acc[3] - 0.5).abs() < 0.08                                   # rank 4 removes every axis
    assert len(res.to_frame()) == 4
    fig = res.plot(layer=0)  # accuracy and AUROC against k, mean over folds
    assert [t.name for t in fig.data] == ["accuracy", "auroc"] and list(fig.data[0].x) == [0, 1, 2, 4]
    assert list(fig.data[0].y) == pytest.approx(acc.tolist()) and fig.layout.xaxis.title.text.startswith("components")


def test_rank_ablation_refuses_leaky_subspace():
    from interp.activations import Activations

    X, y = planted(n=200, L=1)
    acts = Activations(tensor=X, sites=["blocks.0.hook_resid_post"], labels=y.tolist(), model_id="m")
    sub = probes.subspace.pca_subspace(acts, k=2)
    with pytest.raises(ValueError, match="fit this object"):
        probes.transfer.rank_ablation(acts, subspace=sub, ranks=[1])
    with pytest.raises(ValueError, match="fit this object"):
        probes.evaluate_direction(acts, direction=sub.component(0))
    assert probes.transfer.rank_ablation(acts, subspace=sub, ranks=[1], allow_overlap=True).accuracy.shape == (1, 5, 1)


def test_cross_validation_progress_bar(capsys):
    """A bar on stderr with progress=True, silence with progress=False, equal scores either way."""
    import probes

    torch.manual_seed(0)
    X = torch.randn(60, 3, 8)
    y = torch.tensor([0, 1] * 30)
    X[y == 1, :, 0] += 1.5
    for method in ("logistic", "mean_diff"):
        quiet = probes.cross_validate(X, y, method=method, runtime=interp.Runtime(progress=False))
        assert capsys.readouterr().err == ""
        loud = probes.cross_validate(X, y, method=method, runtime=interp.Runtime(progress=True))
        err = capsys.readouterr().err
        assert "cross_validate" in err, err
        torch.testing.assert_close(quiet.auroc, loud.auroc, rtol=0, atol=0)
