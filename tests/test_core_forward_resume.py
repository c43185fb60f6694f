"""Resuming a forward from a cached resid_pre (``forward(..., from_layer=, resid=)``): equal to the full forward,
blocks below really skipped, edits below refused, and the fallback for families that cannot skip."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import steering
from interp.forward import batch_of, can_skip, forward, last_logits, resid_pre_cache, skip_blocks
from interp.hooking import count_hooks
from interp.testing.tiny import FAMILIES, tiny_model

PROMPTS = ["the man said", "what is the good word now, tell me", "help"]


def _unlisted(m):
    """The same HF model under a family name outside SKIPPABLE: the fallback path (blocks run, output replaced)."""
    return dataclasses.replace(m, spec=dataclasses.replace(m.spec, family=f"{m.spec.family}-unlisted"))


@pytest.mark.parametrize("family", FAMILIES)
def test_resume_equals_full_forward(family):
    m = tiny_model(family, n_layers=4)
    b = batch_of(m, PROMPTS)
    assert (b.attention_mask == 0).any()
    cache = resid_pre_cache(m, b, [1, 2, 3])
    torch.manual_seed(1)
    v = 2 * torch.randn(m.d_model)
    for layer in (1, 2, 3):
        with steering.apply(m, steering.AddVector(v, layers=layer, sites="resid_pre")):
            full = forward(m, b, logits="all", repeat=2)
            fast = forward(m, b, logits="all", repeat=2, from_layer=layer, resid=cache[layer])
            slow = forward(_unlisted(m), b, logits="all", repeat=2, from_layer=layer, resid=cache[layer])
        torch.testing.assert_close(fast, full, atol=1e-5, rtol=0)
        torch.testing.assert_close(slow, full, atol=1e-5, rtol=0)
    assert count_hooks(m.hf) == 0
    assert can_skip(m) and not can_skip(_unlisted(m))


def test_blocks_below_are_not_run_and_come_back():
    m = tiny_model("llama", n_layers=4)
    b = batch_of(m, PROMPTS)
    cache = resid_pre_cache(m, b, [3])
    blocks_before = list(m.blocks)
    ran: list[int] = []
    index = {id(blk): i for i, blk in enumerate(m.blocks)}

    def pre(mod, args):
        if id(mod) in index:
            ran.append(index[id(mod)])

    h = torch.nn.modules.module.register_module_forward_pre_hook(pre)  # global: not on the blocks themselves
    try:
        last_logits(m, b, from_layer=3, resid=cache[3])
        assert ran == [3]
        ran.clear()
        last_logits(_unlisted(m), b, from_layer=3, resid=cache[3])
        assert ran == [0, 1, 2, 3]                                     # fallback: computed, then replaced
    finally:
        h.remove()
    assert list(m.blocks) == blocks_before
    with pytest.raises(RuntimeError, match="boom"), skip_blocks(m, 2):
        assert type(m.blocks[0]).__name__ == "_PassThrough"
        raise RuntimeError("boom")
    assert list(m.blocks) == blocks_before                             # restored on exception too


def test_resume_refuses_bad_input():
    m = tiny_model("qwen2", n_layers=3)
    b = batch_of(m, PROMPTS)
    cache = resid_pre_cache(m, b, [1, 2])
    v = torch.randn(m.d_model)
    for mm in (m, _unlisted(m)):
        with steering.apply(mm, steering.AddVector(v, layers=0, sites="resid_pre")):
            with pytest.raises(ValueError, match="below from_layer=2"):
                last_logits(mm, b, from_layer=2, resid=cache[2])
    with pytest.raises(ValueError, match="needs resid"):
        last_logits(m, b, from_layer=1)
    with pytest.raises(ValueError, match="from_layer must be in 1..2"):
        last_logits(m, b, from_layer=0, resid=cache[1])
    with pytest.raises(ValueError, match="one row per batch row"):
        last_logits(m, b, from_layer=1, resid=cache[1][:2])
    with pytest.raises(ValueError, match="not both"):
        last_logits(m, b, from_layer=1, resid=cache[1], prefix=[], start=1)
    with pytest.raises(ValueError, match="same batch"):
        last_logits(m, batch_of(m, ["a much longer prompt than any of the others here"] * 3), from_layer=1,
                    resid=cache[1])
    assert count_hooks(m.hf) == 0 and list(m.blocks) == list(m.blocks)
