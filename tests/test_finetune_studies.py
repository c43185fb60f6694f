"""The fine-tune studies (transplant, SAE model diffing) on the toy organism and its base: real models, small splits."""

from __future__ import annotations

import json

import pytest
import torch

from interp.capturing import capture
from interp.models import load_model
from interp.studies.finetune.diffing import DiffConfig, diff_study
from interp.studies.finetune.transplant import TransplantConfig, transplant_study
from interp.studies.kit.config import DataConfig
from interp.studies.kit.prompt_sets import load_refusal_data
from interp.values import Runtime
from sae.model import SAE, SAEConfig


@pytest.fixture(scope="module")
def pair():
    return load_model("organism-base"), load_model("organism")


@pytest.fixture(scope="module")
def data():
    return load_refusal_data("organism", DataConfig(n_train=16, n_val=16, n_test=16))


@pytest.fixture(scope="module")
def study(pair, data):
    base, aligned = pair
    return transplant_study(base, aligned, data,
                            config=TransplantConfig(block_size=1, max_steps=2, n_random=1, max_new_tokens=8))


def test_transplant_study_scores_are_one_score(study, pair):
    """Each single block's gain, the greedy search's first step and the baselines come from the same score: the
    search's first pick is the single scan's best block, at the same value; all weights are restored."""
    s = study.scores
    assert s["aligned"] > s["base"] + 1.0, "the aligned organism should refuse harmful prompts far more than its base"
    assert study.search.baseline == pytest.approx(s["base"], abs=1e-6)
    best = max(study.single, key=lambda r: r["into_base"])
    first = study.search.trajectory[0]
    assert first["score"] == pytest.approx(s["base"] + best["into_base"], abs=1e-5)
    assert (first["part"], first["layers"]) == (best["part"], best["layers"])
    assert study.search.source_score == pytest.approx(s["aligned"], abs=1e-6)
    base, aligned = pair
    fresh = load_model("organism-base")
    assert all(torch.equal(a, b) for a, b in zip(base.hf.state_dict().values(), fresh.hf.state_dict().values()))


def test_transplant_study_validates_by_generation_with_controls(study, data):
    rows = {(r["condition"], r["split"]): r for r in study.rates}
    n = len(data.harmful["test"])
    assert rows[("aligned", "harmful")]["k"] > rows[("base", "harmful")]["k"]
    assert all(r["n"] == n and r["ci95"][0] <= r["rate"] <= r["ci95"][1] for r in study.rates)
    assert ("base + random changed aligned blocks (draw 0)", "harmful") in rows
    drawn = rows[("base + random changed aligned blocks (draw 0)", "harmful")]["blocks"]
    found_layers = {(p, la) for ls, p in study.found for la in ls}
    assert not {(b.split(":")[0], int(la)) for b in drawn for la in b.split(":")[1].split(",")} & found_layers
    found = rows[("base + found aligned blocks", "harmful")]["blocks"]
    assert len(found) == len({p for _, p in study.found}) and found
    assert set(study.to_frame("single").columns) >= {"part", "block", "into_base", "out_of_aligned"}
    assert len(study.plot().data) == 1
    s = study.summary()
    json.dumps(s, allow_nan=True)   # JSON-ready
    best = max(study.single, key=lambda r: r["into_base"])
    assert s["best_into_base"] == {"block": f"{best['part']}:{best['block']}", "gain": best["into_base"]}
    assert s["scores"] == study.scores and s["search_best"] == study.search.best
    assert s["rates"]["aligned/harmful"]["k"] == rows[("aligned", "harmful")]["k"] and len(s["rates"]) == len(rows)
    assert len(s["found"]) == len(study.found)


def test_differs_sees_which_blocks_a_fine_tune_changed(pair):
    from interp.patching.transplants import differs

    base, aligned = pair
    assert differs(base, aligned, [0], ["mlp"]) and not differs(base, load_model("organism-base"), [0, 1], ["attn"])


def test_transplant_study_bad_input(pair, data):
    from interp.testing.tiny import tiny_model

    base, aligned = pair
    with pytest.raises(ValueError, match="block_size"):
        transplant_study(base, aligned, data, config=TransplantConfig(block_size=0))
    with pytest.raises(ValueError):
        transplant_study(tiny_model("llama"), aligned, data)
    with pytest.raises(ValueError, match="refused none"):
        transplant_study(base, base, data)


@pytest.fixture(scope="module")
def diff(pair, data):
    base, aligned = pair
    return diff_study(base, aligned, data, layer=2,
                      config=DiffConfig(d_sae=128, k=8, n_steer=4, top=8, n_random=1, max_new_tokens=8,
                                        strengths=(1.0, 8.0)))


def test_diff_study_ranks_the_change_by_hand(diff, pair, data):
    """The ranking's change equals the SAE's mean code in the tuned model minus that in the base, computed here
    from a plain capture of the val prompts' last token."""
    base, aligned = pair
    site = diff.meta["site"]
    val = data.harmful["val"].instructions
    z = {n: diff.sae.encode(capture(m, val, sites=[site], positions="last",
                                    runtime=Runtime(progress=False)).tensor[:, 0].reshape(
        len(val), -1)).mean(0) for n, m in (("base", base), ("tuned", aligned))}
    assert torch.allclose(diff.diff.delta, z["tuned"] - z["base"], atol=1e-5)
    assert diff.top == diff.diff.delta.argsort(descending=True)[:4].tolist()
    x = capture(base, val, sites=[site], positions="last", runtime=Runtime(progress=False)).tensor[:,
                0].reshape(len(val), -1)
    with torch.no_grad():
        x_hat = diff.sae(x)
    by_hand = float(((x - x_hat) ** 2).sum() / ((x - x.mean(0)) ** 2).sum())
    assert diff.meta["fit"]["fvu_base"] == pytest.approx(by_hand, rel=1e-4)
    assert diff.meta["fit"]["l0_base"] == pytest.approx(float((diff.sae.encode(x) != 0).sum(-1).float().mean()))
    assert all(diff.contexts[i] for i in diff.top)


def test_diff_study_steers_both_ways_with_controls(diff, data):
    conds = {r["condition"] for r in diff.rates}
    assert {"tuned", "tuned, top latents ablated", "base", "base, top latents added x1", "base, top latents added x8",
            "tuned, random latents ablated (draw 0)", "base, random latents added x8 (draw 0)"} <= conds
    rand = next(r for r in diff.rates if r["condition"].startswith("tuned, random"))
    assert not set(rand["latents"]) & set(diff.top)
    frame = diff.to_frame("latents")
    assert len(frame) == 8 and "context" in frame.columns and frame["latent"].tolist()[:4] == diff.top
    bars = diff.plot().data[0]
    assert list(bars.x) == [f"{r['condition']} ({r['split']})" for r in diff.rates]
    assert list(bars.y) == pytest.approx([100 * r["rate"] for r in diff.rates])
    s = diff.summary()
    json.dumps(s, allow_nan=True)   # JSON-ready
    assert s["top"] == diff.top and s["top_scores"] == pytest.approx(diff.diff.ranking.scores[:4].tolist())
    assert s["rates"]["tuned/harmful"]["n"] == next(r["n"] for r in diff.rates if r["condition"] == "tuned")
    assert set(s["rates"]) == {f"{r['condition']}/{r['split']}" for r in diff.rates} and s["layer"] == 2


def test_sae_training_rows_leave_out_each_prompts_first_token():
    from interp.positions import without_first

    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]])
    assert without_first(mask).int().tolist() == [[0, 0, 0, 1, 1], [0, 1, 1, 1, 1], [0, 0, 0, 0, 0],
                                                  [0, 1, 0, 0, 0], [0, 0, 0, 0, 0]]


def test_diff_study_bad_input(pair, data):
    base, aligned = pair
    with pytest.raises(ValueError, match="out of range"):
        diff_study(base, aligned, data, layer=99)
    wrong = SAE(SAEConfig(d_in=base.d_model + 1, d_sae=16, arch="relu"))
    with pytest.raises(ValueError, match="width"):
        diff_study(base, aligned, data, layer=1, sae=wrong)
