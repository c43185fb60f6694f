"""Captured activations against independent oracles: HF hidden states, TransformerLens, nnsight."""

from __future__ import annotations

import pytest
import torch

from interp.capturing import capture
from interp.chat import format_prompts
from interp.positions import Positions
from interp.testing.tiny import FAMILIES
from interp.values import Prompts, Runtime

PROMPTS = ["the man said to the boy", "what is the good word", "help", "where is the old house by the water now ?"]


def _alone(model, prompt):
    text = format_prompts(model, [prompt])[0]
    ids = model.tokenizer(text, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        out = model.hf(**ids, output_hidden_states=True)
    return ids["input_ids"], out


@pytest.mark.parametrize("family", FAMILIES)
def test_residual_stream_equals_hf_hidden_states(tiny_models, family):
    """resid_pre[l] == hidden_states[l]; ln_final_out == hidden_states[L] (HF applies the final norm there)."""
    m = tiny_models(family)
    L = m.n_layers
    acts = capture(m, PROMPTS, sites=["resid_pre", "resid_post", "ln_final_out"], positions="all",
                   runtime=Runtime(progress=False))
    for i, p in enumerate(PROMPTS):
        ids, out = _alone(m, p)
        T = ids.shape[1]
        assert acts.mask[i].sum() == T and acts.mask[i, -T:].all()
        a = acts.tensor[i, :, -T:]
        for layer in range(L):
            torch.testing.assert_close(a[layer], out.hidden_states[layer][0], atol=1e-5, rtol=0)
        torch.testing.assert_close(a[2 * L], out.hidden_states[L][0], atol=1e-5, rtol=0)
        # resid_post of layer l is resid_pre of layer l+1
        for layer in range(L - 1):
            torch.testing.assert_close(a[L + layer], a[layer + 1], atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_sublayer_outputs_sum_to_residual(tiny_models, family):
    m = tiny_models(family)
    sites = ["resid_pre", "attn_out", "mlp_out", "resid_post"] + ([] if m.spec.parallel_residual else ["resid_mid"])
    d = capture(m, PROMPTS, sites=sites, positions="all", runtime=Runtime(progress=False))
    for layer in range(m.n_layers):
        total = d.site(f"resid_pre.{layer}") + d.site(f"attn_out.{layer}") + d.site(f"mlp_out.{layer}")
        torch.testing.assert_close(total, d.site(f"resid_post.{layer}"), atol=1e-5, rtol=0)
        if not m.spec.parallel_residual:
            mid = d.site(f"resid_pre.{layer}") + d.site(f"attn_out.{layer}")
            torch.testing.assert_close(mid, d.site(f"resid_mid.{layer}"), atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma2", "mixtral", "gpt_neox"])
def test_padded_batch_equals_alone(tiny_models, family):
    """A prompt's activations are the same alone and inside a left-padded batch (GPT-2 positions included)."""
    m = tiny_models(family)
    batch = capture(m, PROMPTS, sites="resid_post", positions="all",
                    runtime=Runtime(batch_size=4, progress=False))
    for i, p in enumerate(PROMPTS):
        alone = capture(m, [p], sites="resid_post", positions="all", runtime=Runtime(progress=False))
        T = int(alone.mask.sum())
        torch.testing.assert_close(batch.tensor[i, :, -T:], alone.tensor[0, :, -T:], atol=1e-5, rtol=0)
        last_b = capture(m, PROMPTS, sites="resid_post", positions="last",
                         runtime=Runtime(progress=False)).tensor[i]
        torch.testing.assert_close(last_b, alone.tensor[0, :, -1], atol=1e-5, rtol=0)


def test_gpt2_positions_are_not_shifted_by_padding(tiny_models):
    """Without position_ids from the mask, GPT-2 would give a padded prompt different absolute positions."""
    m = tiny_models("gpt2")
    short, long_ = "help", "where is the old house by the water now ?"
    both = capture(m, [short, long_], sites="resid_post.1", positions="last", runtime=Runtime(progress=False))
    alone = capture(m, [short], sites="resid_post.1", positions="last", runtime=Runtime(progress=False))
    torch.testing.assert_close(both.tensor[0], alone.tensor[0], atol=1e-5, rtol=0)
    # and the check has teeth: feeding the padded batch with default positions differs
    text = format_prompts(m, [short, long_])
    enc = m.tokenizer(text, add_special_tokens=False, padding=True, return_tensors="pt")
    with torch.no_grad():
        hs = m.hf(**enc, output_hidden_states=True).hidden_states[2][0, -1]
    assert (hs - alone.tensor[0, 0]).abs().max() > 1e-3


@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral", "qwen2"])
def test_matches_transformer_lens_run_with_cache(tiny_models, family):
    from interp.testing.oracles import transformer_lens_model

    m = tiny_models(family)
    tl = transformer_lens_model(m)
    sites = ["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out"]
    acts = capture(m, PROMPTS[:2], sites=sites, positions="all", runtime=Runtime(progress=False))
    for i, p in enumerate(PROMPTS[:2]):
        ids, out = _alone(m, p)
        T = ids.shape[1]
        with torch.no_grad():
            logits, cache = tl.run_with_cache(ids)
        torch.testing.assert_close(logits, out.logits, atol=1e-4, rtol=0)
        for s in acts.sites:
            torch.testing.assert_close(acts.site(s)[i, -T:], cache[s][0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2_moe", "gemma3_text"])
def test_matches_nnsight_trace(family):
    from interp.arch import get_module
    from interp.testing.oracles import nnsight_model
    from interp.testing.tiny import tiny_model

    m = tiny_model(family)  # a model of its own: nnsight leaves its wrapper hooks on the modules
    nn_model = nnsight_model(m)
    blocks = nn_model
    for part in m.spec.layers.split("."):
        blocks = getattr(blocks, part)
    acts = capture(m, PROMPTS[:1], sites=["resid_post", "mlp_out"], positions="all",
                   runtime=Runtime(progress=False))
    ids, _ = _alone(m, PROMPTS[0])
    saved: list = []
    mlps: list = []
    with torch.no_grad(), nn_model.trace(ids):
        for i in range(m.n_layers):  # nnsight needs module accesses in execution order
            mlps.append(get_module(blocks[i], m.spec.mlp_out).output.save())
            saved.append(blocks[i].output.save())
    T = ids.shape[1]
    for i in range(m.n_layers):
        out = saved[i][0] if isinstance(saved[i], tuple) else saved[i]
        mlp = mlps[i][0] if isinstance(mlps[i], tuple) else mlps[i]
        torch.testing.assert_close(acts.site(f"resid_post.{i}")[0, -T:], out[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(acts.site(f"mlp_out.{i}")[0, -T:], mlp[0], atol=1e-5, rtol=0)


def test_position_rules(tiny_models):
    m = tiny_models("llama")
    allp = capture(m, PROMPTS, sites="resid_post.1", positions="all", runtime=Runtime(progress=False))
    last = capture(m, PROMPTS, sites="resid_post.1", positions="last", runtime=Runtime(progress=False))
    torch.testing.assert_close(last.tensor, allp.tensor[:, :, -1])
    mean = capture(m, PROMPTS, sites="resid_post.1", positions=Positions("prompt_mean", skip_special=False),
                   runtime=Runtime(progress=False))  # every token, special ones included (by default the means skip them)
    manual = (allp.tensor * allp.mask[:, None, :, None]).sum(2) / allp.mask.sum(1)[:, None, None]
    torch.testing.assert_close(mean.tensor, manual, atol=1e-6, rtol=0)
    # the tiny chat template puts " <|end|><|assistant|>" after the instruction: two post-instruction tokens
    post = capture(m, PROMPTS, sites="resid_post.1", positions="post_instruction",
                   runtime=Runtime(progress=False))
    assert post.tensor.shape[2] == 2 and post.mask.all()
    torch.testing.assert_close(post.tensor, allp.tensor[:, :, -2:])
    explicit = capture(m, PROMPTS, sites="resid_post.1", positions=[-2, -1], runtime=Runtime(progress=False))
    torch.testing.assert_close(explicit.tensor, post.tensor)
    first = capture(m, PROMPTS, sites="resid_post.1", positions=0, runtime=Runtime(progress=False))
    for i in range(len(PROMPTS)):
        start = int((~allp.mask[i]).sum())
        torch.testing.assert_close(first.tensor[i], allp.tensor[i, :, start])


def test_response_mean(tiny_models):
    m = tiny_models("llama")
    prompts, responses = ["help me", "what is the word"], [" the old house", " water"]
    r = capture(m, Prompts(prompts, responses=responses), sites="resid_post.0", positions="response_mean",
                runtime=Runtime(progress=False))
    full = capture(m, Prompts(prompts, responses=responses), sites="resid_post.0", positions="all",
                   runtime=Runtime(progress=False))
    n_resp = [3, 1]
    for i, k in enumerate(n_resp):
        torch.testing.assert_close(r.tensor[i, 0], full.tensor[i, 0, -k:].mean(0), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="responses"):
        capture(m, prompts, sites="resid_post.0", positions="response_mean", runtime=Runtime(progress=False))


def test_dtype_control_and_labels(tiny_models):
    m = tiny_models("qwen2")
    acts = capture(m, Prompts(PROMPTS, labels=[1, 0, 1, 0]), sites="resid_post",
                   runtime=Runtime(dtype=torch.bfloat16, progress=False))
    assert acts.tensor.dtype == torch.bfloat16 and acts.labels == [1, 0, 1, 0]
    assert acts.sites == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    assert acts[[0, 2]].labels == [1, 1]
    acts.tensor -= 1  # a normal tensor (not an inference-mode one): editable in place


def test_early_stop_matches_full_forward(tiny_models):
    """Stopping the forward after the last requested site gives the same numbers as a full pass."""
    from interp.capturing import run_batch
    from interp.forward import batches, prepare
    from interp.sites import expand_sites

    m = tiny_models("llama")
    _, encs = prepare(m, PROMPTS)
    b = batches(m, encs, 4)[0]
    sites = expand_sites("resid_post.0", m.n_layers)
    early, _, logits = run_batch(m, b, sites, "last", torch.float32)
    full, _, logits2 = run_batch(m, b, sites, "last", torch.float32, need_logits=True)
    assert logits is None and logits2 is not None
    torch.testing.assert_close(early, full, atol=0, rtol=0)
