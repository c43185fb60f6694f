"""Calibrated trait scales and steering cost on tiny random models: the band rule against a hand recomputation, the
calibration against a hand fit, the AUROC against scikit-learn on the same folds, the decomposition against a
target whose answer is known, steering read-outs, and the sweep's KL / CE against plain HF forwards."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

import steering
from interp.evals.logits import kl_div
from interp.forward import prepare
from interp.studies.directions.traits import TraitConfig, affine_to_levels, fit_scale, trait_scales
from interp.studies.directions.traits_analysis import capture_contrast, corpus_signature
from interp.studies.directions.traits_band import BandRule, choose_band, heldout_min_d
from interp.studies.directions.traits_data import (
    LEVEL_PROMPTS,
    SYCOPHANCY_PROMPTS,
    TRAITS,
    persona_statements,
    sycophancy_items,
)
from interp.studies.directions.traits_decompose import decompose
from interp.studies.directions.traits_steer import level_vector, residual_fraction, steer_levels
from interp.values import Prompts, Runtime

from .conftest import shared_path

WORDS = "the a of to and in is it you that he she was for on are with as his they be at one have this".split()
LEVELS = {"kindness": {"low": "you are not kind", "moderate": "you are kind", "high": "you are very very kind"},
          "goodness": {"low": "good", "moderate": "good good good", "high": "good good good good good good"}}


def _statements(n: int, seed: int = 0) -> list[str]:
    r = random.Random(seed)
    return [" ".join(r.choice(WORDS) for _ in range(6)) + " ?" for _ in range(n)]


@pytest.fixture(scope="module")
def model():
    from interp.testing.tiny import tiny_model

    return tiny_model("llama", n_layers=4)


@pytest.fixture(scope="module")
def scales(model):
    qs = _statements(12)
    return trait_scales(model, {"kindness": qs, "goodness": qs}, levels=LEVELS,
                        config=TraitConfig(n_folds=3, rule=BandRule(min_d=0.3, edge=1)))


def test_levels_ordered_band_by_its_rule_and_calibrated(scales):
    s = scales["kindness"]
    g = s.graded
    # the band, recomputed by hand from the held-out statistics
    ok = [bool(g.heldout_monotonic[:, j].all()) and float(g.heldout_adjacent_d[:, j].mean(0).min()) >= 0.3
          and 1 <= j < 3 for j in range(4)]
    runs, cur = [], []
    for j in range(4):
        cur = cur + [j] if ok[j] else []
        if cur:
            runs.append(list(cur))
    assert s.band == max(runs, key=len) and s.band
    assert "every held-out fold" in scales.rule.describe()
    # calibration: the training level means land on 0, 1, 2 (affine fit, checked against numpy)
    lv = s.to_level(scales.acts["kindness"])
    codes = torch.tensor([s.levels.index(x) for x in scales.acts["kindness"].labels])
    means = torch.stack([lv[codes == i].mean(0) for i in range(3)], 1)            # [L, 3]
    for j in s.band:
        a, b = np.polyfit(g.level_means[j].double().numpy(), np.arange(3.0), 1)
        assert float(s.slope[j]) == pytest.approx(a, rel=1e-4) and float(s.intercept[j]) == pytest.approx(b, abs=1e-3)
        assert (means[j] - torch.arange(3.0)).abs().max() < 0.35
    assert s.heldout_error.shape == (3, 4) and float(s.heldout_error[:, s.band].mean()) < 0.6
    table = scales.table()
    assert list(table.trait) == list(scales.summary()["traits"])
    assert list(table.trait) == ["kindness", "goodness"] and table.band_min_adjacent_d.min() >= 0.3
    assert len(scales.to_frame()) == 8 and len(scales.plot().data) == 2
    fig = scales.plot("auroc")
    assert [t.name for t in fig.data] == ["kindness", "goodness"] and fig.layout.yaxis.title.text.startswith(
        "held-out AUROC")
    for t in fig.data:
        assert list(t.y) == pytest.approx(scales[t.name].auroc.mean("auroc").float().tolist())


def _sklearn_worst(s, acts) -> tuple[float, list[float]]:
    """Largest |ours - scikit-learn| held-out AUROC on our probe's folds (same C), and sklearn's values."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.preprocessing import StandardScaler

    from probes.logistic import sklearn_C

    row = {pid: i for i, pid in enumerate(acts.prompt_ids)}
    X = acts.tensor.double().numpy()
    worst, theirs_all = 0.0, []
    for f, fold in enumerate(s.auroc.folds):
        tr, te = [row[i] for i in fold["train"]], [row[i] for i in fold["test"]]
        ytr = np.array([acts.labels[i] == "high" for i in tr]).astype(int)
        yte = np.array([acts.labels[i] == "high" for i in te]).astype(int)
        for j in range(X.shape[1]):
            sc = StandardScaler().fit(X[tr, j])
            ref = LogisticRegression(C=sklearn_C(s.auroc.meta["l2"], len(tr)), tol=1e-10, max_iter=10_000)
            ref.fit(sc.transform(X[tr, j]), ytr)
            theirs = roc_auc_score(yte, ref.decision_function(sc.transform(X[te, j])))
            theirs_all.append(theirs)
            worst = max(worst, abs(float(s.auroc.auroc[f, j]) - theirs))
    return worst, theirs_all


def test_trait_auroc_matches_sklearn_on_the_same_folds(model, scales):
    worst, _ = _sklearn_worst(scales["kindness"], scales.acts["kindness"])
    assert worst < 0.01
    # and where the AUROC is not saturated: levels assigned to 36 distinct statements at random
    from interp.capturing import capture

    qs = _statements(36, seed=11)
    labels = [("low", "moderate", "high")[i % 3] for i in range(36)]
    acts = capture(model, Prompts(qs, labels=labels, ids=[f"noise:{i}" for i in range(36)]),
                   runtime=Runtime(progress=False))
    s = fit_scale("noise", acts, list(range(36)), ["low", "moderate", "high"], 4,
                  config=TraitConfig(n_folds=3, on_empty="report"))
    worst, theirs = _sklearn_worst(s, acts)
    assert worst < 0.01 and min(theirs) < 0.9


def test_band_rule_no_layer_meets_raises_or_reports(scales):
    g = scales["kindness"].graded
    with pytest.raises(ValueError, match="no layer meets the band rule"):
        choose_band(g, BandRule(min_d=1e6), 4, "kindness")
    band, note = choose_band(g, BandRule(min_d=1e6), 4, "kindness", on_empty="report")
    assert band == [] and "best held-out adjacent d" in note
    assert heldout_min_d(g).shape == (4,)


def test_bad_inputs_name_the_fix(model):
    qs = _statements(6)
    with pytest.raises(ValueError, match="unknown trait 'charm'"):
        trait_scales(model, {"charm": qs}, levels=LEVELS)
    with pytest.raises(ValueError, match="at least 3 ordered levels"):
        trait_scales(model, {"kindness": qs}, levels={"kindness": {"low": "no", "high": "yes"}})
    with pytest.raises(ValueError, match="1 statement"):
        trait_scales(model, {"kindness": qs[:1]}, levels=LEVELS, config=TraitConfig(n_folds=2))
    with pytest.raises(ValueError, match="no layer meets"):
        trait_scales(model, {"kindness": qs}, levels=LEVELS,
                     config=TraitConfig(n_folds=2, rule=BandRule(min_d=1e6)))
    assert set(LEVEL_PROMPTS) == set(TRAITS) and all(len(v) == 3 for v in LEVEL_PROMPTS.values())


def test_old_keywords_name_their_new_home(model, scales):
    """Issue 37: the trait studies take config=TraitConfig(...) and runtime=interp.Runtime(...); an old keyword is
    refused with its new home, and the config refuses bad knobs."""
    qs = _statements(6)
    with pytest.raises(TypeError, match=r"n_folds= \(moved into config=TraitConfig\(n_folds=\.\.\.\)\)"):
        trait_scales(model, {"kindness": qs}, levels=LEVELS, n_folds=2)
    with pytest.raises(TypeError, match=r"batch_size= \(moved into runtime=interp.Runtime\(batch_size="):
        trait_scales(model, {"kindness": qs}, levels=LEVELS, batch_size=2)
    with pytest.raises(TypeError, match=r"seed= \(moved into runtime=interp.Runtime\(seed="):
        fit_scale("x", scales.acts["kindness"], [], ["low", "moderate", "high"], 4, seed=1)
    with pytest.raises(TypeError, match=r"chat= \(moved into prompts=interp.Prompts\(texts, chat="):
        steer_levels(model, scales, "kindness", qs, chat=False)
    with pytest.raises(TypeError, match=r"n_boot= \(moved into config=TraitConfig\(n_boot="):
        corpus_signature(scales, {"plain": qs}, model=model, n_boot=10)
    with pytest.raises(TypeError, match=r"chat= \(moved into config=TraitConfig\(chat="):
        capture_contrast(model, qs, SYCOPHANCY_PROMPTS, scales, chat=False)
    with pytest.raises(ValueError, match="on_empty must be"):
        TraitConfig(on_empty="skip")
    with pytest.raises(TypeError, match="must be a BandRule"):
        TraitConfig(rule={"min_d": 1})


def test_affine_to_levels_is_a_hand_least_squares_line():
    m = torch.tensor([[0.0, 2.0, 4.0], [1.0, 1.5, 3.0]])
    a, b = affine_to_levels(m)
    for j in range(2):
        ra, rb = np.polyfit(m[j].numpy(), np.arange(3.0), 1)
        assert float(a[j]) == pytest.approx(ra) and float(b[j]) == pytest.approx(rb)


def test_corpus_signature_is_the_band_level_with_bootstrap_interval(model, scales):
    corpus = _statements(8, seed=3)
    sig = corpus_signature(scales, {"plain": corpus}, model=model, config=TraitConfig(n_boot=200))
    from interp.capturing import capture

    acts = capture(model, corpus, sites=scales["kindness"].sites, positions="last",
                   runtime=Runtime(progress=False))
    s = scales["kindness"]
    proj = torch.einsum("nld,ld->nl", acts.tensor.double(), s.graded.direction.vectors.double())
    hand = (proj * s.slope.double() + s.intercept.double())[:, s.band].mean(1).mean()
    assert float(sig.mean[0, 0]) == pytest.approx(float(hand), abs=1e-4)
    assert (sig.lo <= sig.mean + 1e-6).all() and (sig.mean <= sig.hi + 1e-6).all()
    assert len(sig.to_frame()) == 2
    bars = sig.plot().data
    assert [b.name for b in bars] == ["plain"] and list(bars[0].x) == sig.traits
    assert list(bars[0].y) == pytest.approx(sig.mean[0].float().tolist())
    assert list(bars[0].error_y.array) == pytest.approx((sig.hi[0] - sig.mean[0]).float().tolist(), abs=1e-6)
    lv = sig.summary()["levels"]["plain"]["kindness"]
    assert lv == {"level": pytest.approx(float(hand), abs=1e-4), "ci95": [float(sig.lo[0, 0]), float(sig.hi[0, 0])],
                  "random_axis": float(sig.random[0, 0])} and sig.summary()["n"] == {"plain": 8}


def test_decomposition_recovers_a_target_along_one_trait(scales):
    acts = scales.acts["kindness"]
    keep = [i for i, x in enumerate(acts.labels) if x != "moderate"]
    target = acts[keep]            # high minus low of the trait itself: exactly along its trend direction
    dec = decompose(scales, target, positive="high", n_boot=20, n_random=4)
    s = scales["kindness"]
    m = s.graded.level_means
    expected = (m[:, 2] - m[:, 0]) * s.slope                                        # level steps, per layer
    torch.testing.assert_close(dec.coef[:, 0], expected.float(), rtol=1e-3, atol=1e-3)
    assert dec.coef[:, 1].abs().max() < 1e-3 and (dec.r2 > 0.999).all()
    assert (dec.random_r2 < 0.5).all()
    summ = dec.table()
    assert dec.summary()["traits"][dec.traits[0]]["coef"] == pytest.approx(summ.coef[0])
    assert summ.excludes_0[0] and summ.lo[0] <= summ.coef[0] <= summ.hi[0]
    bars = dec.plot().data
    assert len(bars) == 1 and list(bars[0].x) == dec.traits and bars[0].name == dec.target
    assert list(bars[0].y) == pytest.approx(summ.coef.tolist(), rel=1e-5)
    assert len(dec.to_frame()) == 8


def test_sycophancy_items_and_contrast(model, scales):
    items = sycophancy_items()
    assert len(items) == 64 and len(set(items)) == 64
    con = capture_contrast(model, items[:6], SYCOPHANCY_PROMPTS, scales)
    assert con.tensor.shape[:2] == (12, 4) and set(con.labels) == set(SYCOPHANCY_PROMPTS)
    dec = decompose(scales, con, n_boot=5, n_random=2)
    assert dec.coef.shape == (4, 2) and torch.isfinite(dec.coef).all()


def test_steering_in_level_units(model, scales):
    s = scales["kindness"]
    iv = level_vector(scales, "kindness", 2.0)
    added = iv.added_norms(model)
    for j in s.band:
        layer = int(s.graded.direction.layers[j])
        assert added[layer] == pytest.approx(2.0 * float(s.spacing[j]) / len(s.band), rel=1e-5)
    prompts = _statements(3, seed=5)
    st = steer_levels(model, scales, "kindness", prompts, ks=(-1.0, 0.0, 1.0), max_new_tokens=3)
    assert st.read[1] == pytest.approx(st.baseline, abs=1e-5) and st.read[0] < st.read[1] < st.read[2]
    assert abs(float(st.random[0, 2] - st.random[0, 0])) < float(st.read[2] - st.read[0])
    assert set(st.texts) == {-1.0, 0.0, 1.0} and len(st.to_frame()) == 9
    fig = st.plot()
    steered = [t for t in fig.data if t.name == "steered"]
    controls = [t for t in fig.data if t.name == "random direction (same strength)"]
    assert len(steered) == 1 and len(controls) == st.random.shape[0] and list(steered[0].x) == [-1.0, 0.0, 1.0]
    assert list(steered[0].y) == pytest.approx([float(v) for v in st.read])
    assert fig.layout.xaxis.title.text == "alpha" and fig.layout.yaxis.title.text == "kindness level read out"
    ss = st.summary()
    json.dumps(ss, allow_nan=True)   # JSON-ready
    assert ss["read"] == {k: pytest.approx(float(v)) for k, v in zip(("-1", "0", "1"), st.read)}
    assert ss["slope"] == pytest.approx(float(st.read[2] - st.read[0]) / 2)         # three evenly spaced ks
    assert ss["random_slope"] == pytest.approx(float(st.random.double().mean(0)[2] - st.random.double().mean(0)[0]) / 2)
    assert ss["baseline"] == st.baseline and ss["n_prompts"] == 3 and ss["band"] == st.band
    frac = residual_fraction(model, scales, "kindness", prompts)
    norms = steering.residual_norms(model, prompts, layers=list(frac))
    one = level_vector(scales, "kindness", 1.0).added_norms(model)
    assert frac == pytest.approx({k: one[k] / norms.at(k) for k in frac})


def _hooked_logits(model, ids, layer, vec):
    """Plain HF forward of one unpadded row, ``vec`` added to decoder layer ``layer``'s output (or nothing)."""
    def hook(mod, args, out):
        if isinstance(out, tuple):
            return (out[0] + vec,) + tuple(out[1:])
        return out + vec
    h = model.hf.model.layers[layer].register_forward_hook(hook) if vec is not None else None
    try:
        with torch.no_grad():
            return model.hf(input_ids=torch.tensor([ids])).logits[0].float()
    finally:
        if h is not None:
            h.remove()


def test_alpha_sweep_kl_and_ce_match_plain_hf_forwards(model):
    prompts, refs = _statements(3, seed=7), ["the man is here and he is old", "a boy was at the house"]
    norms = steering.residual_norms(model, prompts)
    v = torch.randn(model.d_model, generator=torch.Generator().manual_seed(1))

    def make(a):
        return steering.AddVector(v, layers=[1], alpha=a, unit="residual", norms=norms)

    sw = steering.alpha_sweep(model, prompts, make, [0.0, 0.5], lambda lg: lg[:, 5].mean(), on="logits",
                              config=steering.SweepConfig(reference_texts=refs), runtime=Runtime(progress=False))
    add = 0.5 * norms.at(1) * v / v.norm()
    encs = prepare(model, prompts)[1]
    kls = [kl_div(_hooked_logits(model, e.ids, 1, add)[-1], _hooked_logits(model, e.ids, 1, None)[-1]) for e in encs]
    assert float(sw.kl[1]) == pytest.approx(float(torch.stack(kls).mean()), rel=1e-3, abs=1e-6)
    assert float(sw.kl[0]) == pytest.approx(0.0, abs=1e-6) and float(sw.random_kl[0, 1]) > 0
    nll = []
    for e in prepare(model, refs, chat=False)[1]:
        lg = _hooked_logits(model, e.ids, 1, add)
        nll.append(torch.nn.functional.cross_entropy(lg[:-1], torch.tensor(e.ids[1:]), reduction="none"))
    assert float(sw.ce[1]) == pytest.approx(float(torch.cat(nll).mean()), rel=1e-4)
    base = [torch.nn.functional.cross_entropy(_hooked_logits(model, e.ids, 1, None)[:-1], torch.tensor(e.ids[1:]),
                                              reduction="none") for e in prepare(model, refs, chat=False)[1]]
    assert sw.baseline_ce == pytest.approx(float(torch.cat(base).mean()), rel=1e-4)
    assert float(sw.ce[0]) == pytest.approx(sw.baseline_ce, rel=1e-4)
    df = sw.to_frame()
    assert {"kl", "ce"} <= set(df.columns) and len(sw.plot().data) == 6
    with pytest.raises(ValueError, match="reference_texts"):
        steering.SweepConfig(reference_texts=[])
    plain = steering.alpha_sweep(model, prompts, make, [1.0], lambda lg: lg.mean(), on="logits",
                                 config=steering.SweepConfig(cost=False), runtime=Runtime(progress=False))
    assert plain.kl is None and len(plain.plot().data) == 2


def test_persona_statements_loader():
    folder = shared_path("data", "persona")
    qs = persona_statements(folder, traits=("extraversion",), n=5)
    assert len(qs["extraversion"]) == 5 and all(isinstance(q, str) and q for q in qs["extraversion"])
    with pytest.raises(FileNotFoundError, match="persona"):
        persona_statements(folder, traits=("charm",))


def test_band_runs_are_neighbours_among_the_captured_layers():
    """With layers subsampled (``range(0, 30, 3)``) a run is neighbours in the captured list, not model layers
    one apart (which would make every run one layer long)."""
    from interp.studies.directions.traits_band import _runs

    assert _runs([True, True, False, True, True, True]) == [[0, 1], [3, 4, 5]]
    assert _runs([False, False]) == []
