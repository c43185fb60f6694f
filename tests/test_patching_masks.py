"""Learned masks recover heads / neurons planted to carry the output, with the weights frozen."""

from __future__ import annotations

import pytest
import torch

from interp.forward import batch_of, last_logits
from interp.patching import MaskConfig, learn_mask, logit_diff
from interp.testing.tiny import tiny_model

PROMPTS = ["the man is here", "a boy can see the water", "you are there now", "what is the name of it"]


def _change_metric(m):
    with torch.no_grad():
        ref = last_logits(m, batch_of(m, PROMPTS))

    def change(logits):
        return (logits - ref).pow(2).sum(-1).mean()
    return change


def test_recovers_planted_heads():
    m = tiny_model("llama", n_layers=3)
    planted = {(0, 1), (2, 3), (1, 0)}
    dh = m.d_head
    with torch.no_grad():  # planted heads dominate what attention writes; the rest are faint
        for la in range(3):
            W = m.module(m.spec.attn_proj, la).weight
            for h in range(m.n_heads):
                W[:, h * dh:(h + 1) * dh] *= 4.0 if (la, h) in planted else 0.25
    before = {k: v.clone() for k, v in m.hf.state_dict().items()}
    flags = [p.requires_grad for p in m.hf.parameters()]
    res = learn_mask(m, PROMPTS, _change_metric(m),
                     config=MaskConfig(objective="increase", sparsity=0.05, steps=100, lr=0.1))
    assert {(la, h) for la, h, _ in res.ranking(3)} == planted
    assert set(res.selected()) == planted
    assert res.selected_metric > 5 * res.history[0]["metric"] > 0  # hard mask of the picks beats the soft start
    assert all(torch.equal(before[k], v) for k, v in m.hf.state_dict().items())  # weights frozen, unchanged
    assert [p.requires_grad for p in m.hf.parameters()] == flags and all(p.grad is None for p in m.hf.parameters())
    assert res.plot().data[0].type == "bar"


def test_recovers_planted_neurons_decreasing_a_logit_difference():
    m = tiny_model("llama")
    tok = m.tokenizer
    a, b = tok.convert_tokens_to_ids("the"), tok.convert_tokens_to_ids("a")
    U = m.module(m.spec.unembed).weight
    direction = (U[a] - U[b]).detach()
    planted = [(0, 5), (1, 40)]
    with torch.no_grad():  # every neuron writes faintly except two that write the logit-difference direction
        for la in range(2):
            m.module("mlp.down_proj", la).weight.mul_(0.1)
        for la, i in planted:
            m.module("mlp.down_proj", la).weight[:, i] = 0.0
            up = m.module("mlp.up_proj", la).weight
            m.module("mlp.gate_proj", la).weight[i] = up[i]     # silu(u) * u >= 0 always: a one-sided neuron
            m.module("mlp.down_proj", la).weight[:, i] = 3.0 * direction / direction.norm()
    res = learn_mask(m, PROMPTS, logit_diff(a, b), over="neurons",
                     config=MaskConfig(objective="decrease", sparsity=0.002, steps=150, lr=0.1))
    top = {(la, i) for la, i, _ in res.ranking(2)}
    assert top == set(planted), res.ranking(4)
    assert res.selected_metric < res.baseline


def test_bad_input():
    m = tiny_model("llama")
    met = _change_metric(m)
    with pytest.raises(ValueError, match="heads' or 'neurons"):
        learn_mask(m, PROMPTS, met, over="layers")
    with pytest.raises(ValueError, match="decrease' or 'increase"):
        learn_mask(m, PROMPTS, met, config=MaskConfig(objective="maximise"))
    with pytest.raises(TypeError, match=r"ablate= \(moved into means="):      # means given: a mean ablation
        learn_mask(m, PROMPTS, met, ablate="mean")
    with pytest.raises(ValueError, match="one number"):
        learn_mask(m, PROMPTS, lambda logits: logits[:, :3], config=MaskConfig(steps=2))
    with pytest.raises(ValueError, match="mixture-of-experts"):
        learn_mask(tiny_model("mixtral"), PROMPTS, met, over="neurons")
