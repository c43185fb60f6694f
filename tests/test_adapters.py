"""A researcher's own TransformerLens / nnsight model through the toolkit: capture, probes and steering
on tiny models built from configs (no download), checked against each library's own view."""

from __future__ import annotations

import pytest
import torch

import interp
import probes
import steering
from interp.adapters import from_nnsight, from_transformer_lens
from interp.capturing import capture
from interp.chat import format_prompts
from interp.testing.oracles import transformer_lens_model
from interp.testing.tiny import tiny_model
from interp.values import Prompts, Runtime

PROMPTS = ["the man said to the boy", "help", "what is the good word", "where is the old house by the water now ?"]
SITES = ["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out"]


def _ids(model, prompt: str) -> torch.Tensor:
    text = format_prompts(model, [prompt])[0]
    return model.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def tl_pair(request):
    """(HF model, HookedTransformer holding the same weights, adapter over the HookedTransformer)."""
    m = tiny_model(request.param)
    tl = transformer_lens_model(m)
    return m, tl, from_transformer_lens(tl, m.tokenizer)


def test_tl_capture_equals_run_with_cache_and_hf(tl_pair):
    """Mixed-length padded batch through the adapter == TL's own cache per prompt == our HF capture."""
    m, tl, a = tl_pair
    acts = capture(a, PROMPTS, sites=SITES + ["ln_final"], positions="all", runtime=Runtime(progress=False))
    ours = capture(m, PROMPTS, sites=SITES + ["ln_final"], positions="all", runtime=Runtime(progress=False))
    neurons = capture(a, PROMPTS, sites="mlp_post", positions="all", runtime=Runtime(progress=False))
    for i, p in enumerate(PROMPTS):
        ids = _ids(m, p)
        T = ids.shape[1]
        with torch.no_grad():
            _, cache = tl.run_with_cache(ids)
        for s in acts.sites + neurons.sites:
            got = (acts if s in acts.sites else neurons).site(s)[i, -T:]
            torch.testing.assert_close(got, cache[s][0], atol=1e-5, rtol=0)
    for s in ours.sites:
        torch.testing.assert_close(acts.site(s), ours.site(s), atol=1e-5, rtol=0)
    out_tl, out_hf = (capture(x, PROMPTS, sites="ln_final_out", positions="all",
                              runtime=Runtime(progress=False)) for x in (a, m))
    torch.testing.assert_close(out_tl.tensor, out_hf.tensor, atol=1e-5, rtol=0)  # after the gain, both routes


def test_tl_steering_changes_tl_output_as_on_hf(tl_pair):
    m, tl, a = tl_pair
    ids = _ids(m, PROMPTS[0])
    v = torch.randn(m.d_model, generator=torch.Generator().manual_seed(0))
    iv = steering.AddVector(v, layers=1, alpha=3.0, sites=("resid_pre", "resid_mid", "resid_post"))
    with torch.no_grad():
        plain = tl(ids)
        with steering.apply(a, iv):
            on_tl = tl(ids)
        with steering.apply(m, iv):
            on_hf = m.hf(ids).logits
    assert (on_tl - plain).abs().max() > 1e-2
    torch.testing.assert_close(on_tl, on_hf, atol=1e-5, rtol=0)
    torch.testing.assert_close(tl(ids), plain, atol=0, rtol=0)  # hooks are gone after the block


def test_tl_probe_fit_equals_hf(tl_pair):
    m, _, a = tl_pair
    labels = [1, 0, 1, 0]
    d_tl = probes.diff_of_means(capture(a, Prompts(PROMPTS, labels=labels), sites="resid_post",
                                        runtime=Runtime(progress=False)))
    d_hf = probes.diff_of_means(capture(m, Prompts(PROMPTS, labels=labels), sites="resid_post",
                                        runtime=Runtime(progress=False)))
    assert d_tl.sites == d_hf.sites
    torch.testing.assert_close(d_tl.raw, d_hf.raw, atol=1e-5, rtol=0)


def test_tl_limits_are_clear_errors(tl_pair):
    m, tl, a = tl_pair
    assert not any(s.endswith("hook_z") for s in a.site_names())
    with pytest.raises(ValueError, match="attn_z through the TransformerLens adapter"):
        capture(a, PROMPTS[:1], sites="attn_z.0", runtime=Runtime(progress=False))
    with pytest.raises(NotImplementedError, match="own `generate` inside"):
        steering.generate(a, PROMPTS[:1], max_new_tokens=2, runtime=interp.Runtime(progress=False))
    with pytest.raises(TypeError, match="HookedTransformer"):
        from_transformer_lens(m.hf)


def test_nnsight_capture_and_steering_inside_trace():
    from nnsight import NNsight

    m = tiny_model("llama")
    lm = NNsight(m.hf)
    a = from_nnsight(lm, tokenizer=m.tokenizer)
    assert a.hf is m.hf
    for s_a, s_m in zip(capture(a, PROMPTS, sites=SITES, positions="all",
                                runtime=Runtime(progress=False)).tensor,
                        capture(m, PROMPTS, sites=SITES, positions="all",
                                runtime=Runtime(progress=False)).tensor):
        torch.testing.assert_close(s_a, s_m, atol=0, rtol=0)
    ids = _ids(m, PROMPTS[0])
    v = torch.randn(m.d_model, generator=torch.Generator().manual_seed(1))
    iv = steering.AddVector(v, layers=0, alpha=3.0)
    with torch.no_grad():
        with steering.apply(m, iv):
            steered_hf = m.hf(ids).logits
        with steering.apply(a, iv), lm.trace(ids):
            out = lm.output.save()
        with lm.trace(ids):
            plain = lm.output.save()
    logits = out.logits if hasattr(out, "logits") else out[0]
    plain = plain.logits if hasattr(plain, "logits") else plain[0]
    torch.testing.assert_close(logits, steered_hf, atol=0, rtol=0)
    assert (plain - steered_hf).abs().max() > 1e-2


def test_nnsight_language_model_and_errors():
    from nnsight import LanguageModel

    m = tiny_model("llama")
    with pytest.warns(Warning):
        lm = LanguageModel(m.hf, tokenizer=m.tokenizer)
    a = from_nnsight(lm)
    assert a.hf is m.hf and a.tokenizer is m.tokenizer
    with pytest.raises(TypeError, match="nnsight model wrapping an HF causal LM"):
        from_nnsight(object())
