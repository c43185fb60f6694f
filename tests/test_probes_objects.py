"""Direction / Subspace objects, subspaces, graded directions, comparisons, signatures and plots."""

import plotly.graph_objects as go
import pytest
import torch

import probes
from interp.viz import probes as pplot
from probes import Direction, Subspace


def planted(n=600, L=3, d=24, signal=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(L, d, generator=g)
    u = u / u.norm(dim=-1, keepdim=True)
    y = (torch.rand(n, generator=g) < 0.5).long()
    X = torch.randn(n, L, d, generator=g) + (y.float() - 0.5)[:, None, None] * signal * u
    return X, y, u


def test_direction_save_load_roundtrip(tmp_path):
    X, y, _ = planted()
    d = probes.diff_of_means(X, y)
    d.save(tmp_path / "dir")
    back = Direction.load(tmp_path / "dir")
    assert torch.equal(back.vectors, d.vectors) and torch.equal(back.norms, d.norms)
    assert (back.sites, back.method, back.data_hash, back.fitted_on, back.meta) == \
           (d.sites, d.method, d.data_hash, d.fitted_on, d.meta)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        d.save(tmp_path / "dir")
    d.save(tmp_path / "dir", overwrite=True)
    with pytest.raises(ValueError, match="does not hold a saved Subspace"):
        Subspace.load(tmp_path / "dir")
    assert len(d.to_frame()) == 3 and "Direction(" in repr(d)


def test_direction_from_single_vector_and_select():
    v = torch.tensor([3.0, 4.0])
    d = Direction.from_vectors(v, ["blocks.5.hook_resid_post"], method="manual")
    assert torch.allclose(d.at(5), torch.tensor([0.6, 0.8])) and float(d.norms[0]) == 5.0
    X, y, _ = planted(L=4)
    full = probes.diff_of_means(X, y)
    sub = full.select([1, 3])
    assert sub.sites == [full.sites[1], full.sites[3]] and torch.equal(sub.vectors[1], full.vectors[3])
    assert torch.equal((-full).vectors, -full.vectors)


def test_subspace_category_and_truncate(tmp_path):
    g = torch.Generator().manual_seed(1)
    n, d = 900, 30
    cats = torch.randint(0, 3, (n,), generator=g)
    labels = [["harmless", "weapons", "fraud"][c] for c in cats.tolist()]
    axes = torch.linalg.qr(torch.randn(d, 3, generator=g))[0].T * torch.tensor([[0.0], [6.0], [4.0]])
    X = torch.randn(n, 2, d, generator=g) + axes[cats][:, None]
    sub = probes.subspace.category_subspace(X, labels, reference="harmless")
    assert sub.rank == 2 and sub.names == ["weapons", "fraud"]         # largest first
    Q = sub.bases
    assert torch.allclose(torch.einsum("lkd,ljd->lkj", Q, Q), torch.eye(2).expand(2, 2, 2), atol=1e-5)
    target = torch.linalg.qr(axes[1:].T)[0].T                           # span of the two category axes
    proj = torch.einsum("lkd,jd->lkj", Q, target)
    assert (proj.pow(2).sum(-1) > 0.97).all()
    t1 = sub.truncate(1)
    assert t1.rank == 1 and t1.names == ["weapons"]
    removed = sub.project_out(X)
    assert torch.einsum("nld,lkd->nlk", removed, Q).abs().max() < 1e-4
    sub.save(tmp_path / "s")
    back = Subspace.load(tmp_path / "s")
    assert torch.equal(back.bases, sub.bases) and back.names == sub.names
    assert len(sub.to_frame()) == 2 * 2
    with pytest.raises(ValueError, match="k must be in"):
        sub.truncate(3)


def test_mean_diff_subspace_ranks_and_pca_subspace():
    g = torch.Generator().manual_seed(2)
    n, d = 1200, 40
    groups = torch.randint(0, 6, (n,), generator=g)
    y = (torch.rand(n, generator=g) < 0.5).long()
    axes = torch.linalg.qr(torch.randn(d, 6, generator=g))[0].T
    X = torch.randn(n, 1, d, generator=g) + ((y.float() - 0.5) * 5)[:, None, None] * axes[groups][:, None]
    sub = probes.subspace.mean_diff_subspace(X, y, groups=groups.tolist())
    assert sub.rank == 6 and (sub.strengths[0, :-1] >= sub.strengths[0, 1:]).all()
    inside = torch.einsum("kd,jd->kj", sub.bases[0], axes).pow(2).sum(0)
    assert (inside > 0.9).all()                                          # every group's axis is captured
    ps = probes.subspace.pca_subspace(X, y, k=3)
    assert ps.rank == 3
    mc = probes.subspace.mean_diff_subspace(X, groups.tolist())                   # multi-class, no groups: rank k-1
    assert mc.rank == 5


def test_graded_direction_ordered_levels():
    g = torch.Generator().manual_seed(3)
    n, d = 900, 20
    levels = torch.randint(0, 3, (n,), generator=g)
    names = ["low", "neutral", "high"]
    u = torch.randn(d, generator=g)
    u /= u.norm()
    X = torch.randn(n, 2, d, generator=g)
    X[:, 0] += (levels.float() * 1.5)[:, None] * u                        # layer 0: ordered along u
    X[:, 1] += torch.tensor([0.0, 3.0, 1.5])[levels][:, None] * u         # layer 1: the middle level overshoots
    res = probes.graded_direction(X, [names[i] for i in levels.tolist()], order=names)
    assert res.levels == names
    assert (res.direction.vectors[0] @ u) > 0.98
    assert bool(res.monotonic[0]) and not bool(res.monotonic[1])
    assert res.adjacent_d.shape == (2, 2) and (res.adjacent_d[0] > 1.2).all()
    assert res.spearman[0] > 0.7 and res.collinearity[0] > 0.95
    assert len(res.to_frame()) == 2
    fig = res.plot()
    assert isinstance(fig, go.Figure)
    means = {t.name: t for t in fig.data if t.name in names}
    assert set(means) == set(names)
    for i, lev in enumerate(names):
        assert list(means[lev].y) == pytest.approx(res.level_means[:, i].tolist(), rel=1e-5)
    ext = probes.graded_direction(X, levels, method="extremes")
    assert (ext.direction.vectors[0] @ u) > 0.95


def test_cosine_comparisons_and_signature():
    X, y, u = planted(n=2000, L=3, d=24, signal=4.0)
    a = probes.diff_of_means(X, y)
    b = probes.fit_logistic(X, y).direction()
    m = probes.compare.cosine_matrix(a)
    assert m.shape == (3, 3) and torch.allclose(torch.diagonal(m), torch.ones(3), atol=1e-5)
    cross = probes.compare.cosine_by_layer(a, b)
    assert (cross > 0.95).all()
    frame = probes.compare.compare_directions({"mean_diff": a, "logistic": b, "pca": probes.directions.pca_centered(X, y)})
    assert len(frame) == 3 * 3 and frame["cosine"].min() > 0.9
    other = Direction.from_vectors(torch.randn(3, 16), a.sites)
    with pytest.raises(ValueError, match="width"):
        probes.compare.cosine_matrix(a, other)
    sig = probes.compare.signature(X, {"trait": a, "neg": -a}, groups=["pos" if v else "neg" for v in y.tolist()])
    assert sig.stats.shape == (2, 2, 3, 5)
    i_pos, i_neg = sig.groups.index("pos"), sig.groups.index("neg")
    assert (sig.stats[0, i_pos, :, 0] > sig.stats[0, i_neg, :, 0] + 2).all()
    assert torch.allclose(sig.stats[1, :, :, 0], -sig.stats[0, :, :, 0], atol=1e-5)
    assert len(sig.to_frame()) == 2 * 2 * 3
    heat = sig.plot(layer=1).data[0]
    assert heat.type == "heatmap" and list(heat.x) == ["trait", "neg"] and list(heat.y) == sig.groups
    for g in range(2):
        assert list(heat.z[g]) == pytest.approx(sig.stats[:, g, 1, 0].tolist(), rel=1e-5)
    p = probes.compare.project(X, a)
    assert p.shape == (2000, 3)


def test_plots_take_plain_inputs():
    figs = [
        pplot.layer_scores({"auroc": torch.rand(5, 4)}, [f"blocks.{i}.hook_resid_post" for i in range(4)]),
        pplot.cosine_heatmap(torch.rand(4, 4) * 2 - 1),
        pplot.transfer_heatmap(torch.rand(3, 3), ["a", "b", "c"], lodo=torch.rand(3)),
        pplot.projection_scatter(torch.randn(50, 8), ["x"] * 25 + ["y"] * 25),
        pplot.projection_scatter(torch.randn(50, 8), [0] * 50, axes=torch.randn(2, 8)),
        pplot.projection_histogram(torch.randn(40), ["a", "b"] * 20),
        pplot.rank_curve([1, 2, 3], torch.rand(3, 4), torch.rand(3, 4)),
        pplot.graded_levels(torch.rand(4, 3), torch.rand(4, 2), ["l", "m", "h"]),
        pplot.signature_heatmap(torch.randn(2, 3), ["t1", "t2"], ["g1", "g2", "g3"]),
    ]
    assert all(isinstance(f, go.Figure) for f in figs)
    assert len(figs[0].data) == 2                                        # band + mean line
    with pytest.raises(ValueError, match="labels"):
        pplot.projection_histogram(torch.randn(10), ["a"] * 3)
    import ast
    import inspect
    tree = ast.parse(inspect.getsource(pplot))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
               {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m and m.split(".")[0] == "probes" for m in imported)


def test_probes_never_imports_steering():
    import ast
    import pathlib

    root = pathlib.Path(probes.__file__).parent
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
               {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not any(m and m.split(".")[0] in ("steering", "sae") for m in mods), path
