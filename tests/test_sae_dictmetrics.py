"""Sparse probing and first-letter absorption (sae.probing, sae.absorption) on the real toy organism: constructed
SAEs and latents whose answer is known, and bad input."""

from __future__ import annotations

import pytest
import torch

import interp
from interp.studies.kit.prompt_sets import load_refusal_data
from probes.logistic import solve_logistic as SOLVE
from sae.absorption import AbsorptionConfig, absorption, absorption_from, letter_words, word_residuals
from sae.model import SAE, SAEConfig
from sae.probing import SparseProbeConfig, pooled_latents, probe_concept, sparse_probing, stratified_split

SITE = "blocks.2.hook_resid_post"


@pytest.fixture(scope="module")
def organism():
    torch.set_num_threads(1)
    return interp.load_model("organism")


@pytest.fixture(scope="module")
def harm(organism):
    data = load_refusal_data("organism")
    pos, neg = data.harmful["train"].instructions[:40], data.harmless["train"].instructions[:40]
    return pos + neg, torch.tensor([1] * len(pos) + [0] * len(neg))


def _concept_sae(x: torch.Tensor, y: torch.Tensor, j: int) -> SAE:
    """A random ReLU SAE whose latent ``j`` reads the class-mean difference of the pooled residual ``x``,
    thresholded halfway between the class means (so it fires on class 1 prompts only)."""
    s = SAE(SAEConfig(x.shape[1], 96, arch="relu", site=SITE), seed=0)
    d = x[y == 1].mean(0) - x[y == 0].mean(0)
    d = d / d.norm()
    with torch.no_grad():
        s.b_enc.fill_(-1e3)  # every other latent silent
        s.b_dec.zero_()
        s.W_enc[:, j] = d
        s.b_enc[j] = -float((x[y == 1] @ d).mean() + (x[y == 0] @ d).mean()) / 2
    return s


def test_sparse_probing_finds_the_concept_latent(organism, harm):
    texts, y = harm
    probe = SAE(SAEConfig(organism.d_model, 96, arch="relu", site=SITE), seed=0)
    _, x = pooled_latents(probe, organism, texts)
    s = _concept_sae(x, y, j=37)
    z, x2 = pooled_latents(s, organism, texts)
    torch.testing.assert_close(x2, x)
    assert (z.abs().sum(0) > 0).nonzero().flatten().tolist() == [37]
    cfg = SparseProbeConfig(ks=(1, 2), concept="harmful")
    res = sparse_probing(z, x, y, None, SOLVE, cfg)
    assert res.latents[0] == 37 and res.accuracy[0] > res.control[0]
    # oracle: scikit-learn's logistic regression (same objective: C = 1 / (l2 n_train), standardised) on the same
    # split, on latent 37 alone and on the full residual
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    train = stratified_split(y, cfg.test_fraction, cfg.seed)
    for feats, got in ((z[:, [37]], res.accuracy[0]), (x, res.residual_accuracy)):
        sc = StandardScaler().fit(feats[train].numpy())
        lr = LogisticRegression(C=1 / (cfg.l2 * int(train.sum())), max_iter=5000, tol=1e-10)
        lr.fit(sc.transform(feats[train].numpy()), y[train].numpy())
        want = float((lr.predict(sc.transform(feats[~train].numpy())) == y[~train].numpy()).mean())
        assert abs(float(got) - want) <= 1 / res.n_test + 1e-9  # at most one boundary sample apart
    assert res.low[0] <= res.accuracy[0] <= res.high[0] and res.n_train + res.n_test == len(y)
    assert res.control[0] <= 0.75  # a random silent latent reads nothing: chance on a balanced split


def test_sparse_probing_arithmetic_and_lexical(organism, harm):
    texts, y = harm
    g = torch.Generator().manual_seed(0)
    z = torch.rand(len(y), 50, generator=g)
    z[:, 7] += 3 * y  # latent 7 is the concept; latent 3 is its sign flip (ranked by |mean difference|)
    z[:, 3] -= 2 * y
    res = sparse_probing(z, torch.randn(len(y), 8, generator=g), y, torch.rand(len(y), 5, generator=g),
                         SOLVE, SparseProbeConfig(ks=(1, 2, 5)))
    assert res.latents[:2].tolist() == [7, 3]
    assert res.accuracy[0] == 1.0 and res.accuracy[1] == 1.0
    assert res.residual_accuracy <= 0.8 and res.lexical_accuracy <= 0.8  # noise features: near chance
    from interp.studies.directions.biases import lexical_features

    lex = lexical_features(organism, texts)[:, 0]
    res2 = probe_concept(_concept_sae(pooled_latents(SAE(SAEConfig(64, 96, arch="relu", site=SITE)), organism,
                                                     texts)[1], y, 5), organism, texts, y, lex,
                         SOLVE, SparseProbeConfig(ks=(1,), concept="harmful"))
    assert 0.5 <= res2.lexical_accuracy <= 1.0 and res2.latents[0] == 5
    assert set(res2.summary()) >= {"acc_k1", "control_k1", "residual_accuracy", "lexical_accuracy"}


def test_sparse_probing_bad_input(organism, harm):
    z, x = torch.rand(20, 10), torch.rand(20, 4)
    with pytest.raises(ValueError, match="both classes"):
        sparse_probing(z, x, torch.ones(20, dtype=torch.long), None, SOLVE)
    with pytest.raises(ValueError, match="d_sae=10"):
        sparse_probing(z, x, torch.arange(20) % 2, None, SOLVE, SparseProbeConfig(ks=(1, 20)))
    with pytest.raises(ValueError, match="one row per prompt"):
        sparse_probing(z, x[:5], torch.arange(20) % 2, None, SOLVE)
    with pytest.raises(TypeError, match="solver=probes.logistic.solve_logistic"):
        sparse_probing(z, x, torch.arange(20) % 2, None)
    s = SAE(SAEConfig(64, 32, arch="relu", site=SITE))
    with pytest.raises(ValueError, match="trained at 'blocks.2.hook_resid_post'"):
        pooled_latents(s, organism, harm[0][:2], site="blocks.1.hook_resid_post")
    with pytest.raises(ValueError, match="SAE's site"):
        absorption(s, organism, SOLVE, site="blocks.0.hook_resid_post")


@pytest.fixture(scope="module")
def words():
    """SmolLM2's residual at layer 6 on 1500 of its single-token words (the toy organism cannot spell)."""
    smol = interp.load_model("smollm2-135m-instruct")
    w = letter_words(smol.tokenizer)
    w = w[:: len(w) // 1500]
    x, kept = word_residuals(smol, w, "blocks.6.hook_resid_post", AbsorptionConfig().template)
    return x, [w[i][1][0].lower() for i in kept]


def test_letter_words_are_single_alphabetic_tokens(organism, words):
    w = letter_words(organism.tokenizer, letters="ab")
    assert w and all(t[1][0] in "ab" and t[1].isalpha() for t in w)
    assert all(organism.tokenizer.convert_tokens_to_ids(t[1]) == t[0] for t in w)
    assert len(words[0]) == len(words[1]) > 1000  # the words whose text ends in their own token


def _constructed(x: torch.Tensor, first: list[str], letter: str, U: torch.Tensor | None, absorber_dir: torch.Tensor):
    """Latents: 0 = the main latent of ``letter`` (fires on its words outside S), 1 = the absorber (fires on S with
    decoder ``absorber_dir``, carrying the word's whole projection on it), 2.. = one latent per other letter;
    S = every third word of ``letter``."""
    letters = sorted(set(first))
    n, d = x.shape
    z = torch.zeros(n, 2 + len(letters))
    W = torch.randn(2 + len(letters), d, generator=torch.Generator().manual_seed(1)) * 1e-3
    mine = [i for i, f in enumerate(first) if f == letter]
    S = torch.zeros(n, dtype=torch.bool)
    S[mine[::3]] = True
    for i, f in enumerate(first):
        if f == letter:
            z[i, 1 if S[i] else 0] = float((x[i] @ absorber_dir).clamp_min(0)) if S[i] else 10.0
        else:
            z[i, 2 + letters.index(f)] = 1.0
    W[1] = absorber_dir
    return z, W, S


def test_absorption_by_construction(words):
    x, first = words
    cfg = AbsorptionConfig(max_k=1, min_words=1, min_probe_f1=0.0)
    z0, W0, _ = _constructed(x, first, "c", None, torch.zeros(x.shape[1]))
    base = absorption_from(x, z0, W0, first, SOLVE, cfg)
    assert "c" in base.letters and base.k.sum() == 0  # the absorber's decoder is null: nothing absorbs
    u = base.directions[base.letters.index("c")]
    z, W, S = _constructed(x, first, "c", None, u)
    res = absorption_from(x, z, W, first, SOLVE, cfg)
    i = res.letters.index("c")
    assert res.main[i] == [0]
    c_words = torch.tensor([f == "c" for f in first])
    want = res.evaluated & c_words & S & (x @ u > 0)
    assert want.any() and torch.equal(res.absorbed, want)
    assert res.k[i] == int(want.sum()) and res.n[i] == int((res.evaluated & c_words).sum())
    assert res.k.sum() == res.k[i] and res.control[i] == 0.0
    # the absorber orthogonal to the probe (cosine under the threshold): no absorption
    v = torch.randn(x.shape[1], generator=torch.Generator().manual_seed(3))
    v = v - (v @ u) * u
    z, W, _ = _constructed(x, first, "c", None, v)
    assert absorption_from(x, z, W, first, SOLVE, cfg).k.sum() == 0


def test_absorption_bad_input(words):
    x, first = words
    with pytest.raises(ValueError, match="one row per word"):
        absorption_from(x[:3], torch.zeros(3, 4), torch.zeros(4, x.shape[1]), first, SOLVE)
    with pytest.raises(ValueError, match="two letters or more"):
        absorption_from(x[:3], torch.zeros(3, 4), torch.zeros(4, x.shape[1]), ["a", "a", "a"], SOLVE)


def test_results_plot_frame_summary_and_round_trip(words, tmp_path):
    from tests.test_results_uniform import _check

    y = torch.arange(30) % 2
    z = torch.rand(30, 12, generator=torch.Generator().manual_seed(0))
    z[:, 4] += y
    _check(sparse_probing(z, torch.rand(30, 5), y, torch.rand(30, 3), SOLVE, SparseProbeConfig(ks=(1, 2))),
           tmp_path / "p")
    x, first = words
    zc, W, _ = _constructed(x, first, "c", None, torch.zeros(x.shape[1]))
    res = absorption_from(x, zc, W, first, SOLVE, AbsorptionConfig(max_k=2, min_words=1, min_probe_f1=0.0))
    assert res.summary()["cos_threshold"] == 0.025 and len(res.to_frame()) == len(res.letters)
    _check(res, tmp_path / "a")
