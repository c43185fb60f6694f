"""The refusal job's post-instruction ablation (``ablate_positions="post_instruction"``): batched scoring, the
first-order estimate, the evaluation's teacher-forced KL / CE, the whole pipeline, and its refusals.

Each is checked against an independent computation: plain hooks (``interp.hooks``) that project the direction
out of the writers at the tokens ``Batch.post_mask`` marks (and the response tokens, which stand for generated
ones), and central finite differences for the estimate."""

from __future__ import annotations

import argparse

import pytest
import torch

import steering
from interp.evals.logits import cross_entropy, refusal_score
from interp.forward import batches, forward, last_logits, prepare
from interp.hooking import hooks
from interp.studies.kit.scoring import ablation, prompt_logits, score_rows
from interp.studies.refusal import RefusalConfig, SelectionConfig, run_refusal
from interp.studies.refusal.estimate import ablation_moment, harmless_terms, writer_sites
from interp.studies.refusal.evaluation import harmless_kl_ce
from interp.testing.tiny import tiny_model
from steering.prefill import prompt_prefixes

PROMPTS = ["the man said", "what is the good word now, tell me", "help", "write a long story about water",
           "how do you make a house"]
TOKENS = [40, 41, 42]


def _masked_hooks(m, r, where, a=1.0):
    """Independent oracle: ``x - a (x.r) r * where`` at every writer, ``where [B, T]`` a token mask."""
    sites = [s.name for s in writer_sites(m)]
    w = where.to(m.dtype)[..., None]
    return [(s, lambda x, ctx: x - a * (x @ r)[..., None] * r * w) for s in sites]


def test_row_edits_with_a_token_mask_equal_hooks_at_the_post_instruction_tokens():
    m = tiny_model("qwen2")
    _, encs = prepare(m, PROMPTS[:3])
    (b,) = batches(m, encs, len(encs))
    torch.manual_seed(0)
    dirs = torch.nn.functional.normalize(torch.randn(4, m.d_model), dim=-1)
    post = score_rows(m, encs, dirs, "ablate", max_rows=7, positions="post_instruction")
    every = score_rows(m, encs, dirs, "ablate", max_rows=7)
    for c in range(4):
        oracle = last_logits(m, b, _masked_hooks(m, dirs[c], b.post_mask)).cpu()
        torch.testing.assert_close(post[c], oracle, atol=1e-5, rtol=0)
        # the same intervention through steering (prompt_logits declares each batch's post-instruction mask)
        torch.testing.assert_close(post[c], prompt_logits(m, encs, ablation(dirs[c], "post_instruction")),
                                   atol=1e-5, rtol=0)
        # and with the plain pass's keys and values of the columns before the post-instruction tokens reused
        torch.testing.assert_close(post[c], prompt_logits(m, encs, ablation(dirs[c], "post_instruction"), batch_size=2,
                                                          prefixes=prompt_prefixes(m, encs, 2)), atol=1e-5, rtol=0)
        assert (post[c] - every[c]).abs().max() > 1e-3      # the instruction tokens are left alone
    assert all(start > 0 for _, start in prompt_prefixes(m, encs, 2))   # the reuse above was real
    with pytest.raises(ValueError, match="prefixes holds 2 batches but the prompts make 1"):
        prompt_logits(m, encs, batch_size=3, prefixes=prompt_prefixes(m, encs, 2))
    with pytest.raises(ValueError, match="ablate_positions must be one of"):
        score_rows(m, encs, dirs, "ablate", positions="instruction")
    with pytest.raises(ValueError, match="ablate_mask must be Bool"):
        steering.RowEdits(ablate=dirs, ablate_mask=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="pass ablate"):
        steering.RowEdits(add=dirs, add_layer=torch.zeros(4, dtype=torch.long), ablate_mask=torch.ones(4, 5))


def _derivative(f, eps):
    d1, d2 = (f(eps) - f(-eps)) / (2 * eps), (f(eps / 2) - f(-eps / 2)) / eps
    return (4 * d2 - d1) / 3


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_first_order_estimate_at_the_post_instruction_tokens_matches_finite_differences(family):
    # llama in float64: its fp32 finite differences are noisy at this tolerance (3.16e-4 vs 3.06e-4 measured after a
    # transformers update); gemma2's tiny model gives NaN logits in float64 and passes in fp32
    m = tiny_model(family, n_layers=3, dtype=torch.float64 if family == "llama" else torch.float32)
    _, encs = prepare(m, PROMPTS)
    (b,) = batches(m, encs, len(encs))
    M, _, _ = ablation_moment(m, encs, TOKENS, batch_size=2, positions="post_instruction")
    M_all, _, _ = ablation_moment(m, encs, TOKENS, batch_size=2)
    torch.manual_seed(1)
    for r in torch.nn.functional.normalize(torch.randn(3, m.d_model, dtype=m.dtype), dim=-1):
        def score(a, r=r):
            lg = last_logits(m, b, _masked_hooks(m, r, b.post_mask, a))
            return refusal_score(lg, TOKENS).double().mean().item()

        fd = _derivative(score, eps=0.05)
        est = -float(r.double() @ M @ r.double())
        assert est == pytest.approx(fd, rel=1e-3, abs=1e-5), (est, fd)
        assert abs(est + float(r.double() @ M_all @ r.double())) > 1e-6   # not the every-token estimate
    # the KL probes count the same tokens: zero directions at no token give a zero estimate either way
    _, kl, _, _ = harmless_terms(m, encs, TOKENS, [1], torch.zeros(1, m.d_model), 2, probes=2,
                                 positions="post_instruction")
    assert float(kl[0]) == 0.0


def test_teacher_forced_kl_and_ce_ablate_the_response_tokens_too():
    """In generation a post-instruction ablation acts on every generated token: the teacher-forced CE of the
    responses must ablate the response tokens as well (the oracle: post_mask | response_mask)."""
    m = tiny_model("llama", n_layers=3)
    prompts, responses = PROMPTS[:3], ["yes it is", "a word", "sure thing here"]
    torch.manual_seed(2)
    r = torch.nn.functional.normalize(torch.randn(m.d_model), dim=-1)
    got = harmless_kl_ce(m, prompts, responses, (ablation(r, "post_instruction"),), batch_size=8)
    _, encs = prepare(m, prompts, responses=responses)
    (b,) = batches(m, encs, len(encs))
    with hooks(m, _masked_hooks(m, r, b.post_mask | b.response_mask)):
        lg = forward(m, b, logits="all")
    s, n = cross_entropy(lg, b.input_ids, b.response_mask)
    assert got["ce_edited"] == pytest.approx(s / n, abs=1e-5)
    assert got["ce_edited"] != pytest.approx(got["ce_baseline"], abs=1e-4)


# The toy organism reads refusal from the instruction tokens: no candidate passes the KL and induce filters
# when only the post-instruction tokens are ablated (measured: 0 of 8), so the end-to-end run turns both off to
# run every stage; the notes say so.
RELAXED = dict(kl_threshold=float("inf"), induce_threshold=float("-inf"))
SMALL = dict(model="organism", n_test=16, subspace_rank=2, max_new_tokens=8)


def post_run_prompts() -> list[str]:
    from interp.studies.kit.config import DataConfig
    from interp.studies.refusal import load_refusal_data

    return load_refusal_data("organism", DataConfig(n_test=SMALL["n_test"])).harmless["test"].instructions


@pytest.fixture(scope="module")
def post_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "post"
    return run_refusal(RefusalConfig.from_flat(ablate_positions="post_instruction", **SMALL, **RELAXED), out)


def test_pipeline_with_post_instruction_ablation_end_to_end(post_run):
    m = post_run.metrics
    assert m["selection"]["ablate_positions"] == "post_instruction"
    assert m["found_direction"], m["notes"]
    ev = m["evaluation"]
    # weights act on every token: the baked condition is the every-token ablation, checked against its hook
    eq = ev["hook_vs_baked"]
    assert eq["compared_with"] == "the every-token hook ablation" and eq["exact_architecture"]
    assert eq["rel_logit_diff"] < 1e-4 and "every token" in eq["notes"][-1]
    assert "harmful/baked weights" not in ev["refusal"] and "harmful/baked weights (every token)" in ev["refusal"]
    scores = post_run.evaluation.refusal_score  # the toy reads refusal from the instruction tokens (see above)
    assert scores["harmful/baked weights (every token)"] < scores["harmful/ablation"] - 0.5, scores
    assert {"harmful/ablation", "harmful/random ablation", "harmful/orthogonal ablation"} <= set(ev["refusal"])
    notes = " ".join(m["notes"])
    assert "post-instruction tokens and every generated token" in notes and "is off" in notes
    assert "post-instruction" in (post_run.out / "report.html").read_text()
    # the writers stage ablates at the same tokens: all its groups together equal the all-writers edit
    assert max(m["writers"]["checks"].values()) < 1e-4
    assert len(m["subspaces"]["rank"]) == 2
    # the KL / CE cost has a control: the evaluation's random direction (the run's seed) ablated the same way
    import interp
    from probes.directions import random_directions

    rand = random_directions(post_run.direction.vectors.shape[-1], 1, seed=0)[0].vectors[0]
    gens = post_run.evaluation.generations["harmless/baseline"]
    want = harmless_kl_ce(interp.load_model("organism"), post_run_prompts(), gens, (ablation(rand, "post_instruction"),))
    kc = ev["harmless_kl_ce"]
    assert kc["kl_first_response_token (random ablation)"] == pytest.approx(want["kl_first_response_token"], abs=1e-6)
    assert kc["ce_edited (random ablation)"] == pytest.approx(want["ce_edited"], abs=1e-6)
    # and the baked condition's cost: the selected direction ablated at every token
    every = harmless_kl_ce(interp.load_model("organism"), post_run_prompts(), gens, (ablation(post_run.direction.vectors[0], "all"),))
    assert kc["kl_first_response_token (every-token ablation)"] == pytest.approx(every["kl_first_response_token"], abs=1e-6)
    assert kc["kl_first_response_token (every-token ablation)"] != pytest.approx(kc["kl_first_response_token"], abs=1e-4)
    assert len(m["selection"]["kl_random"]) == 4 and min(m["selection"]["kl_random"]) > 0


def test_post_instruction_settings_and_cli(post_run, tmp_path):
    with pytest.raises(ValueError, match="ablate_positions must be one of"):
        SelectionConfig(ablate_positions="instruction")
    with pytest.raises(ValueError, match="save_model bakes the ablation"):
        RefusalConfig.from_flat(ablate_positions="post_instruction", save_model=True)
    a, b = RefusalConfig.from_flat(), RefusalConfig.from_flat(ablate_positions="post_instruction")
    assert a.run_identity() == b.run_identity()          # same folder: the stage keys decide what re-runs
    again = run_refusal(RefusalConfig.from_flat(ablate_positions="post_instruction", **SMALL, **RELAXED), post_run.out)
    assert not again.computed                                  # nothing re-runs on the same settings
    every = run_refusal(RefusalConfig.from_flat(**SMALL, **RELAXED), post_run.out)
    assert {"tokens", "candidates"}.isdisjoint(every.computed) and "scores" in every.computed
    # on the toy organism the every-token ablation bypasses far more (its refusal is read at the instruction)
    assert float(every.scores.bypass.nan_to_num(99).min()) < float(post_run.scores.bypass.nan_to_num(99).min()) - 3
    from interp.cli.refusal_job import add_refusal_parser

    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers()
    add_refusal_parser(sub, lambda p, default="organism": p.add_argument("--model", default=default))
    assert ap.parse_args(["refusal", "--ablate-positions", "post_instruction"]).ablate_positions == "post_instruction"
    with pytest.raises(SystemExit):
        ap.parse_args(["refusal", "--ablate-positions", "prompt"])


def test_a_null_every_token_run_points_to_the_post_instruction_ablation(tmp_path):
    """The default (auto) searches every token, then the post-instruction tokens, and says so; an explicit
    every-token run on the same folder reuses the every-token stages and points to the post-instruction ablation."""
    auto = run_refusal(RefusalConfig.from_flat(kl_threshold=1e-9, **SMALL), tmp_path / "null")
    assert not auto.found
    assert auto.computed[-3:] == ["estimate.post_instruction", "scores.post_instruction", "selection.post_instruction"]
    tried = auto.metrics["selection"]["ablation_search"]
    assert [t["ablate_positions"] for t in tried] == ["all", "post_instruction"] and not any(t["found"] for t in tried)
    assert auto.metrics["selection"]["ablate_positions"] == "post_instruction"
    assert any(n.startswith("ablation (auto)") and "found none there either" in n for n in auto.notes), auto.notes
    # why: the threshold lies below what ablating a random direction costs (said in the auto note and in metrics)
    assert all(len(t["kl_random"]) == 4 and min(t["kl_random"]) > 1e-9 for t in tried)
    assert any("random unit directions ablated the same way cost KL" in n and "lies below" in n for n in auto.notes)
    res = run_refusal(RefusalConfig.from_flat(kl_threshold=1e-9, ablate_positions="all", **SMALL), tmp_path / "null")
    assert res.computed == [] and not res.metrics["found_direction"]
    assert "ablation_search" not in res.metrics["selection"]
    hint = [n for n in res.metrics["notes"] if "--ablate-positions post_instruction" in n]
    assert len(hint) == 1 and "of the 6 candidates scored exactly pass the KL filter" in hint[0], hint  # 6 above the depth cut
    level = [n for n in res.metrics["notes"] if n.startswith("the KL filter's reference")]
    assert len(level) == 1 and "lies below the cost of ablating a random direction" in level[0], res.metrics["notes"]
    assert "KL of random directions" in (tmp_path / "null" / "report.html").read_text()
    post = run_refusal(RefusalConfig.from_flat(kl_threshold=1e-9, ablate_positions="post_instruction", **SMALL),
                       tmp_path / "null")
    assert post.computed == [] and not any("--ablate-positions post_instruction" in n for n in post.metrics["notes"])


def test_auto_falls_back_to_the_post_instruction_ablation_and_saves_no_model(tmp_path):
    """Layer 1 of the toy organism: no every-token candidate passes KL < 0.01 (measured 0.017 and 0.69), the
    post-instruction ablation of position -1 does (0.009, bypass below baseline); with the induce filter off,
    auto selects it there, evaluates it with that ablation, and saves no baked model (said in the notes): its baked
    condition is the every-token ablation, which is not the selected edit."""
    cfg = RefusalConfig.from_flat(layers=[1], kl_threshold=0.01, induce_threshold=float("-inf"), save_model=True,
                                  **SMALL)
    res = run_refusal(cfg, tmp_path / "auto")
    m = res.metrics
    assert m["found_direction"], m["notes"]
    assert [(t["ablate_positions"], t["found"]) for t in m["selection"]["ablation_search"]] == [
        ("all", False), ("post_instruction", True)]
    assert m["selection"]["ablate_positions"] == "post_instruction" and m["selection"]["layer"] == 1
    eq = m["evaluation"]["hook_vs_baked"]  # baked = the every-token ablation, checked against that hook only
    assert eq["compared_with"] == "the every-token hook ablation" and eq["rel_logit_diff"] < 1e-4
    assert m.get("saved_model") is None and not (tmp_path / "auto" / "model").exists()
    notes = " ".join(m["notes"])
    assert "and selected a direction there" in notes and "--save-model: no model saved" in notes
    assert "ablation (auto)" in (tmp_path / "auto" / "report.html").read_text()


def _saved_scores(out):
    import json

    from interp.studies.kit.stages import Scores
    from interp.studies.refusal.cache import load_stage

    folder = out / "stages" / "scores"
    return load_stage(folder, json.loads((folder / "meta.json").read_text())["key"], Scores)


def test_auto_skips_the_every_token_bypass_when_nothing_passes_kl_and_a_later_run_fills_it_in(tmp_path):
    """auto's every-token search scores the KL first; when no candidate passes it (KL < 0 here: none can), the
    bypass and induce are left unscored, the post-instruction search follows; a run that needs them (this mode
    alone, or a threshold some candidate passes) scores them then, the other stages reused."""
    out = tmp_path / "gate"
    auto = run_refusal(RefusalConfig.from_flat(kl_threshold=0.0, **SMALL), out)
    assert not auto.found and "scores.post_instruction" in auto.computed
    first = auto.metrics["selection"]["ablation_search"][0]
    assert not first["bypass_induce_scored"] and any("their bypass and induce were not scored" in n for n in auto.notes)
    skipped = _saved_scores(out)
    assert skipped.bypass.isnan().all() and skipped.induce.isnan().all()
    assert skipped.n_scored == int((~skipped.kl.isnan()).sum()) == 6  # the top 8 less the 2 below the depth cut
    alone = run_refusal(RefusalConfig.from_flat(kl_threshold=0.0, ablate_positions="all", **SMALL), out)
    assert alone.computed == ["scores", "selection"] and not alone.found
    filled = _saved_scores(out)
    assert torch.equal(filled.bypass.isnan(), filled.kl.isnan())
    torch.testing.assert_close(filled.kl, skipped.kl, atol=0, rtol=0, equal_nan=True)
    fresh = run_refusal(RefusalConfig.from_flat(kl_threshold=0.0, ablate_positions="all", **SMALL), tmp_path / "fresh")
    torch.testing.assert_close(_saved_scores(tmp_path / "fresh").bypass, filled.bypass, atol=1e-5, rtol=0,
                               equal_nan=True)
    assert fresh.metrics["selection"]["passing"] == alone.metrics["selection"]["passing"]
