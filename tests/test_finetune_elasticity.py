"""Elasticity on the toy organism with a few steps: one point per eval step, the first point is the untouched
model measured by hand, the fit recovers known rates, the control is a plain fine-tune, and bad input."""

from __future__ import annotations

import math

import pytest
import torch

from interp.evals.logits import kl_div
from interp.forward import prepare
from interp.models import load_model
from interp.studies.finetune.elasticity import ElasticityConfig, elasticity_study
from interp.studies.finetune.twophase import bootstrap_two_phase, fit_two_phase
from interp.studies.kit.config import DataConfig
from interp.studies.kit.prompt_sets import load_refusal_data
from interp.studies.kit.scoring import prompt_logits
from interp.tune import TuneConfig

CFG = TuneConfig(steps=5, batch_size=4, lr=5e-3, warmup=1, seed=0, targets=("q_proj", "v_proj", "down_proj"))


@pytest.fixture(scope="module")
def models():
    return load_model("organism-base"), load_model("organism")


@pytest.fixture(scope="module")
def data():
    return load_refusal_data("organism", DataConfig(n_train=12, n_val=2, n_test=6))


@pytest.fixture(scope="module")
def study(models, data):
    base, aligned = models
    forward = (data.harmful["train"].instructions[:4] + data.harmless["train"].instructions[:4],
               ["i cannot help you with that. it could hurt people."] * 4 + ["sure, here is how. first, start."] * 4)
    return elasticity_study(base, aligned, data, layer=2, pairs={"forward": forward},
                            config=ElasticityConfig(tune=CFG, n_pairs=6, eval_every=1, n_boot=3, max_new_tokens=6,
                                                    answer_tokens=12))


def test_one_point_per_eval_step_and_the_start_by_hand(study, models, data):
    base, aligned = models
    assert set(study.curves) == {"compliance", "control", "forward"}
    for c in study.curves.values():
        assert c.steps == list(range(0, 6))
        assert c.per_prompt["score"].shape == (6, 6) and c.per_prompt["refusal"].shape == (6, 6)
        assert all(r["n"] == 6 for r in c.rows)
    comp = study.curves["compliance"].rows[0]
    assert comp["cosine"] == pytest.approx(1.0, abs=1e-5) and comp["kl_aligned"] == pytest.approx(0.0, abs=1e-6)
    safe = prepare(base, data.harmless["test"].instructions)[1]
    with torch.no_grad():
        kl = kl_div(prompt_logits(base, safe), prompt_logits(aligned, safe)).mean()
    assert comp["kl_base"] == pytest.approx(float(kl), rel=1e-5)
    assert study.curves["forward"].rows[0]["kl_base"] == pytest.approx(0.0, abs=1e-6)
    assert comp["refusal"] > study.curves["forward"].rows[0]["refusal"]  # aligned refuses, base does not
    ctrl = study.curves["control"].rows[0]  # both start from the untouched aligned model
    assert all(ctrl[k] == pytest.approx(comp[k], abs=1e-6) for k in ("refusal", "score", "cosine", "auroc", "kl_base"))


def test_fits_summary_frames_and_the_models_are_left_as_they_were(study, models):
    base, aligned = models
    assert set(study.fits) == {(c, q) for c in study.curves for q in ("score", "refusal")}
    assert all(f.n_points == 6 and f.n_boot == 3 for f in study.fits.values())
    assert {r["curve"] for r in study.outcomes} == set(study.curves) == set(study.summary())
    assert study.summary()["compliance"]["refusal_end"] == study.curves["compliance"].rows[-1]["refusal"]
    assert len(study.to_frame("outcomes")) == len(study.curves)
    assert len(study.to_frame()) == 18 and len(study.to_frame("fits")) == 6
    assert len(study.plot().data) > 0
    fresh = load_model("organism")
    assert all(torch.equal(a, b) for a, b in zip(aligned.hf.state_dict().values(), fresh.hf.state_dict().values()))
    assert study.meta["n_pairs"] <= 6


def test_fit_recovers_known_rates():
    t = torch.arange(0, 101, 5.0)
    y = 0.2 + 2.5 * torch.exp(-0.15 * t) + 0.8 * torch.exp(-0.012 * t)
    f = fit_two_phase(t, y)
    assert f.k_fast == pytest.approx(0.15, rel=1e-3) and f.k_slow == pytest.approx(0.012, rel=1e-3)
    assert f.a_fast == pytest.approx(2.5, rel=1e-3) and f.a_slow == pytest.approx(0.8, rel=1e-3)
    assert f.c == pytest.approx(0.2, abs=1e-3) and not f.at_bound
    rising = fit_two_phase(t, 1 - 0.6 * torch.exp(-0.3 * t) - 0.4 * torch.exp(-0.02 * t))
    assert (rising.k_fast, rising.k_slow) == (pytest.approx(0.3, rel=1e-3), pytest.approx(0.02, rel=1e-3))
    noisy = (y[:, None] + 0.05 * torch.randn(len(t), 40, generator=torch.Generator().manual_seed(0))).double()
    b = bootstrap_two_phase(t, noisy, n_boot=20)
    assert b.ci95["k_slow"][0] <= b.k_slow <= b.ci95["k_slow"][1] and b.n_boot == 20
    with pytest.raises(ValueError, match="at least 5 points"):
        fit_two_phase(t[:4], y[:4])


def test_bad_input(models, data):
    base, aligned = models
    with pytest.raises(ValueError, match="fewer than 5 points"):
        elasticity_study(base, aligned, data, layer=2, config=ElasticityConfig(tune=TuneConfig(steps=4), eval_every=2))
    one = ElasticityConfig(tune=CFG, eval_every=1)
    with pytest.raises(ValueError, match="out of range"):
        elasticity_study(base, aligned, data, layer=9, config=one)
    with pytest.raises(ValueError, match="refused none"):
        elasticity_study(base, base, data, layer=2, config=one)
    with pytest.raises(ValueError, match="compliance pairs.*one response per prompt"):
        elasticity_study(base, aligned, data, layer=2, pairs={"compliance": (["a", "b"], ["x"])}, config=one)
    with pytest.raises(TypeError, match="ElasticityConfig\\(tune=TuneConfig"):
        elasticity_study(base, aligned, data, layer=2, config=CFG)
    with pytest.raises(ValueError, match="eval_every must be >= 1"):
        ElasticityConfig(eval_every=0)
    assert math.isfinite(fit_two_phase(torch.arange(6.0), torch.ones(6)).rmse)
