"""Attention sites (q, k, v, rot_q, rot_k, scores, pattern) against HF eager attention and TransformerLens."""

from __future__ import annotations

import pytest
import torch

import interp
from interp.attention import expand_kv
from interp.capturing import capture
from interp.forward import batch_of
from interp.testing.oracles import TL_FAMILIES, transformer_lens_model
from interp.testing.tiny import FAMILIES, MOE_FAMILIES, tiny_model
from interp.values import Runtime

PROMPTS = ["the man said to the boy", "help", "where is the old house by the water now ?"]
QUIET = Runtime(progress=False)
ALL_FAMILIES = tuple(dict.fromkeys(FAMILIES + MOE_FAMILIES))


def eager_patterns(model, eager_hf, prompts):
    """HF's own eager attention weights ``[layers][b, H, T, T]`` on the padded batch capture runs, and the batch."""
    batch = batch_of(model, prompts)
    with torch.no_grad():
        out = eager_hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids, output_attentions=True)
    return out.attentions, batch


def check_pattern_against_eager(model, eager_hf, prompts, atol=1e-5):
    ref, batch = eager_patterns(model, eager_hf, prompts)
    acts = capture(model, prompts, sites="pattern", positions="all", runtime=QUIET)
    T = batch.input_ids.shape[1]
    lengths = batch.attention_mask.sum(1).tolist()
    assert acts.meta["key_lengths"] == lengths
    err = 0.0
    for layer in range(model.n_layers):
        got = acts.site_view(f"pattern.{layer}")  # [n, P, H, K], queries left-padded, keys left-aligned
        for r, L in enumerate(lengths):
            want = ref[layer][r, :, T - L:, T - L:].transpose(0, 1)  # [L, H, L]
            g = got[r, got.shape[1] - L:, :, :L]
            err = max(err, (g - want).abs().max().item())
            assert not got[r, :, :, L:].any()  # keys past the prompt are zero
    assert err <= atol, err
    return err


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_pattern_equals_hf_eager_on_padded_batch(tiny_models, family):
    m = tiny_models(family)
    eager = tiny_model(family, attn_implementation="eager")
    before = m.hf.config._attn_implementation
    check_pattern_against_eager(m, eager.hf, PROMPTS)
    assert m.hf.config._attn_implementation == before


def _ours(model, prompt, sites):
    got = {}
    hooks = {s: (lambda name: lambda x, ctx: got.__setitem__(name, x.detach().clone()))(s) for s in sites}
    batch = batch_of(model, [prompt], chat=False)
    with torch.no_grad(), interp.hooks(model, hooks):
        model.hf(input_ids=batch.input_ids)
    return got, batch.input_ids


TL_SITES = ("hook_q", "hook_k", "hook_v", "hook_rot_q", "hook_rot_k", "hook_attn_scores", "hook_pattern")


@pytest.mark.parametrize("family", TL_FAMILIES)
def test_every_attention_site_equals_transformer_lens(tiny_models, family):
    m = tiny_models(family)
    tl = transformer_lens_model(m)
    names = [f"blocks.{i}.attn.{s}" for i in range(m.n_layers) for s in TL_SITES
             if f"blocks.{i}.attn.{s}" in tl.hook_dict]
    assert any("rot_q" in n for n in names) == (family != "gpt2")
    got, ids = _ours(m, PROMPTS[2], names)
    with torch.no_grad():
        _, cache = tl.run_with_cache(ids)
    for name in names:
        ours, theirs = got[name], cache[name]
        if name.endswith(("hook_attn_scores", "hook_pattern")):
            causal = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).tril()
            ours, theirs = ours[..., causal], theirs[..., causal]  # TL masks with -inf, HF with the dtype minimum
        assert ours.shape == theirs.shape, name
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0, msg=name)


def test_expand_kv_matches_grouped_query_heads(tiny_models):
    m = tiny_models("llama")
    assert m.n_kv_heads < m.n_heads
    got, _ = _ours(m, PROMPTS[0], ["k.0", "rot_k.0"])
    assert got["k.0"].shape[-2] == m.n_kv_heads
    full = expand_kv(got["rot_k.0"], m.n_heads)
    g = m.n_heads // m.n_kv_heads
    for h in range(m.n_heads):
        assert torch.equal(full[..., h, :], got["rot_k.0"][..., h // g, :])


def test_capturing_pattern_leaves_other_sites_and_implementation_alone(tiny_models):
    m = tiny_models("qwen3")
    impl = m.hf.config._attn_implementation
    before = capture(m, PROMPTS, sites="resid_post", positions="all", runtime=QUIET)
    capture(m, PROMPTS, sites="pattern", positions="last", runtime=QUIET)
    assert m.hf.config._attn_implementation == impl
    after = capture(m, PROMPTS, sites="resid_post", positions="all", runtime=QUIET)
    assert torch.equal(before.tensor, after.tensor)
    with pytest.raises(RuntimeError, match="user code"):
        with interp.hooks(m, {"scores.1": lambda x, ctx: None}):
            assert m.hf.config._attn_implementation == interp.attention.IMPL
            raise RuntimeError("user code")
    assert m.hf.config._attn_implementation == impl
    assert interp.attention._ACTIVE == {} and interp.attention._SWITCHED == {}


def test_last_position_gives_last_query_row(tiny_models):
    m = tiny_models("gemma2")
    every = capture(m, PROMPTS, sites="pattern.1", positions="all", runtime=QUIET)
    last = capture(m, PROMPTS, sites="pattern.1", positions="last", runtime=QUIET)
    K = max(every.meta["key_lengths"])
    assert last.site_view("pattern.1").shape == (len(PROMPTS), m.n_heads, K)
    torch.testing.assert_close(last.site_view("pattern.1"), every.site_view("pattern.1")[:, -1], atol=0, rtol=0)
    sub = last[[2, 0]]
    assert sub.meta["key_lengths"] == [last.meta["key_lengths"][2], last.meta["key_lengths"][0]]


def test_bad_sites_and_memory_name_the_fix(tiny_models):
    m = tiny_models("llama")
    with pytest.raises(ValueError, match="nearest supported site is 'blocks.0.attn.hook_"):
        capture(m, PROMPTS, sites="blocks.0.attn.hook_result", runtime=QUIET)
    for bad in ("blocks.0.hook_attn_in", "blocks.1.attn.hook_q_input"):
        with pytest.raises(ValueError, match="nearest supported site"):
            interp.sites.parse_site(bad)
    with pytest.raises(ValueError, match="out of range"):
        capture(m, PROMPTS, sites=f"pattern.{m.n_layers}", runtime=QUIET)
    long = [list(range(5, 5 + 3000))] * 8
    with pytest.raises(ValueError, match=r"GiB.*row rule"):
        capture(m, long, sites="pattern", positions="all", runtime=QUIET)


@pytest.mark.slow
def test_smollm2_pattern_equals_hf_eager():
    m = interp.load_model("smollm2-135m-instruct")
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_config(m.hf.config, attn_implementation="eager", dtype=m.dtype)
    eager.load_state_dict(m.hf.state_dict())
    eager.eval()
    check_pattern_against_eager(m, eager, ["The capital of France is", "Hi"])


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text", "mistral"])
def test_pattern_equals_hf_eager_with_a_short_sliding_window(family):
    """A window of 4 tokens, shorter than the prompts, so the sliding mask really cuts keys."""
    m = tiny_model(family, sliding_window=4)
    eager = tiny_model(family, attn_implementation="eager", sliding_window=4)
    check_pattern_against_eager(m, eager.hf, PROMPTS)
    acts = capture(m, PROMPTS[2:], sites="pattern.0", positions="last", runtime=QUIET)
    assert (acts.site_view("pattern.0")[0, :, :-4] == 0).all()  # layer 0 slides: only the last 4 keys are read
