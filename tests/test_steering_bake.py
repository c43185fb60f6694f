"""Baked weights: orthogonalised writers equal hook ablation for every tiny family (dense, MoE, fused and
separate experts), per-writer selection, tied embeddings, honest reports where exactness is impossible,
and a save_pretrained round trip through plain transformers."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

import steering
from interp.capturing import capture
from interp.models import from_hf
from interp.testing.tiny import FAMILIES, tiny_model
from interp.values import Runtime
from steering.baking import ablate_writers

INEXACT = ("gemma2", "gemma3_text", "olmo2")
IDS = torch.randint(7, 200, (2, 12), generator=torch.Generator().manual_seed(0))


def _vec(d, seed=1):
    return torch.randn(d, generator=torch.Generator().manual_seed(seed))


def _model(family):
    """A tiny model whose biases are nonzero (HF initialises them to zero, which would hide bias handling)."""
    m = tiny_model(family)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in m.hf.named_parameters():
            if name.endswith("bias"):
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return m


def _logits(model, *ivs):
    with torch.no_grad():
        if ivs:
            with steering.apply(model, *ivs):
                return model.hf(IDS).logits
        return model.hf(IDS).logits


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("family", FAMILIES)
def test_baked_equals_hook_ablation(family):
    m = _model(family)
    assert m.spec.post_sublayer_norms == (family in INEXACT)
    r = _vec(m.d_model)
    plain = _logits(m)
    hooked = _logits(m, steering.DirectionalAblation(r))
    assert _rel(hooked, plain) > 1e-3  # the ablation matters, so equality below means something
    if family in INEXACT:
        with pytest.raises(ValueError, match="allow_inexact=True"):
            steering.bake(m, r)
        with pytest.warns(UserWarning, match="max logit error"):
            res = steering.bake(m, r, allow_inexact=True)
        assert not res.exact and res.max_logit_error is not None and res.max_logit_error > 0
        with ablate_writers(m, r), torch.no_grad():  # the reported figure is a real measurement
            ref = m.hf(torch.randint(0, m.hf.config.vocab_size, (2, 16),
                                     generator=torch.Generator().manual_seed(0))).logits
        with torch.no_grad():
            got = res.model.hf(torch.randint(0, m.hf.config.vocab_size, (2, 16),
                                             generator=torch.Generator().manual_seed(0))).logits
        assert abs((got - ref).abs().max().item() - res.max_logit_error) <= 1e-6
        # the baked stream still carries no component along the direction
        acts = capture(res.model, ["the man is here", "a boy"], sites=["resid_pre", "resid_post"],
                       positions="all", runtime=Runtime(progress=False))
        assert (acts.tensor @ (r / r.norm())).abs().max() <= 1e-5
    else:
        res = steering.bake(m, r, measure=True)
        assert res.exact and res.rel_logit_error <= 1e-4
        assert _rel(_logits(res.model), hooked) <= 1e-4, family
    torch.testing.assert_close(_logits(m), plain, rtol=0, atol=0)  # the original is untouched (copy)
    if m.spec.is_moe:
        assert any("experts" in n for n in res.edited)


def test_subspace_bake_equals_subspace_hooks():
    for family in ("llama", "mixtral"):
        m = tiny_model(family)
        Q = torch.linalg.qr(torch.randn(m.d_model, 3, generator=torch.Generator().manual_seed(2)))[0].T
        hooked = _logits(m, steering.AblateSubspace(Q, sites=("resid_pre", "attn_out", "mlp_out")))
        assert _rel(_logits(steering.bake(m, Q).model), hooked) <= 1e-4
        with pytest.raises(ValueError, match="orthonormal"):
            steering.bake(m, torch.randn(3, m.d_model))


@pytest.mark.parametrize("family,writers", [
    ("llama", ("attn",)), ("llama", ("mlp",)), ("llama", ("embed",)), ("llama", ("attn", "mlp")),
    ("gpt2", ("pos_embed",)), ("gpt2", ("embed", "pos_embed", "mlp")),
    ("qwen2_moe", ("experts",)), ("qwen2_moe", ("shared_expert",)), ("qwen2_moe", ("experts", "shared_expert")),
    ("mixtral", ("experts", "attn")),
])
def test_per_writer_bake_equals_writer_hooks(family, writers):
    m = _model(family)
    r = _vec(m.d_model)
    with ablate_writers(m, r, writers):
        ref = _logits(m)
    res = steering.bake(m, r, writers=writers)
    assert set(res.writers) == set(writers)
    assert _rel(_logits(res.model), ref) <= 1e-4
    assert _rel(ref, _logits(m)) > 1e-4 or writers == ("pos_embed",)


def test_writer_effects_add_up_to_the_whole():
    """Each writer alone moves the logits less than all together, and attn-only matches the attn_out hook."""
    m = tiny_model("qwen2_moe")
    r = _vec(m.d_model)
    plain = _logits(m)
    full = _rel(_logits(steering.bake(m, r).model), plain)
    alone = {w: _rel(_logits(steering.bake(m, r, writers=w).model), plain)
             for w in ("embed", "attn", "experts", "shared_expert")}
    assert all(0 < v < full * 1.5 for v in alone.values()), (alone, full)
    attn = steering.bake(m, r, writers="attn").model
    torch.testing.assert_close(_logits(attn), _logits(m, steering.Ablate(r, sites="attn_out")), rtol=1e-4, atol=1e-5)


def test_layers_and_bad_writers():
    m = tiny_model("mixtral")
    r = _vec(m.d_model)
    res = steering.bake(m, r, layers=[1], writers=("attn", "experts"))
    assert res.edited and all(".1." in n for n in res.edited)
    with pytest.raises(ValueError, match="experts"):
        steering.bake(m, r, writers="mlp")
    with pytest.raises(ValueError, match="unknown writers"):
        steering.bake(m, r, writers=("attention",))
    with pytest.raises(ValueError, match="out of range"):
        steering.bake(m, r, layers=[2])
    with pytest.raises(ValueError, match="width"):
        steering.bake(m, torch.randn(m.d_model + 3))

    class PerLayer:
        vectors = torch.randn(2, m.d_model)

    with pytest.raises(ValueError, match="one direction"):
        steering.bake(m, PerLayer())
    with pytest.raises(RuntimeError, match="hooks"):
        with steering.apply(m, steering.DirectionalAblation(r)):
            steering.bake(m, r)


@pytest.mark.parametrize("family", ["gpt2", "gemma2"])
def test_tied_embeddings_untied_and_unembedding_kept(family):
    m = tiny_model(family)
    emb = m.hf.get_input_embeddings().weight.detach().clone()
    assert m.hf.get_output_embeddings().weight.data_ptr() == m.hf.get_input_embeddings().weight.data_ptr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = steering.bake(m, _vec(m.d_model), allow_inexact=True)
    b = res.model.hf
    assert b.get_output_embeddings().weight.data_ptr() != b.get_input_embeddings().weight.data_ptr()
    torch.testing.assert_close(b.get_output_embeddings().weight, emb, rtol=0, atol=0)
    assert (b.get_input_embeddings().weight - emb).abs().max() > 1e-4
    assert not b.config.tie_word_embeddings and any("untied" in n for n in res.notes)
    assert m.hf.get_output_embeddings().weight.data_ptr() == m.hf.get_input_embeddings().weight.data_ptr()


def test_inplace_edits_the_model_itself():
    m = tiny_model("llama")
    r = _vec(m.d_model)
    hooked = _logits(m, steering.DirectionalAblation(r))
    res = steering.bake(m, r, inplace=True)
    assert res.model is m
    assert _rel(_logits(m), hooked) <= 1e-4


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2_moe", "gemma2"])
def test_save_pretrained_loads_in_plain_transformers(family, tmp_path):
    from transformers import AutoModelForCausalLM

    m = _model(family)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = steering.bake(m, _vec(m.d_model), allow_inexact=True)
    res.model.hf.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, res.model.hf(IDS).logits, rtol=1e-6, atol=1e-6)
    assert _rel(_logits(m), loaded(IDS).logits.detach()) > 1e-4


class _Expert(nn.Module):
    def __init__(self, gate_up, down, act):
        super().__init__()
        f = down.shape[1]
        self.gate_proj = nn.Linear(gate_up.shape[1], f, bias=False)
        self.up_proj = nn.Linear(gate_up.shape[1], f, bias=False)
        self.down_proj = nn.Linear(f, down.shape[0], bias=False)
        with torch.no_grad():
            self.gate_proj.weight.copy_(gate_up[:f])
            self.up_proj.weight.copy_(gate_up[f:])
            self.down_proj.weight.copy_(down)
        self.act = act

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class ListExperts(nn.ModuleList):
    """Routed experts as separate modules (the older transformers layout), same math as the fused tensor."""

    def forward(self, hidden, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden)
        for e, expert in enumerate(self):
            tok, slot = torch.where(top_k_index == e)
            if len(tok):
                out.index_add_(0, tok, expert(hidden[tok]) * top_k_weights[tok, slot, None])
        return out


def test_separate_module_experts():
    m = tiny_model("mixtral")
    plain = _logits(m)
    for L in range(m.n_layers):
        mlp = m.block(L).mlp
        fused = mlp.experts
        mlp.experts = ListExperts([_Expert(fused.gate_up_proj[e].detach(), fused.down_proj[e].detach(), fused.act_fn)
                                   for e in range(fused.down_proj.shape[0])])
    m = from_hf(m.hf, m.tokenizer, name="tiny-mixtral-listexperts")
    torch.testing.assert_close(_logits(m), plain, rtol=1e-5, atol=1e-6)  # same model, other layout
    r = _vec(m.d_model)
    res = steering.bake(m, r)
    assert sum(".experts." in n for n in res.edited) == 2 * 4
    assert _rel(_logits(res.model), _logits(m, steering.DirectionalAblation(r))) <= 1e-4
