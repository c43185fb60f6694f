"""Direct logit attribution: parts sum to the logit (difference), agree with TransformerLens, refuse clearly."""

from __future__ import annotations

import pytest
import torch

import interp
from interp.hooking import norm_parts
from interp.look import dla as D
from interp.testing.tiny import FAMILIES, MOE_FAMILIES, tiny_model
from interp.weights import unembed

PROMPTS = ["the cat was on the", "a man said that he", "it is one of the"]


def _ids(m, n=3, T=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(8, m.config.vocab_size, (n, T), generator=g)


def _logits(m, ids):
    with torch.no_grad():
        out = m.hf(input_ids=ids.to(m.device)).logits[:, -1].float().cpu()
    cap = getattr(m.config, "final_logit_softcapping", None)
    return out if not cap else torch.atanh(out / cap) * cap       # the pre-softcap logit DLA decomposes


@pytest.mark.parametrize("family", FAMILIES)
def test_parts_sum_to_the_logit_difference(family):
    m = tiny_model(family)
    ids = _ids(m)
    by = ["layer"] + ([] if family in MOE_FAMILIES else ["head", "neuron"])
    lg = _logits(m, ids)
    for b in by:
        r = D.direct_logit_attribution(m, ids, (10, 20), by=b)
        want = lg[:, 10] - lg[:, 20]
        torch.testing.assert_close(r.total[:, 0], want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(r.parts.sum(-1) + r.constant, r.total, atol=1e-4, rtol=0)
    if family in MOE_FAMILIES:
        with pytest.raises(ValueError, match="mixture-of-experts.*by='layer' or by='head'"):
            D.direct_logit_attribution(m, ids, 10, by="neuron")


def test_one_token_target_and_per_prompt_pairs():
    m = tiny_model("llama")
    ids = _ids(m)
    lg = _logits(m, ids)
    r = D.direct_logit_attribution(m, ids, 12, by="head")
    torch.testing.assert_close(r.total[:, 0], lg[:, 12], atol=1e-4, rtol=1e-4)
    r2 = D.direct_logit_attribution(m, ids, ([10, 11, 12], [20, 21, 22]))
    torch.testing.assert_close(r2.total[:, 0], lg[[0, 1, 2], [10, 11, 12]] - lg[[0, 1, 2], [20, 21, 22]],
                               atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="one target per prompt"):
        D.direct_logit_attribution(m, ids, ([10, 11], [20, 21]))
    with pytest.raises(ValueError, match="a logit target needs one token"):
        D.direct_logit_attribution(m, ["the cat"], "the cat")
    with pytest.raises(ValueError, match="by must be"):
        D.direct_logit_attribution(m, ids, 10, by="block")


def test_mean_positions_are_refused_and_positions_kept():
    m = tiny_model("llama")
    ids = _ids(m)
    with pytest.raises(ValueError, match="per token"):
        D.direct_logit_attribution(m, ids, 10, positions="prompt_mean")
    r = D.direct_logit_attribution(m, ids, 10, positions=[-2, -1], by="layer")
    assert r.parts.shape[:2] == (3, 2)
    torch.testing.assert_close(r.parts.sum(-1) + r.constant, r.total, atol=1e-4, rtol=0)


def test_head_parts_by_layer_sum_to_the_layer_part():
    m = tiny_model("gemma2")                                         # post-attention norm frozen per head
    ids = _ids(m)
    h = D.direct_logit_attribution(m, ids, (10, 20), by="head")
    la = D.direct_logit_attribution(m, ids, (10, 20), by="layer")
    for layer in range(m.n_layers):
        hs = [i for i, p in enumerate(h.labels) if p.startswith(f"L{layer}H") or p == f"L{layer} attn bias"]
        j = la.labels.index(f"L{layer} attn")
        torch.testing.assert_close(h.parts[..., hs].sum(-1), la.parts[..., j], atol=1e-4, rtol=0)


def test_result_frame_plot_summary_top_and_save(tmp_path):
    m = tiny_model("llama")
    r = D.direct_logit_attribution(m, _ids(m), (10, 20), by="head")
    df = r.to_frame()
    assert set(df.columns) >= {"prompt", "position", "part", "kind", "layer", "head", "value"}
    assert len(df) == 3 * len(r.labels)
    top = r.top(3)
    mean = r.parts.mean((0, 1))
    assert [p for p, _ in top] == [r.labels[i] for i in mean.abs().argsort(descending=True)[:3]]
    s = r.summary()
    assert s["top"][0]["part"] == top[0][0] and "frozen" in s
    fig = r.plot()
    heat = [t for t in fig.data if t.type == "heatmap"][0]
    H = m.n_heads
    want = mean[[r.labels.index(f"L{la}H{h}") for la in range(m.n_layers) for h in range(H)]].reshape(-1, H)
    torch.testing.assert_close(torch.tensor(heat.z, dtype=torch.float32), want, atol=1e-6, rtol=0)
    bars = [t for t in fig.data if t.type == "bar"][0]
    assert list(bars.x)[0] == "embed"
    r.save(tmp_path / "dla")
    back = interp.bundle.load(tmp_path / "dla")
    torch.testing.assert_close(back.parts, r.parts)
    with pytest.raises(FileExistsError):
        r.save(tmp_path / "dla")


@pytest.mark.slow
def test_smollm2_heads_equal_transformer_lens_stack_head_results():
    from interp.testing.oracles import transformer_lens_model

    m = interp.load_model("smollm2-135m-instruct", dtype=torch.float32)
    tok = m.tokenizer
    text = "When Mary and John went to the store, John gave a drink to"
    ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
    a, b = tok.encode(" Mary", add_special_tokens=False)[0], tok.encode(" John", add_special_tokens=False)[0]
    r = D.direct_logit_attribution(m, ids, (a, b), by="head")
    tl = transformer_lens_model(m)
    with torch.no_grad():
        _, cache = tl.run_with_cache(ids.to(tl.cfg.device))
        stack, _ = cache.stack_head_results(layer=None, pos_slice=-1, apply_ln=True, return_labels=True)
        # the oracle's weights are unprocessed (the final norm's gain not folded into W_U): apply it here
        direction = tl.ln_final.w * (tl.W_U[:, a] - tl.W_U[:, b])
        want = (stack[:, 0] @ direction).float().cpu()                 # [L*H], TL order L0H0, L0H1, ...
        resid, labels = cache.decompose_resid(layer=None, pos_slice=-1, apply_ln=True, return_labels=True)
        want_resid = (resid[:, 0] @ direction).float().cpu()
    heads = [r.labels.index(f"L{la}H{h}") for la in range(m.n_layers) for h in range(m.n_heads)]
    torch.testing.assert_close(r.parts[0, 0, heads], want, atol=1e-4, rtol=0)
    rl = D.direct_logit_attribution(m, ids, (a, b), by="layer")
    ours = [rl.labels.index(x) for x in ["embed"] + [f"L{la} {k}" for la in range(m.n_layers) for k in ("attn", "mlp")]]
    assert labels[0] == "embed"
    torch.testing.assert_close(rl.parts[0, 0, ours], want_resid, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", MOE_FAMILIES)
@pytest.mark.parametrize("by", ["layer", "head"])
def test_moe_layers_split_into_routed_experts_and_shared_expert(family, by):
    m = tiny_model(family)
    ids = _ids(m)
    r = D.direct_logit_attribution(m, ids, (10, 20), by=by)
    torch.testing.assert_close(r.parts.sum(-1) + r.constant, r.total, atol=1e-4, rtol=0)
    lg = _logits(m, ids)
    torch.testing.assert_close(r.total[:, 0], lg[:, 10] - lg[:, 20], atol=1e-4, rtol=1e-4)
    shared = m.spec.shared_expert is not None
    layer = D.direct_logit_attribution(m, ids, (10, 20), by="layer") if by != "layer" else r
    fp = norm_parts(m.module(m.spec.final_norm), m.spec.norm_offset)
    resid = interp.capture(m, ids, f"resid_post.{m.n_layers - 1}", "last").tensor[:, 0]
    scale = torch.rsqrt(resid.pow(2).mean(-1) + fp.eps)                 # RMSNorm frozen on the clean run
    W = unembed(m)[0].float()
    w = (W[10] - W[20]) * (fp.offset + fp.weight.float())
    for la in range(m.n_layers):
        assert f"L{la} mlp" not in r.labels
        e = r.labels.index(f"L{la} experts")
        assert r.kinds[e] == "experts" and r.layers[e] == la
        assert (f"L{la} shared expert" in r.labels) == shared
        # the routed experts' part is the experts_out write read along the frozen final norm
        x = interp.capture(m, ids, f"experts_out.{la}", "last").tensor[:, 0]
        torch.testing.assert_close(r.parts[:, 0, e], scale * (x @ w), atol=1e-5, rtol=1e-4)
        assert r.parts[:, 0, e].abs().sum() > 0
        if shared:
            j = r.labels.index(f"L{la} shared expert")
            assert r.kinds[j] == "shared_expert" and r.parts[..., j].abs().sum() > 0
    names, vals = layer.by_layer()                                  # experts + shared expert add up to the MLP bar
    assert names[2] == "L0 mlp" and vals.shape[0] == 1 + 2 * m.n_layers
