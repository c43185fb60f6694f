"""Sites that mean what TransformerLens means (``ln_final.hook_normalized`` before the gain) and sites wider or
narrower than the residual (per-head ``attn_z``, neuron ``mlp_post``) through capture, store and probes."""

from __future__ import annotations

import pytest
import torch

from interp.capturing import capture
from interp.forward import prepare
from interp.hooking import hooks
from interp.testing.oracles import transformer_lens_model
from interp.testing.tiny import FAMILIES, tiny_model
from interp.values import Prompts, Runtime

PROMPTS = ["the man said to the boy", "what is the good word", "help", "where is the old house by the water now ?"]


def _ids(m, p):
    return torch.tensor([prepare(m, [p])[1][0].ids])


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_ln_final_equals_transformer_lens_before_gain(family):
    """Read and write: our HF route at ln_final.hook_normalized == TransformerLens's run_with_cache / hooks."""
    m = tiny_model(family)
    tl = transformer_lens_model(m)
    acts = capture(m, PROMPTS, sites="ln_final", positions="all", runtime=Runtime(progress=False))
    for i, p in enumerate(PROMPTS):
        ids = _ids(m, p)
        with torch.no_grad():
            _, cache = tl.run_with_cache(ids)
            theirs = tl.run_with_hooks(ids, fwd_hooks=[("ln_final.hook_normalized", lambda x, hook: 2 * x + 0.5)])
            with hooks(m, {"ln_final.hook_normalized": lambda x, ctx: 2 * x + 0.5}):
                ours = m.hf(ids).logits
        torch.testing.assert_close(acts.site("ln_final")[i, -ids.shape[1]:], cache["ln_final.hook_normalized"][0],
                                   atol=1e-5, rtol=0)
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def _eps(c):
    return next(float(getattr(c, a)) for a in ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps") if hasattr(c, a))


@pytest.mark.parametrize("family", FAMILIES)
def test_ln_final_is_the_normalised_input_in_every_family(tiny_models, family):
    """ln_final == the final norm's input centred (LayerNorm) and divided by its RMS; ln_final_out is the output
    (gemma's 1 + weight gain included); writing ln_final back unchanged leaves the logits as they were."""
    m = tiny_models(family)
    a = capture(m, PROMPTS, sites=[f"resid_post.{m.n_layers - 1}", "ln_final"], positions="all",
                runtime=Runtime(progress=False))
    x = a.tensor[:, 0]
    if family in ("gpt2", "gpt_neox"):
        x = x - x.mean(-1, keepdim=True)
    want = x / (x.pow(2).mean(-1, keepdim=True) + _eps(m.config)).sqrt()
    keep = a.mask[..., None]
    torch.testing.assert_close(a.tensor[:, 1] * keep, want * keep, atol=1e-5, rtol=0)
    ids = _ids(m, PROMPTS[0])
    with torch.no_grad():
        base = m.hf(ids).logits
        with hooks(m, {"ln_final": lambda n, ctx: n * 1.0}):
            same = m.hf(ids).logits
    torch.testing.assert_close(same, base, atol=1e-5, rtol=0)


def test_gemma_gain_is_one_plus_weight(tiny_models):
    m = tiny_models("gemma3_text")
    a = capture(m, PROMPTS, sites=["ln_final", "ln_final_out"], positions="last",
                runtime=Runtime(progress=False))
    w = m.module(m.spec.final_norm).weight
    torch.testing.assert_close(a.tensor[:, 0] * (1 + w), a.tensor[:, 1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("positions", ["all", "last", "prompt_mean", [0, -1]])
def test_per_head_and_neuron_sites_capture_like_any_site(positions):
    """attn_z (heads x d_head, stored flattened) and mlp_post (d_mlp) == TransformerLens's hook_z / hook_post."""
    m = tiny_model("llama")
    tl = transformer_lens_model(m)
    z = capture(m, PROMPTS, sites="attn_z", positions=positions, runtime=Runtime(progress=False))
    post = capture(m, PROMPTS, sites="mlp_post", positions=positions, runtime=Runtime(progress=False))
    allz = capture(m, PROMPTS, sites="attn_z", positions="all", runtime=Runtime(progress=False))
    assert z.width == m.n_heads * m.d_head and post.width == m.config.intermediate_size
    assert z.site_view("attn_z.1").shape[-2:] == (m.n_heads, m.d_head)
    for i, p in enumerate(PROMPTS):
        ids = _ids(m, p)
        T = ids.shape[1]
        with torch.no_grad():
            _, cache = tl.run_with_cache(ids)
        for layer in range(m.n_layers):
            hz = cache[f"blocks.{layer}.attn.hook_z"][0]
            torch.testing.assert_close(allz.site_view(f"attn_z.{layer}")[i, -T:], hz, atol=1e-5, rtol=0)
            want_z = {"all": hz, "last": hz[-1], "prompt_mean": None, "p": hz[[0, -1]]}
            got = z.site_view(f"attn_z.{layer}")[i]
            key = positions if isinstance(positions, str) else "p"
            if key == "all":
                got = got[-T:]
            if want_z[key] is not None:
                torch.testing.assert_close(got, want_z[key], atol=1e-5, rtol=0)
            hp = cache[f"blocks.{layer}.mlp.hook_post"][0]
            if key == "last":
                torch.testing.assert_close(post.site(f"mlp_post.{layer}")[i], hp[-1], atol=1e-5, rtol=0)


def test_per_head_sites_stream_to_a_store_and_feed_probes(tmp_path):
    import probes

    m = tiny_model("gemma3_text", hidden_size=48)  # n_heads * d_head (64) != d_model (48)
    mem = capture(m, PROMPTS, sites="attn_z", positions="all", runtime=Runtime(batch_size=3, progress=False))
    store = capture(m, PROMPTS, sites="attn_z", positions="all", out=tmp_path / "z",
                    runtime=Runtime(batch_size=3, progress=False))
    back = store.load()
    assert store.d_model == 64 and back.width == 64
    torch.testing.assert_close(back.tensor, mem.tensor)
    torch.testing.assert_close(back.site_view("attn_z.0"), mem.site_view("attn_z.0"))
    assert back.site_view("attn_z.0").shape[-2:] == (4, 16)
    last = capture(m, Prompts(PROMPTS, labels=[1, 0, 1, 0]), sites="mlp_post",
                   runtime=Runtime(progress=False))
    d = probes.diff_of_means(last)
    assert d.vectors.shape == (m.n_layers, m.config.intermediate_size)
    with pytest.raises(ValueError, match="capture each width group in its own call"):
        capture(m, PROMPTS, sites=["resid_post.0", "attn_z.0"], runtime=Runtime(progress=False))


@pytest.mark.parametrize("family", ["qwen2_moe", "mixtral", "qwen3_moe", "olmoe"])
def test_moe_parts_sum_to_mlp_out(tiny_models, family):
    """experts_out (the routed experts' weighted sum) + sigmoid(gate) * shared_expert_out == mlp_out, read through
    capture at [batch, seq, d] from the experts' flattened [batch * seq, d]; a part absent is a clear error."""
    from interp.hooking import module_hooks
    from interp.sites import parse_site

    m = tiny_models(family)
    shared = m.spec.shared_expert is not None
    kinds = ["experts_out", "shared_expert_out"] if shared else ["experts_out"]
    assert [s.split(".", 2)[2] for s in m.site_names() if s.startswith("blocks.0.mlp.hook_") and "expert" in s] == \
        [f"mlp.hook_{k}" for k in kinds]
    assert parse_site("blocks.1.mlp.hook_experts_out") == parse_site("routed.1")
    gates: list[torch.Tensor] = []
    mods = [(m.module(m.spec.shared_expert_gate, 1), "post", lambda mod, a, out: gates.append(out))] if shared else []
    with module_hooks(mods):
        a = capture(m, PROMPTS, sites=[f"{k}.1" for k in kinds] + ["mlp_out.1"], positions="all",
                    runtime=Runtime(progress=False))
    keep = a.mask[..., None]
    routed, mlp = a.site("experts_out.1"), a.site("mlp_out.1")
    if shared:
        g = torch.sigmoid(torch.cat(gates).view(len(PROMPTS), -1, 1))  # one forward pass: capture's single batch
        routed = routed + g[:, -routed.shape[1]:] * a.site("shared_expert_out.1")
    else:
        with pytest.raises(ValueError, match="has no shared expert"):
            capture(m, PROMPTS, sites="shared_expert_out.0", runtime=Runtime(progress=False))
    torch.testing.assert_close(routed * keep, mlp * keep, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="is not a mixture of experts"):
        with hooks(tiny_models("llama"), {"experts_out.0": lambda x, ctx: x}):
            pass


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_mlp_in_and_module_out_are_the_mlp_modules_own_input_and_output(tiny_models, family):
    """``mlp_in`` / ``mlp_module_out`` (a transcoder's sites) read the MLP module itself: after the pre-MLP norm's
    gain, before Gemma's post-MLP norm (so on Gemma ``mlp_module_out`` differs from ``mlp_out``)."""
    from interp.hooking import module_hooks
    from interp.sites import parse_site

    m = tiny_models(family)
    ids = torch.arange(3, 17).reshape(2, 7)
    raw: dict[str, torch.Tensor] = {}
    ours: dict[str, torch.Tensor] = {}
    mlp = m.module(m.spec.mlp, 1)
    grab = [(mlp, "pre", lambda mod, a, kw: raw.__setitem__("in", (a or (kw.get("hidden_states"),))[0]) or None),
            (mlp, "post", lambda mod, a, out: raw.__setitem__("out", out) or None)]
    fns = {"mlp_in.1": lambda x, c: ours.__setitem__("in", x.clone()),
           "blocks.1.mlp.hook_out": lambda x, c: ours.__setitem__("out", x.clone()),
           "mlp_out.1": lambda x, c: ours.__setitem__("written", x.clone())}
    with module_hooks(grab), hooks(m, fns), torch.no_grad():
        m.hf(ids)
    assert parse_site("mlp_in.1").name == "blocks.1.mlp.hook_in"
    assert torch.equal(ours["in"], raw["in"]) and torch.equal(ours["out"], raw["out"])
    assert torch.equal(ours["written"], ours["out"]) != (family == "gemma2")
