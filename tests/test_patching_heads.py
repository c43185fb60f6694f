"""Per-head outputs (sum to the attention output for every family, GQA included), head ablation, neuron
contrast, neuron ablation effects and neuron-set overlaps."""

from __future__ import annotations

import pytest
import torch

import interp
from interp.forward import batch_of, last_logits
from interp.patching import ablate_heads, ablate_neurons, logit_diff
from interp.patching.heads import head_ablation_sweep, head_means, head_outputs
from interp.patching.neurons import (
    intersect_neurons,
    neuron_ablation_effect,
    neuron_acts,
    neuron_contrast,
    neuron_means,
)
from interp.patching.runs import run_with_capture
from interp.sites import Site
from interp.testing.tiny import FAMILIES, tiny_model

PROMPTS = ["the man is here", "a boy can see the water and the sound", "what is your name"]


def _with_biases(family: str):
    m = tiny_model(family)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # random init leaves biases at zero; make them count
        for name, p in m.hf.named_parameters():
            if name.endswith("bias"):
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return m


@pytest.mark.parametrize("family", FAMILIES)
def test_heads_sum_to_attention_output(family):
    m = _with_biases(family)
    ho = head_outputs(m, PROMPTS)
    assert ho.per_head.shape[:3] == (3, m.n_layers, ho.mask.shape[1]) and ho.per_head.shape[3] == m.n_heads
    err = (ho.total() - ho.attn_out)[ho.mask[:, None].expand(-1, m.n_layers, -1)].abs().max()
    assert err < 1e-5, float(err)
    assert ho.per_head.abs().amax(dim=(0, 1, 2, 4)).min() > 0  # every head writes something
    s = ho.summary()
    assert s["max_abs_reconstruction_error"] == pytest.approx(float(err.detach())) and s["n_heads"] == m.n_heads
    assert set(s["top_head"]) == {str(la) for la in ho.layers} and all(0 <= h < m.n_heads for h in s["top_head"].values())


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2", "gpt_neox", "phi3", "mixtral"])
def test_zeroing_a_head_removes_exactly_its_output(family):
    """Without a post-norm the projection is linear, so ablating head h subtracts per_head[h] (order check)."""
    m = _with_biases(family)
    ho = head_outputs(m, PROMPTS)
    batch = batch_of(m, PROMPTS)
    for layer, h in [(0, 1), (1, 3)]:
        with ablate_heads(m, [(layer, h)]):
            acts, _ = run_with_capture(m, batch, [Site("attn_out", layer)])
        got = acts[Site("attn_out", layer)]
        want = ho.attn_out[:, layer] - ho.per_head[:, layer, :, h]
        assert (got - want)[ho.mask].abs().max() < 1e-5


def test_head_ablation_sweep_matches_single_ablations():
    m = tiny_model("llama")
    tok = m.tokenizer
    met = logit_diff(tok.convert_tokens_to_ids("the"), tok.convert_tokens_to_ids("a"))
    batch = batch_of(m, PROMPTS)
    means = head_means(m, PROMPTS)
    assert means.shape == (2, m.n_heads, m.d_head)
    for mode, mv in (("zero", None), ("mean", means)):
        sw = head_ablation_sweep(m, PROMPTS, met, mode=mode, means=mv)
        assert sw.shape == (2, m.n_heads)
        for layer, h in [(0, 0), (1, 2)]:
            with torch.no_grad(), ablate_heads(m, [(layer, h)], mode=mode, means=mv):
                want = float(met(last_logits(m, batch)))
            assert abs(float(sw.values[layer, h]) - want) < 1e-5
        assert sw.delta.abs().max() > 1e-5
    with pytest.raises(ValueError, match="means"):
        head_ablation_sweep(m, PROMPTS, met, mode="mean")
    with pytest.raises(ValueError, match="zero' or 'mean"):
        head_ablation_sweep(m, PROMPTS, met, mode="resample")


def test_neuron_contrast_finds_planted_neuron():
    m = tiny_model("llama")
    tok = m.tokenizer
    emb = m.module(m.spec.embed).weight
    d = emb[tok.convert_tokens_to_ids("water")].detach()
    with torch.no_grad():  # neuron (1, 7) fires on the word "water"
        m.module("mlp.up_proj", 1).weight[7] = 40 * d / d.norm()
        m.module("mlp.gate_proj", 1).weight[7] = 40 * d / d.norm()
    a = ["the man can see water", "a boy is in the water", "you are near water", "we like the water"]
    b = ["the man can see home", "a boy is in the house", "you are near me", "we like the man"]
    c = neuron_contrast(m, interp.Prompts(a, chat=False), interp.Prompts(b, chat=False))
    assert c.top(1)[0][:2] == (1, 7)
    assert (1, 7) in c.select(3, sign="pos")
    acts = neuron_acts(m, interp.Prompts(a, chat=False))
    assert torch.allclose(c.mean_a, acts.mean(0))
    assert c.plot().data[0].type == "heatmap"


def test_neuron_ablation_effect_and_overlap():
    m = tiny_model("llama")
    tok = m.tokenizer
    met = logit_diff(tok.convert_tokens_to_ids("the"), tok.convert_tokens_to_ids("a"))
    neurons = [(0, 3), (1, 10), (1, 77)]
    batch = batch_of(m, PROMPTS)
    for mode, mv in (("zero", None), ("mean", neuron_means(m, PROMPTS))):
        eff = neuron_ablation_effect(m, PROMPTS, met, neurons, mode=mode, means=mv)
        for i, n in enumerate(neurons):
            with torch.no_grad(), ablate_neurons(m, [n], mode=mode, means=mv):
                want = float(met(last_logits(m, batch)))
            assert abs(float(eff.values[i]) - want) < 1e-5
        with torch.no_grad(), ablate_neurons(m, neurons, mode=mode, means=mv):
            assert abs(eff.joint - float(met(last_logits(m, batch)))) < 1e-5
        assert eff.delta.abs().max() > 0
        s = eff.summary()
        assert s["joint_delta"] == pytest.approx(eff.joint - eff.baseline) and s["n_neurons"] == 3
        assert s["mean_delta"] == pytest.approx(float(eff.delta.mean())) and s["control_mean_delta"] is None
    with pytest.raises(ValueError, match="out of range"):
        neuron_ablation_effect(m, PROMPTS, met, [(0, 10_000)])
    with pytest.raises(ValueError, match="mixture-of-experts"):
        neuron_contrast(tiny_model("mixtral"), PROMPTS, PROMPTS)

    ov = intersect_neurons({"en": [(0, 1), (1, 2), (1, 3)], "fr": [(1, 2), (1, 3), (0, 9)], "de": [(1, 2)]})
    assert ov.common == {(1, 2)}
    assert ov.unique["en"] == {(0, 1)} and ov.unique["de"] == set()
    assert ov.intersections[0, 1] == 2 and abs(float(ov.jaccard[0, 1]) - 2 / 4) < 1e-9
    assert ov.plot().data[0].type == "heatmap"
    with pytest.raises(ValueError, match="at least 2"):
        intersect_neurons({"en": [(0, 1)]})
