"""Path patching: a sender patched into every downstream reader equals activation patching of the sender;
head q/k/v receivers decompose the attention receiver exactly; ordering and bad input."""

from __future__ import annotations

import pytest
import torch

from interp.patching import logit_diff, make_pairs, patch, path_patch
from interp.patching.activation import Patch
from interp.patching.path import _stages, parse_component, path_patch_sweep
from interp.testing.tiny import tiny_model

CLEAN = ["the man is big", "a man can go home", "you are here now"]
CORRUPT = ["the boy is small", "a boy can see home", "we are there now"]


def _setup(family):
    m = tiny_model(family, n_layers=3)
    tok = m.tokenizer
    return m, make_pairs(m, CLEAN, CORRUPT), logit_diff(tok.convert_tokens_to_ids("the"), tok.convert_tokens_to_ids("a"))


def _downstream(m, sender):
    s = parse_component(sender, m, False)
    recv = [f"{k}.{la}" for la in range(m.n_layers) for k in ("attn", "mlp")
            if _stages(m, s)[1] <= _stages(m, parse_component(f"{k}.{la}", m, True))[0]]
    return recv + ["logits"]


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox", "phi3", "qwen3"])
def test_all_downstream_receivers_equal_activation_patching(family):
    m, pairs, met = _setup(family)
    cases = [("attn.0", Patch("attn_out.0")), ("mlp.0", Patch("mlp_out.0")), ("mlp.1", Patch("mlp_out.1")),
             ("head.0.2", Patch("attn_z.0", head=2)), ("head.1.0", Patch("attn_z.1", head=0))]
    exact = patch(m, pairs, [p for _, p in cases], met)
    for (sender, _), want in zip(cases, exact.tolist(), strict=True):
        got = path_patch(m, pairs, met, sender, _downstream(m, sender))
        assert abs(got - want) < 1e-5, (sender, got, want)
    # and the direct path alone is a different (smaller) quantity for an early sender
    assert abs(path_patch(m, pairs, met, "attn.0", "logits") - exact[0]) > 1e-6


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox", "phi3", "gemma2"])
def test_head_receivers_decompose_the_attention_receiver(family):
    m, pairs, met = _setup(family)
    whole = path_patch(m, pairs, met, "mlp.0", "attn.2")
    heads = path_patch(m, pairs, met, "mlp.0", [f"head.2.{h}" for h in range(m.n_heads)])
    assert abs(whole - heads) < 1e-5
    sw = path_patch_sweep(m, pairs, met, "attn.2", senders="blocks")
    assert abs(float(sw.values[0, 1]) - whole) < 1e-5
    only_q = path_patch(m, pairs, met, "attn.0", [f"head.2.{h}.q" for h in range(m.n_heads)])
    assert abs(only_q - sw.baseline) > 1e-7  # the last position's query sees the change


def test_sweep_and_identity():
    m, pairs, met = _setup("llama")
    sw = path_patch_sweep(m, pairs, met, "logits", senders="heads")
    assert sw.shape == (3, m.n_heads) and sw.method == "path"
    # the last layer's heads reach the logits directly and through the last MLP only
    exact = patch(m, pairs, [Patch("attn_z.2", head=h) for h in range(m.n_heads)], met)
    both = path_patch_sweep(m, pairs, met, ["mlp.2", "logits"], senders="heads", layers=[2])
    assert torch.allclose(both.values[0], exact, atol=1e-5)
    assert not torch.allclose(sw.values[2], exact, atol=1e-5)
    same = path_patch_sweep(m, pairs, met, ["mlp.2", "head.2.1.k"], senders="heads", runs=("corrupted", "corrupted"))
    assert torch.allclose(same.values, torch.full_like(same.values, same.baseline), atol=1e-6)
    blocks = path_patch_sweep(m, pairs, met, "mlp.1", senders="blocks")
    assert blocks.rows == ["0", "1"] and torch.isnan(blocks.values[1, 1])
    assert blocks.plot().data[0].type == "heatmap"


def test_bad_input():
    m, pairs, met = _setup("llama")
    with pytest.raises(ValueError, match="not upstream"):
        path_patch(m, pairs, met, "attn.2", "mlp.1")
    with pytest.raises(ValueError, match="not upstream"):
        path_patch(m, pairs, met, "head.1.0", "attn.1")
    with pytest.raises(ValueError, match="cannot read component"):
        path_patch(m, pairs, met, "block.1", "logits")
    with pytest.raises(ValueError, match="only be a receiver"):
        path_patch(m, pairs, met, "logits", "mlp.1")
    with pytest.raises(ValueError, match="heads 0..3"):
        path_patch(m, pairs, met, "head.0.7", "logits")
    with pytest.raises(ValueError, match="subset of 'qkv'"):
        path_patch(m, pairs, met, "attn.0", "head.1.1.x")
    with pytest.raises(ValueError, match="no receivers"):
        path_patch(m, pairs, met, "attn.0", [])
    with pytest.raises(ValueError, match="upstream of every receiver"):
        path_patch_sweep(m, pairs, met, "attn.0")
    mo, po, meto = _setup("olmo2")
    with pytest.raises(ValueError, match="olmo2"):
        path_patch(mo, po, meto, "attn.0", "head.1.1.q")
