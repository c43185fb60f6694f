"""Patching's edits follow the one edit protocol: head and neuron ablation as hook_fns objects, transplant as a
weight edit, all composable in steering.apply (forward and generation) and equal to their context managers."""

from __future__ import annotations

import torch

import interp
import steering
from interp.forward import batch_of, last_logits
from interp.hooking import count_hooks
from interp.patching import ablate_heads, ablate_neurons
from interp.patching.edits import HeadAblation, NeuronAblation
from interp.patching.transplants import Transplant, transplanted
from interp.testing.tiny import tiny_model

PROMPTS = ["the man said hello", "what is the good word", "help me now please"]


def _logits(m, *ivs):
    with steering.apply(m, *ivs):
        return last_logits(m, batch_of(m, PROMPTS))


def test_head_and_neuron_ablation_objects_equal_the_context_managers():
    m = tiny_model("llama")
    heads, neurons = [(0, 1), (1, 0)], [(0, 3), (1, 7), (1, 9)]
    with ablate_heads(m, heads):
        ref_h = last_logits(m, batch_of(m, PROMPTS))
    with ablate_neurons(m, neurons):
        ref_n = last_logits(m, batch_of(m, PROMPTS))
    base = last_logits(m, batch_of(m, PROMPTS))
    torch.testing.assert_close(_logits(m, HeadAblation(heads)), ref_h, rtol=0, atol=0)
    torch.testing.assert_close(_logits(m, NeuronAblation(neurons)), ref_n, rtol=0, atol=0)
    assert (ref_h - base).abs().max() > 1e-4 and (ref_n - base).abs().max() > 1e-4   # they do something
    assert count_hooks(m.hf) == 0


def test_transplant_is_a_weight_edit_composable_with_activation_edits():
    target, source = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    before = {k: v.clone() for k, v in target.hf.state_dict().items()}
    copy = transplanted(target, source, [1], ("attn",))
    ref = last_logits(copy, batch_of(copy, PROMPTS))
    torch.testing.assert_close(_logits(target, Transplant(source, [1], ("attn",))), ref, atol=1e-6, rtol=0)
    # composed with a head ablation in one apply: equal to the ablation on the transplanted copy
    with ablate_heads(copy, [(0, 1)]):
        ref2 = last_logits(copy, batch_of(copy, PROMPTS))
    got2 = _logits(target, Transplant(source, [1], ("attn",)), HeadAblation([(0, 1)]))
    torch.testing.assert_close(got2, ref2, atol=1e-6, rtol=0)
    # generation goes through the same protocol, and the target's weights come back
    g_ref = steering.generate(copy, PROMPTS, max_new_tokens=4, runtime=interp.Runtime(progress=False))
    g = steering.generate(target, PROMPTS, Transplant(source, [1], ("attn",)), max_new_tokens=4,
                          runtime=interp.Runtime(progress=False))
    assert g.token_ids == g_ref.token_ids
    after = target.hf.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_weights_come_back_when_the_block_raises():
    target, source = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    before = {k: v.clone() for k, v in target.hf.state_dict().items()}
    try:
        with steering.apply(target, Transplant(source, [0, 1])):
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert all(torch.equal(before[k], v) for k, v in target.hf.state_dict().items())
