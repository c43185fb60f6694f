"""Graded directions: the default method, orientation low -> high, held-out ordering, warnings and the figure."""

import warnings

import plotly.graph_objects as go
import pytest
import torch

import probes


def off_axis_middle(n_items=60, L=4, d=24, step=1.5, offset=4.0, seed=0):
    """Three levels per item, ordered along ``u`` at every layer; the middle level is also pushed along ``w``
    (orthogonal), harder than the ordered step: PCA of the level means then finds ``w``, not the order."""
    g = torch.Generator().manual_seed(seed)
    q = torch.linalg.qr(torch.randn(d, 2 * L, generator=g))[0].T
    u, w = q[:L], q[L:]
    item = torch.randn(n_items, 1, L, d, generator=g)
    lev = torch.arange(3)
    X = item + torch.randn(n_items, 3, L, d, generator=g) * 0.7
    X = X + (lev.double() * step)[None, :, None, None].float() * u + (lev == 1).float()[None, :, None, None] * offset * w
    names = ["low", "mid", "high"]
    levels = [names[i] for _ in range(n_items) for i in range(3)]
    groups = [i for i in range(n_items) for _ in range(3)]
    return X.reshape(3 * n_items, L, d), levels, groups, names, u


def test_default_orders_levels_where_pca_does_not():
    X, levels, groups, names, u = off_axis_middle()
    with pytest.warns(UserWarning, match="not ordered"):
        pca = probes.graded_direction(X, levels, order=names, method="pca", groups=groups)
    assert not pca.monotonic.any()
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                   # ordered data: no warning
        res = probes.graded_direction(X, levels, order=names, groups=groups)
    assert res.direction.method == "graded_trend"
    assert res.monotonic.all() and res.ordered_layers() == [0, 1, 2, 3]
    assert (res.heldout_adjacent_d.mean(0) > 0.8).all() and (res.heldout_spearman.mean(0) > 0.5).all()
    cos = torch.einsum("ld,ld->l", res.direction.vectors, u)
    assert (cos > 0.9).all()


@pytest.mark.parametrize("method", ["trend", "extremes", "pca"])
def test_every_layer_oriented_low_to_high(method):
    g = torch.Generator().manual_seed(1)
    n, L, d = 300, 6, 16
    lev = torch.randint(0, 4, (n,), generator=g)
    axes = torch.randn(L, d, generator=g)
    signs = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 1.0])              # the concept's sign differs by layer
    X = torch.randn(n, L, d, generator=g) + (lev.float() * 1.2)[:, None, None] * (signs[:, None] * axes)
    res = probes.graded_direction(X, lev, method=method)
    trend = ((torch.arange(4.0) - 1.5) * res.level_means).sum(-1)
    assert (trend > 0).all() and (res.spearman > 0).all()
    assert (res.adjacent_d > 0).all()                                    # no sign flips between layers
    assert (res.heldout_adjacent_d.mean(0) > 0).all()


def test_heldout_fields_groups_and_options():
    X, levels, groups, names, _ = off_axis_middle(n_items=30, L=2)
    res = probes.graded_direction(X, levels, order=names, groups=groups, n_folds=3)
    assert res.heldout_adjacent_d.shape == (3, 2, 2) and res.heldout_level_means.shape == (3, 2, 3)
    assert res.heldout_monotonic.shape == (3, 2) and res.heldout_ordered.shape == (2,)
    assert res.level_std.shape == (2, 3) and (res.level_std > 0).all()
    frame = res.to_frame()
    assert {"layer", "heldout_ordered", "heldout_spearman", "heldout_d[low->mid]"} <= set(frame.columns)
    none = probes.graded_direction(X, levels, order=names, n_folds=None)
    assert none.heldout_adjacent_d is None and none.heldout_ordered is None
    assert "heldout_ordered" not in none.to_frame()
    with pytest.raises(ValueError, match="n_folds=None"):
        probes.graded_direction(X[:9], levels[:9], order=names, n_folds=5)


def test_trend_uses_every_level():
    """With five levels the trend (all levels) is closer to the true axis than the two extremes alone."""
    g = torch.Generator().manual_seed(2)
    n, d = 250, 64
    lev = torch.arange(5).repeat(n // 5)
    u = torch.nn.functional.normalize(torch.randn(d, generator=g), dim=0)
    X = (torch.randn(n, d, generator=g) * 2 + (lev.float() * 0.6)[:, None] * u)[:, None]
    cos = {m: float(probes.graded_direction(X, lev, method=m, n_folds=None, warn=False).direction.vectors[0] @ u)
           for m in ("trend", "extremes")}
    assert cos["trend"] > cos["extremes"], cos


def test_plot_shows_spread_and_d():
    X, levels, groups, names, _ = off_axis_middle(n_items=30, L=3)
    fig = probes.graded_direction(X, levels, order=names, groups=groups, n_folds=3).plot()
    assert isinstance(fig, go.Figure)
    fills = [t for t in fig.data if t.fill == "toself"]
    assert len(fills) == 3                                               # a +-1 std band per level
    names_d = [t.name for t in fig.data if t.name and t.name.startswith("d ")]
    assert len(names_d) == 4 and any("held out" in s for s in names_d)   # 2 adjacent pairs x (fit, held out)
