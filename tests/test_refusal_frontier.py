"""The refusal-vs-damage frontier (issue 36): a seeded Optuna search over the abliteration families on the toy
organism and a tiny random model; the front is Pareto, the chosen point follows the rule, the saved specs reload and
regenerate the confirmed generations byte for byte; bad input is refused with the fix named."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

import interp
import steering
from interp.studies.kit.config import DataConfig
from interp.studies.kit.prompt_sets import load_refusal_data
from interp.studies.kit.stages import find_candidates, find_refusal_tokens
from interp.studies.refusal.frontier import (
    FrontierConfig,
    frontier_edit,
    run_frontier,
    save_point_specs,
    search,
)
from interp.studies.refusal.frontier_result import FrontierResult, choose, pareto
from interp.testing.tiny import tiny_model
from interp.values import Runtime

CFG = FrontierConfig(trials=6, max_points=3, max_new_tokens=8, n_screen=8)


@pytest.fixture(scope="module")
def organism():
    model = interp.load_model("organism")
    data = load_refusal_data("organism", DataConfig(n_test=8))
    tokens = find_refusal_tokens(model, data, 12)
    assert tokens.tokens, "the aligned organism refuses: it has refusal tokens"
    return model, data, tokens.tokens, find_candidates(model, data)


@pytest.fixture(scope="module")
def frontier(organism):
    model, data, tokens, cand = organism
    return run_frontier(model, data, cand, tokens, CFG)


def test_search_is_seeded(organism):
    model, data, tokens, cand = organism
    cfg = FrontierConfig(trials=4, n_screen=4, seed=3)
    a, base_a = search(model, data, cand, tokens, cfg)
    b, base_b = search(model, data, cand, tokens, cfg)
    assert len(a) == 4 and a == b and base_a == base_b
    other, _ = search(model, data, cand, tokens, FrontierConfig(trials=4, n_screen=4, seed=4))
    assert [t["params"] for t in other] != [t["params"] for t in a]


def test_pareto_matches_brute_force():
    rng = random.Random(0)
    for _ in range(20):
        pts = [(rng.choice([0.0, 1.0, 2.0, rng.random()]), rng.choice([0.0, 1.0, rng.random()])) for _ in range(12)]
        dominated = {i for i, j in itertools.permutations(range(len(pts)), 2)
                     if pts[j][0] <= pts[i][0] and pts[j][1] <= pts[i][1] and pts[j] != pts[i]}
        got = pareto(pts)
        assert not set(got) & dominated
        assert {pts[i] for i in got} == {pts[i] for i in range(len(pts)) if i not in dominated}


def test_frontier_is_pareto_and_the_chosen_point_follows_the_rule(frontier):
    res: FrontierResult = frontier
    assert len(res.trials) == CFG.trials and 1 <= len(res.points) <= CFG.max_points
    vals = [(p["val_refusal_score"], p["val_kl"]) for p in res.points]
    for a, b in itertools.permutations(vals, 2):
        assert not (a[0] <= b[0] and a[1] <= b[1] and a != b), f"{b} is dominated by {a}"
    ok = [i for i, p in enumerate(res.points) if p["harmful"]["rate"] <= CFG.target]
    want = (min(ok, key=lambda i: res.points[i]["kl"]) if ok
            else min(range(len(res.points)), key=lambda i: res.points[i]["harmful"]["rate"]))
    assert res.chosen == want and "lowest harmless KL" in res.rule
    base = res.baseline["harmful"]
    assert base["rate"] > 0.5, "the aligned organism refuses its harmful test prompts"
    for p in res.points:  # every point has its held-out measures and its control
        assert p["harmful"]["n"] == base["n"] and p["control_harmful"]["n"] == base["n"]
        assert p["kl"] >= 0 and p["ce"] > 0 and p["control_kl"] >= 0
    assert res.side_effect["of"] == 8 and set(res.side_effect["refused"]) <= {"baseline", "zero", "reference"}
    frame = res.to_frame()
    assert len(frame) == len(res.points) and frame["chosen"].sum() == 1
    assert res.to_frame("trials")["pareto"].any()
    assert len(res.plot().data) >= 4
    assert res.summary()["chosen"]["point"] == res.chosen


def test_choose_rule():
    pts = [{"harmful": {"rate": r}, "kl": k} for r, k in ((0.5, 0.01), (0.1, 0.3), (0.05, 0.2), (0.0, 0.9))]
    assert choose(pts, 0.10)[0] == 2
    assert choose(pts, 0.0)[0] == 3
    assert choose(pts[:1], 0.10)[0] == 0   # none reaches the target: the lowest refusal


def test_specs_reload_and_regenerate_byte_for_byte(organism, frontier, tmp_path):
    model, data, _, cand = organism
    paths = save_point_specs(frontier, cand, model, tmp_path / "edits")
    i = frontier.chosen
    edit = steering.load_edit(paths[f"frontier-point{i}"], model)
    again = steering.generate_and_judge(model, data.harmful["test"].instructions, edit,
                                        max_new_tokens=CFG.max_new_tokens,
                                        runtime=Runtime(batch_size=CFG.batch_size, progress=False))
    assert again.texts == frontier.generations[f"point{i}/harmful"]
    assert dict(again) == frontier.points[i]["harmful"]
    ctrl = steering.load_edit(paths[f"frontier-point{i}-random_control"], model)
    again = steering.generate_and_judge(model, data.harmful["test"].instructions, ctrl,
                                        max_new_tokens=CFG.max_new_tokens,
                                        runtime=Runtime(batch_size=CFG.batch_size, progress=False))
    assert again.texts == frontier.generations[f"point{i}/control_harmful"]
    with pytest.raises(FileExistsError):   # nothing a user saved is silently overwritten
        save_point_specs(frontier, cand, model, tmp_path / "edits")


def test_result_saves_and_loads(frontier, tmp_path):
    back = FrontierResult.load(frontier.save(tmp_path / "fr"))
    assert back.points == frontier.points and back.trials == frontier.trials and back.chosen == frontier.chosen


def test_bad_input(organism):
    model, data, tokens, cand = organism
    with pytest.raises(ValueError, match="trials=N"):
        FrontierConfig(trials=0)
    with pytest.raises(ValueError, match="outside the model's 4 layers"):
        search(model, data, cand, tokens, FrontierConfig(trials=2, position_range=(1.0, 7.0)))
    params = {"position": 0, "direction_index": 1.0, "orthogonalize": False, "variant": "zero",
              "attn": {"max_weight": 1.0, "max_weight_position": 9.0, "min_weight": 0.5, "min_weight_distance": 1.0},
              "mlp": {"max_weight": 1.0, "max_weight_position": 1.0, "min_weight": 0.5, "min_weight_distance": 1.0}}
    with pytest.raises(ValueError, match="beyond the model's 4 layers"):
        with steering.apply(model, frontier_edit(cand, params)):
            pass
    with pytest.raises(ValueError, match="refusal tokens"):
        run_frontier(model, data, cand, [], CFG)


@pytest.mark.parametrize("family", ["qwen2", "qwen2_moe"])
def test_search_on_a_tiny_model(family):
    model = tiny_model(family, n_layers=3)
    data = load_refusal_data("organism", DataConfig(n_train=8, n_val=4, n_test=4))
    cand = find_candidates(model, data)
    cfg = FrontierConfig(trials=5, n_screen=4, sampler="nsga2", seed=1)
    a, _ = search(model, data, cand, [5, 6], cfg)
    b, _ = search(model, data, cand, [5, 6], cfg)
    assert a == b and all(torch.isfinite(torch.tensor([t["refusal_score"], t["kl"]])).all() for t in a)
    assert {t["params"]["variant"] for t in a} <= {"zero", "reference", "norm_preserving"}


def test_job_search_frontier_writes_specs_report_and_the_chosen_model(tmp_path):
    import json

    from interp.cli.main import main

    out = tmp_path / "run"
    assert main(["refusal", "--model", "organism", "--search", "frontier", "--trials", "4", "--n-test", "8",
                 "--max-new-tokens", "8", "--save-model", "--out", str(out)]) == 0
    m = json.loads((out / "metrics.json").read_text())
    fr = m["frontier"]
    chosen = fr["summary"]["chosen"]
    assert len(fr["points"]) >= 1 and chosen["chosen"] and "lowest harmless KL" in fr["summary"]["rule"]
    spec = out / m["edits"][f"frontier-point{chosen['point']}"]
    model = interp.load_model("organism")
    edit = steering.load_edit(spec, model)
    lines = [json.loads(x) for x in (out / "generations.jsonl").read_text().splitlines()]
    run_texts = [x["response"] for x in lines if x["condition"] == f"frontier/point{chosen['point']}/harmful"]
    again = steering.generate_and_judge(model, load_refusal_data("organism", DataConfig(n_test=8)).harmful["test"]
                                        .instructions, edit, max_new_tokens=8,
                                        runtime=Runtime(batch_size=64, progress=False))
    assert len(run_texts) == 8 and again.texts == run_texts
    assert "Refusal vs damage frontier" in (out / "report.html").read_text()
    baked = interp.load_model(fr["saved_model"])   # the chosen point's bake equals its hooks
    ids = torch.randint(0, 200, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), steering.apply(model, edit):
        hooked = model.hf(ids).logits
    with torch.no_grad():
        assert torch.allclose(baked.hf(ids).logits, hooked, atol=1e-4 * float(hooked.abs().max()))


def test_job_refuses_a_budget_of_zero(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "interp.cli.main", "refusal", "--model", "organism", "--search",
                        "frontier", "--trials", "0", "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode != 0 and "trials=N" in r.stderr


@pytest.mark.parametrize("variant", ["zero", "reference", "norm_preserving"])
def test_each_variant_screens_and_its_spec_reloads(organism, variant, tmp_path):
    from interp.studies.refusal.frontier import Screen

    model, data, tokens, cand = organism
    kern = {"max_weight": 1.0, "max_weight_position": 2.0, "min_weight": 0.5, "min_weight_distance": 2.0}
    params = {"position": cand.n_positions - 1, "direction_index": 1.5, "orthogonalize": True, "variant": variant,
              "attn": kern, "mlp": kern}
    edit = frontier_edit(cand, params)
    screen = Screen(model, data, tokens, 8, 64)
    score, kl = screen(edit)
    assert score < screen.baseline and kl > 0        # the edit lowers the refusal score at some cost
    back = steering.load_edit(steering.save_edit(edit, tmp_path / "e", model), model)
    assert type(back) is type(edit) and screen(back) == (score, kl)


def test_the_screen_score_is_floored_where_refusal_is_gone(organism):
    """Each harmful prompt's refusal score counts down to the unedited harmless prompts' mean and no further, so a
    destructive edit (a huge vector added at every layer) cannot buy a better screen score than an edit that only
    removes refusal; without the floor its mean would sit far below."""
    from interp.evals.logits import refusal_score
    from interp.studies.kit.scoring import prompt_logits
    from interp.studies.refusal.frontier import Screen

    model, data, tokens, cand = organism
    screen = Screen(model, data, tokens, 8, 64)
    assert screen.floor == pytest.approx(float(refusal_score(screen.plain, tokens).mean()))
    assert screen.floor < screen.baseline
    push = -cand.raw[:, -1].float().mean(0)
    wreck = steering.AddVector(push / push.norm(), layers=list(range(model.n_layers)), alpha=1e4)
    score, kl = screen(wreck)
    raw = refusal_score(prompt_logits(model, screen.harmful, wreck, batch_size=64), tokens)
    assert score == pytest.approx(float(raw.clamp(min=screen.floor).mean()))
    assert score >= screen.floor - 1e-6 and kl > 0
    assert float(raw.mean()) < score - 1, "the floor binds here: unfloored, the wrecked model scores far lower"


@pytest.mark.parametrize("variant", ["zero", "reference", "norm_preserving"])
def test_per_layer_scope_ablates_each_layers_own_direction(organism, variant, tmp_path):
    """Heretic's per-layer scope: the writers of layer l ablate the candidate of the residual they write into (layer
    l + 1's resid_pre; the last layer its own), unit, orthogonal to that row's harmless mean; the spec reloads."""
    from interp.studies.refusal.frontier import Screen, layer_directions, written_rows

    model, data, tokens, cand = organism
    kern = {"max_weight": 1.0, "max_weight_position": 2.0, "min_weight": 1.0, "min_weight_distance": 3.0}
    params = {"position": cand.n_positions - 1, "scope": "per_layer", "direction_index": 1.5, "orthogonalize": True,
              "variant": variant, "attn": kern, "mlp": kern}
    edit = frontier_edit(cand, params)
    rows = written_rows(cand)
    assert rows == {0: 1, 1: 2, 2: 3, 3: 3}
    dirs = layer_directions(cand, cand.n_positions - 1, True)
    mean = cand.harmless_acts[:, :, -1].float().mean(0)
    for layer, r in dirs.items():
        raw = cand.raw[rows[layer], -1].float()
        expect = raw - (raw @ mean[rows[layer]]) / (mean[rows[layer]] @ mean[rows[layer]]) * mean[rows[layer]]
        assert torch.allclose(r, expect / expect.norm(), atol=1e-6)
        assert abs(float(r @ mean[rows[layer]])) < 1e-3 * float(mean[rows[layer]].norm())
    plan = (edit._inner if variant == "norm_preserving" else edit).plan(model)
    assert {layer for _, layer, *_ in plan} == set(range(model.n_layers))
    for _, layer, _, r, _ in plan:
        assert torch.allclose(r.float(), dirs[layer], atol=1e-6)
    screen = Screen(model, data, tokens, 8, 64)
    score, kl = screen(edit)
    back = steering.load_edit(steering.save_edit(edit, tmp_path / "e", model), model)
    assert screen(back) == (score, kl)


def test_heretic_ranges_bound_every_trial(organism):
    from interp.studies.refusal.frontier import index_range

    model, data, tokens, cand = organism
    cfg = FrontierConfig(trials=6, n_screen=4, seed=2)
    assert cfg.ranges == "heretic" and cfg.layer_range(4) == (0.6 * 3, 3.0)
    lo, hi = index_range(cfg, len(cand.layers))
    assert (lo, hi) == (pytest.approx(0.4 * 3 + 1), 3.0)
    trials, _ = search(model, data, cand, tokens, cfg)
    for t in trials:
        p = t["params"]
        assert lo <= p["direction_index"] <= hi and p["scope"] in ("global", "per_layer")
        for w in ("attn", "mlp"):
            assert 0.8 <= p[w]["max_weight"] <= 1.5 and 1.8 <= p[w]["max_weight_position"] <= 3.0
            assert 1.0 <= p[w]["min_weight_distance"] <= 1.8 + 1e-9
    wide = FrontierConfig(trials=1, ranges="wide")
    assert wide.layer_range(4) == (0.0, 3.0) and index_range(wide, 4) == (0.0, 3.0)
    with pytest.raises(ValueError, match="ranges must be one of"):
        FrontierConfig(ranges="narrow")
    with pytest.raises(ValueError, match="scopes must be"):
        FrontierConfig(scopes=("everywhere",))


def test_confirmation_takes_the_knee_before_the_spread():
    """The run in RESULTS_frontier.md whose front had a point at the floor (score -4.17, floor -4.46) at KL 0.24
    between spread points at KL 0.15 and 7.1: the knee is confirmed first, then the spread fills up."""
    from interp.studies.refusal.frontier_result import knee_then_spread

    scores = [1.4, 0.5, -0.7, -1.0, -4.17, -4.38, -5.57]
    kls = [0.005, 0.022, 0.15, 0.19, 0.236, 0.268, 7.09]
    picked = knee_then_spread(scores, kls, 4, floor=-4.46, baseline=0.97)
    assert 4 in picked and len(picked) == 4 and picked == sorted(picked, key=lambda i: kls[i])
    assert picked[:1] == [0] and 6 in picked                 # both ends of the even spread kept
    assert knee_then_spread(scores, kls, 1, -4.46, 0.97) == [4]
    assert knee_then_spread(scores[:2], kls[:2], 4, -4.46, 0.97) == [0, 1]     # no knee: the spread alone
    assert knee_then_spread(scores, kls, 10, -4.46, 0.97) == list(range(7))
