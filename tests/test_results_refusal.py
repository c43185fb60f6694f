"""The refusal job's results on a real run of the embedded organism: each stage's ``.to_frame()`` holds the
stage's own numbers, each ``.plot()`` draws them (the report page draws the same figures), ``.summary()`` gives
headline numbers, and the run saves and loads through the one bundle."""

from __future__ import annotations

import math

import pytest
import torch

from interp.evals.rates import Rate
from interp.studies.refusal import RefusalConfig, run_refusal

from .conftest import REPO
from .test_results_uniform import _check


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    if not (REPO / "interp" / "embedded" / "organism" / "config.json").exists():
        pytest.fail("the embedded organism is missing; regenerate it with python -m interp.organisms.train")
    res = run_refusal(RefusalConfig.from_flat(model="organism"), tmp_path_factory.mktemp("runs") / "aligned")
    assert res.found and res.estimate is not None and res.writers is not None, res.notes
    return res


def _same_value(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-6, abs=1e-7)


def test_scores_frame_and_heatmaps_hold_the_exact_scores(run):
    sc, cand, sel = run.scores, run.candidates, run.selection
    fr = sc.to_frame(cand, sel)
    n_layers, n_pos = sc.bypass.shape
    assert len(fr) == n_layers * n_pos and {"layer", "position", "position_token", "bypass", "induce", "kl"} <= set(fr)
    for row in fr.itertuples():
        li, pi = cand.layers.index(row.layer), row.position + n_pos
        assert row.position_token == cand.pos_tokens[pi]
        for name in ("bypass", "induce", "kl"):
            assert _same_value(getattr(row, name), float(getattr(sc, name)[li, pi])), (name, li, pi)
    chosen = fr[fr.selected]
    assert len(chosen) == 1 and int(chosen.layer.iloc[0]) == sel.layer and int(chosen.position.iloc[0]) == sel.position
    plain = sc.to_frame()           # no candidates: row indices and positions from the end
    assert list(plain.layer.unique()) == list(range(n_layers)) and not plain.selected.any()
    fig = sc.plot(cand, sel)
    maps = [t for t in fig.data if t.type == "heatmap"]
    assert len(maps) == 3 and [list(m.y) for m in maps] == [cand.layers] * 3
    for m, t in zip(maps, (sc.bypass, sc.induce, sc.kl)):
        got = torch.tensor([[math.nan if v is None else v for v in row] for row in m.z])
        torch.testing.assert_close(got, t.float(), equal_nan=True)
    marks = [t for t in fig.data if t.name == "selected"]
    assert len(marks) == 3 and all(list(t.y) == [sel.layer] for t in marks)
    s = sc.summary()
    assert s["n_candidates"] == n_layers * n_pos and s["n_scored"] == sc.n_scored
    assert s["min_bypass"] == pytest.approx(float(sc.bypass[~sc.bypass.isnan()].min()))
    assert s["baseline_harmful"] == sc.baseline_harmful


def test_estimate_frame_and_figure(run):
    est, cand, sel = run.estimate, run.candidates, run.selection
    fr = est.to_frame(cand, sel)
    assert len(fr) == est.bypass.numel() and {"bypass", "induce", "kl", "curvature"} <= set(fr)
    assert fr.bypass.tolist() == pytest.approx(est.bypass.flatten().tolist())
    assert fr.curvature.tolist() == pytest.approx(est.curvature.flatten().tolist())
    maps = [t for t in est.plot(cand, sel).data if t.type == "heatmap"]
    assert len(maps) == 3 and maps[2].z[0][0] == pytest.approx(float(est.kl[0, 0]))
    blank = [t for t in est.plot(cand, sel, kl=False).data if t.type == "heatmap"][2]
    assert all(v is None or math.isnan(v) for row in blank.z for v in row)
    assert est.summary()["forwards"] == est.forwards and est.summary()["min_bypass"] == pytest.approx(
        float(est.bypass.min()))


def test_candidates_tokens_and_selection(run):
    cand, tok, sel = run.candidates, run.tokens, run.selection
    fr = cand.to_frame()
    assert len(fr) == cand.raw.shape[0] * cand.raw.shape[1]
    assert fr.norm.tolist() == pytest.approx(cand.raw.float().norm(dim=-1).flatten().tolist(), rel=1e-5)
    li, pi = sel.layer_index, sel.position_index
    unit = cand.raw[li, pi].float() / cand.raw[li, pi].float().norm()
    h, s = cand.harmful_acts[:, li, pi].float() @ unit, cand.harmless_acts[:, li, pi].float() @ unit
    pooled = (((len(h) - 1) * h.var() + (len(s) - 1) * s.var()) / (len(h) + len(s) - 2)).sqrt()
    assert float(cand.separation()[li, pi]) == pytest.approx(float((h.mean() - s.mean()) / pooled), rel=1e-4)
    cos = cand.plot(sel.position).data[0]
    assert list(cos.x) == cand.layers and cos.z[li][li] == pytest.approx(1.0)
    assert cand.summary()["n_positions"] == cand.n_positions and cand.summary()["d_model"] == cand.raw.shape[-1]
    tf = tok.to_frame()
    assert len(tf) == len(tok.harmful_texts) + len(tok.harmless_texts)
    assert tf[tf.set == "harmful"].refused.mean() == pytest.approx(tok.train_refusal_harmful)
    bars = tok.plot().data[0]
    assert list(bars.x) == ["harmful/train", "harmless/train"]
    assert list(bars.y) == pytest.approx([100 * tok.train_refusal_harmful, 100 * tok.train_refusal_harmless])
    assert tok.summary()["refusal_tokens"] == tok.strings and tok.summary()["harmful/train"]["n"] == len(tf[tf.set == "harmful"])
    sf = sel.to_frame()
    assert dict(zip(sf["filter"], sf["passing"])) == {k: v for k, v in sel.passing.items() if k != "of"}
    bar = sel.plot().data[0]
    assert list(bar.x) == list(sf["passing"]) and list(bar.y) == list(sf["rule"])
    assert sel.summary()["layer"] == sel.layer and sel.summary()["passing"] == sel.passing["all"]


def test_evaluation_and_subspaces(run):
    ev, sub = run.evaluation, run.subspaces
    fr = ev.to_frame()
    assert list(fr.condition) == list(dict.fromkeys([*ev.refusal_rate, *ev.refused]))
    assert set(Rate(1, 2).columns()) <= set(fr.columns)
    for row in fr.itertuples():
        assert row.rate == pytest.approx(ev.refusal_rate[row.condition])
        assert row.k == sum(ev.refused[row.condition]) and row.n == len(ev.refused[row.condition])
        assert f"{row.prompts}/{row.intervention}" == row.condition
    bars = ev.plot().data[0]
    assert list(bars.x) == list(ev.refusal_rate) and list(bars.y) == pytest.approx(
        [100 * v for v in ev.refusal_rate.values()])
    assert ev.summary()["refusal_rate"] == ev.refusal_rate
    sf = sub.to_frame()
    assert list(sf["rank"]) == sub.ranks and list(sf.rate) == sub.rates and sf.added[0] == "refusal direction"
    assert list(sf.added[1:]) == sub.categories[:len(sub.ranks) - 1]
    fig = run.plot("subspaces")
    real = [t for t in fig.data if t.name == "refusal direction + per-category"]
    assert list(real[0].y) == pytest.approx([100 * v for v in sub.rates]) and list(real[1].y) == sub.scores
    assert sub.summary()["rate_max_rank"] == sub.rates[-1]


def test_writers_frame_has_the_rate_columns(run):
    w = run.writers
    fr = w.to_frame()
    assert len(fr) == len(w.rows) and {"group", "direction", "sites", "score", *Rate(1, 2).columns()} <= set(fr)
    for row, r in zip(fr.itertuples(), w.rows):
        assert (row.group, row.k, row.n, row.rate) == (r["group"], r["k"], r["n"], r["rate"])
        assert [row.low, row.high] == r["ci95"]


def test_the_run_as_one_result(run, tmp_path):
    assert run.to_frame().equals(run.scores.to_frame(run.candidates, run.selection))
    assert run.to_frame("evaluation").equals(run.evaluation.to_frame())
    heat = [t for t in run.plot().data if t.type == "heatmap"]
    assert len(heat) == 3 and list(heat[0].y) == run.candidates.layers
    s = run.summary()
    assert s["found"] and s["selected_layer"] == run.selection.layer and s["refusal_rate"] == run.evaluation.refusal_rate
    with pytest.raises(ValueError, match="stage must be one of"):
        run.to_frame("nonsense")
    for stage in (run.tokens, run.candidates, run.estimate, run.scores, run.selection, run.evaluation, run.subspaces,
                  run.writers):
        _check(stage, tmp_path / type(stage).__name__)
    back = _check(run, tmp_path / "run")
    torch.testing.assert_close(back.direction.vectors, run.direction.vectors, rtol=0, atol=0)


def test_a_run_stopped_at_the_diagnosis_says_what_it_has(tmp_path):
    from interp.studies.kit.stages import RefusalTokens
    from interp.studies.refusal.result import RefusalResult

    tok = RefusalTokens([], [], 0.25, 0.0, ["a", "b", "c", "d"], ["e", "f"], [True, False, False, False], [False, False])
    res = RefusalResult(tmp_path, tokens=tok)
    assert res.to_frame().equals(tok.to_frame()) and list(res.plot().data[0].y) == pytest.approx([25.0, 0.0])
    with pytest.raises(ValueError, match=r"no scores stage .* its stages: \['tokens'\]"):
        res.plot("scores")
    assert res.summary()["found"] is False and tok.summary()["harmful/train"]["k"] == 1
