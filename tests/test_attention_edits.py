"""Edits inside attention: replacing scores / pattern / q / k / v through interp.hooks, checked by hand."""

from __future__ import annotations

import pytest
import torch

import interp
from interp.attention import expand_kv, knockout
from interp.forward import batch_of

PROMPTS = ["the man said to the boy", "help me", "where is the old house by the water now ?"]


def _run(model, batch, hooks):
    got = {}

    def keep(name):
        return lambda x, ctx: got.__setitem__(name, x.detach().clone())

    spec = list(hooks) + [(s, keep(s)) for s in ("pattern.1", "v.1", "attn_z.1")]
    with torch.no_grad(), interp.hooks(model, spec):
        out = model.hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids).logits
    return got, out


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2"])
def test_knockout_of_key_zero_equals_renormalised_pattern(tiny_models, family):
    m = tiny_models(family)
    batch = batch_of(m, PROMPTS)
    clean, clean_logits = _run(m, batch, [])
    ko, ko_logits = _run(m, batch, list(knockout(1, heads=None, queries=None, keys=0).items()))
    starts = (batch.attention_mask.shape[1] - batch.attention_mask.sum(1)).tolist()
    p, v = clean["pattern.1"], clean["v.1"]
    for r, s in enumerate(starts):
        want = p[r, :, s:, :].clone()
        want[..., s] = 0.0
        want = want / want.sum(-1, keepdim=True)
        want[:, 0] = p[r, :, s]  # the first token has only itself to attend to: left as it was
        got = ko["pattern.1"][r, :, s:, :]
        rows = slice(1, None)
        torch.testing.assert_close(got[:, rows], want[:, rows], atol=1e-5, rtol=0)
        # the head outputs are the renormalised pattern times v (per query head), computed by hand
        vr = expand_kv(v[r], m.n_heads).transpose(0, 1)  # [H, T, d]
        z = torch.matmul(want, vr).transpose(0, 1)  # [T', H, d]
        torch.testing.assert_close(ko["attn_z.1"][r, s + 1:], z[1:], atol=1e-5, rtol=0)
    assert not torch.allclose(clean_logits, ko_logits)


def test_pattern_replacement_is_used(tiny_models):
    """A hook on pattern that returns uniform attention over the prompt gives z = mean of v."""
    m = tiny_models("qwen3")
    batch = batch_of(m, [PROMPTS[0]])
    T = batch.input_ids.shape[1]
    uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]
    got, _ = _run(m, batch, [("pattern.1", lambda x, ctx: uniform.expand_as(x).to(x.dtype))])
    v = expand_kv(got["v.1"][0], m.n_heads)  # [T, H, d]
    want = torch.cumsum(v, 0) / torch.arange(1, T + 1)[:, None, None]
    torch.testing.assert_close(got["attn_z.1"][0], want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["llama", "phi3", "gpt_neox", "gpt2", "olmo2"])
def test_patched_qkv_from_run_a_reproduce_its_attention_output(tiny_models, family):
    m = tiny_models(family)
    a = batch_of(m, ["the man said to the boy"], chat=False)
    b = batch_of(m, ["where is the old house by"], chat=False)
    assert a.input_ids.shape == b.input_ids.shape
    run_a, _ = _run(m, a, [])
    src = {}
    for s in ("q.1", "k.1", "v.1"):
        with torch.no_grad(), interp.hooks(m, {s: lambda x, ctx, s=s: src.__setitem__(s, x.clone())}):
            m.hf(input_ids=a.input_ids)
    patched, _ = _run(m, b, [(s, lambda x, ctx, s=s: src[s]) for s in src])
    run_b, _ = _run(m, b, [])
    torch.testing.assert_close(patched["attn_z.1"], run_a["attn_z.1"], atol=1e-5, rtol=0)
    assert not torch.allclose(run_b["attn_z.1"], run_a["attn_z.1"], atol=1e-3)
    # q alone from A: the pattern becomes softmax(q_A k_B) -- it moves, and differs from both runs
    with torch.no_grad():
        q_only, _ = _run(m, b, [("q.1", lambda x, ctx: src["q.1"])])
    assert not torch.allclose(q_only["pattern.1"], run_b["pattern.1"], atol=1e-4)
