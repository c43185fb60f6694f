"""The crosscoder diffing study end to end on two tiny random models (a model and a perturbed copy): classes,
chosen latents, matched random draws and the steering conditions with their intervals and tests."""

from __future__ import annotations

import copy

import pytest
import torch

from interp.studies.finetune.crossdiff import CrossDiffConfig, crossdiff_study, training_prompts
from interp.studies.kit.prompt_sets import PromptSplit, RefusalData
from interp.testing.tiny import tiny_model
from interp.values import Runtime
from sae.crosscoder import capture_paired, train_crosscoder
from sae.train_config import TrainConfig


def _data() -> RefusalData:
    def split(tag: str, n: int) -> PromptSplit:
        return PromptSplit([f"{tag} request {i}: {'please ' * (i % 3)}do it" for i in range(n)])

    return RefusalData(harmful={s: split(f"bad {s}", 4) for s in ("train", "val", "test")},
                       harmless={s: split(f"good {s}", 4) for s in ("train", "val", "test")}, source={})


def test_crossdiff_study_on_tiny_models():
    base = tiny_model("llama", seed=0)
    tuned = copy.deepcopy(base)
    with torch.no_grad():
        for p in tuned.hf.model.layers[1].parameters():
            p.add_(0.1 * torch.randn_like(p))
    tuned.name = "tiny-llama-tuned"
    site = "blocks.1.hook_resid_post"
    prompts = [f"training prompt {i} {'word ' * (i % 7)}" for i in range(40)]
    pairs = capture_paired((base, tuned), prompts, site, runtime=Runtime(batch_size=8, progress=False))
    res = train_crosscoder(pairs, TrainConfig(arch="crosscoder_batchtopk", d_sae=64, k=4, total_tokens=40 * 64,
                                              batch_size=64, lr=3e-3, progress=False))
    x = pairs.tensor[:, 0][pairs.kept(pairs.sites, "exclude")]
    d = base.d_model
    cfg = CrossDiffConfig(n_steer=3, n_random=2, strengths=(1.0,), max_new_tokens=3)
    st = crossdiff_study((base, tuned), res.sae, (x[:, :d], x[:, d:]), _data(), config=cfg)
    assert len(st.chosen) == 3 and len(st.meta["chosen_classes"]) == 3
    assert all(len(set(dr) & set(st.chosen)) == 0 and len(dr) == 3 for dr in st.meta["draws"])
    conds = [r["condition"] for r in st.rates]
    assert conds[:2] == ["tuned", "tuned, chosen latents subtracted"] and "base, chosen latents added x1" in conds
    assert len(conds) == 2 + 2 + 1 + 1 + 2
    assert all(0 <= r["rate"] <= 1 and r["ci95"][0] <= r["rate"] <= r["ci95"][1] for r in st.rates)
    assert [t["hypothesis"] for t in st.meta["tests"]] == ["random refuse more", "chosen refuse more"]
    assert st.summary()["chosen"] == st.chosen and len(st.to_frame()) == len(st.rates)


def test_training_prompts_hold_out_the_judged_prompts():
    from interp.studies.kit.prompt_sets import load_refusal_data

    data = load_refusal_data("smollm2-aligned")
    ps = training_prompts(data, 200, seed=0)
    held = set(data.harmful["test"].instructions) | set(data.harmless["val"].instructions)
    assert len(ps) == len(set(ps)) == 200 and not held & set(ps)
    assert ps == training_prompts(data, 200, seed=0) != training_prompts(data, 200, seed=1)
    with pytest.raises(ValueError, match="outside the val/test splits"):
        training_prompts(data, 10 ** 6)
