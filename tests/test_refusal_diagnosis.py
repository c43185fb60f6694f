"""The refusal job's checks: rates with intervals, the baseline diagnosis and its early stop, relaxed filters."""

from __future__ import annotations

import json
import math

import pytest
import scipy.stats as scipy_stats  # the oracle: scipy comes with scikit-learn (the [oracles] extra, in [dev])

from interp.evals.rates import fisher_greater, rate, wilson
from interp.studies.kit.config import SelectionConfig
from interp.studies.kit.stages import RefusalTokens
from interp.studies.refusal import RefusalConfig, run_refusal
from interp.studies.refusal.diagnosis import diagnose, effect_check, effect_notes, relaxed_notes


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (10, 10), (29, 32), (1, 64), (37, 100)])
def test_wilson_matches_scipy(k, n):
    ci = scipy_stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    lo, hi = wilson(k, n)
    assert lo == pytest.approx(ci.low, abs=2e-4) and hi == pytest.approx(ci.high, abs=2e-4)
    r = rate([True] * k + [False] * (n - k))
    assert (r["k"], r["n"]) == (k, n) and r["rate"] == pytest.approx(k / n)


@pytest.mark.parametrize("k1,n1,k2,n2", [(2, 64, 6, 64), (20, 32, 1, 32), (5, 10, 5, 10), (0, 8, 0, 8), (9, 12, 2, 30)])
def test_fisher_matches_scipy(k1, n1, k2, n2):
    _, p = scipy_stats.fisher_exact([[k1, n1 - k1], [k2, n2 - k2]], alternative="greater")
    assert fisher_greater(k1, n1, k2, n2) == pytest.approx(p, rel=1e-9, abs=1e-12)


def test_rate_errors_name_the_fix():
    with pytest.raises(ValueError, match="0 <= k <= n"):
        wilson(5, 3)
    with pytest.raises(ValueError, match="n >= 1"):
        fisher_greater(0, 0, 1, 2)


def _tokens(kh: int, nh: int, ks: int, ns: int) -> RefusalTokens:
    return RefusalTokens([1], ["I"], kh / nh, ks / ns, harmful_refused=[True] * kh + [False] * (nh - kh),
                         harmless_refused=[True] * ks + [False] * (ns - ks))


def test_diagnosis_verdicts():
    sel = SelectionConfig()
    assert diagnose(_tokens(60, 64, 1, 64), sel).refuses
    # the SmolLM2 case: capability disclaimers, more often on harmless than on harmful prompts
    d = diagnose(_tokens(2, 64, 6, 64), sel)
    assert not d.refuses and "fewer than the 8" in d.finding and d.p_value > 0.5
    d = diagnose(_tokens(12, 64, 6, 64), sel)  # enough refusals, but not harmful-specific
    assert not d.refuses and "not refuse harmful prompts clearly more often" in d.finding
    assert json.dumps(d.as_dict())  # metrics.json-ready


def test_relaxed_and_failed_checks_are_named():
    assert relaxed_notes(SelectionConfig()) == []
    notes = relaxed_notes(SelectionConfig(induce_threshold=-math.inf, kl_threshold=0.5, prune_layer_fraction=0.3))
    assert len(notes) == 3
    assert any("induce filter" in n and " off" in n for n in notes)
    assert any("KL filter" in n and "relaxed" in n for n in notes)
    assert any("depth filter" in n and "tightened" in n for n in notes)
    same = {"harmful/baseline": [True] * 10, "harmful/ablation": [True] * 10,
            "harmless/baseline": [False] * 10, "harmless/addition": [True] * 10}
    checks = effect_check(same, 0.01)
    assert not checks["ablation lowers harmful refusal"]["significant"]
    assert checks["addition raises harmless refusal"]["significant"]
    (note,) = effect_notes(checks, 0.01)
    assert "ablation lowers harmful refusal" in note


def test_model_that_does_not_refuse_stops_after_the_diagnosis(tmp_path):
    """organism-base (the toy organism before its safety tuning) does not refuse: the job stops before capture
    and scoring, says why in the notes, metrics.json and the report, and still writes generations.jsonl."""
    res = run_refusal(RefusalConfig.from_flat(model="organism-base"), tmp_path / "run")
    assert res.computed == ["tokens"] and not res.found
    m = res.metrics
    assert m["diagnosis"]["refuses"] is False and "candidates" not in m and "selection" not in m
    assert m["notes"] == [m["diagnosis"]["finding"]] and "does not refuse" in m["notes"][0]
    lines = [json.loads(x) for x in (tmp_path / "run" / "generations.jsonl").read_text().splitlines()]
    assert {x["condition"] for x in lines} == {"train/harmful baseline", "train/harmless baseline"}
    # the sequential probe judged 32 prompts per class and stopped there
    assert m["diagnosis"]["train_refusal"]["harmful"]["n"] == 32
    html = (tmp_path / "run" / "report.html").read_text()
    assert "diagnosis" in html and "does not refuse" in html and "Baseline generations" in html


def test_relaxed_filter_is_noted_in_a_run(tmp_path):
    res = run_refusal(RefusalConfig.from_flat(model="organism", induce_threshold=-1e9, n_train=16, n_val=8,
                                              n_test=8, max_new_tokens=6, subspace_rank=1), tmp_path / "run")
    assert any("induce filter" in n for n in res.notes)
    assert any("induce filter" in n for n in res.metrics["notes"])
    assert "induce filter" in (tmp_path / "run" / "report.html").read_text()
