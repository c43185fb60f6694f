"""Baked addition: an AddVector (scope "both", all positions) as a bias on the residual writer equals hook
addition to float32 rounding on every family where a bias can carry it, saves and reloads with transformers
alone where the config has a bias flag, stays in memory (and every save / serve path refuses it, naming the fix)
where it has none, and is refused with a clear reason where it is not exact (mixture of experts, post norms)."""

from __future__ import annotations

import json

import pytest
import torch

import steering
from interp.testing.tiny import FAMILIES, MOE_FAMILIES, tiny_model
from steering.bias import bake_addition, memory_only
from steering.gguf_export import export_gguf
from steering.serve import baked_for_serving, save_for_serving

from .test_steering_bake import IDS, INEXACT, _model, _vec

# which writers can carry a *saved* bias, read off each family's HF modules and config flags; the others carry it
# in memory only (exact, but refused by every save / serve path)
SAVES = {"attn": {"llama", "qwen3", "gpt2", "gpt_neox", "qwen3_moe", "olmoe"},   # o_proj bias or attention_bias
         "mlp": {"llama", "gpt2", "gpt_neox"}}                                   # down-projection bias or mlp_bias
CASES = {"embed": dict(sites="resid_pre", layers=[0]), "attn": dict(sites="attn_out", layers=[0, 1]),
         "mlp": dict(sites="resid_post", layers=[0, 1])}


def _logits(model, *ivs):
    with torch.no_grad(), steering.apply(model, *ivs):
        return model.hf(IDS).logits


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def _expected(family, writer):
    if writer == "embed":
        return None
    if family in INEXACT:  # post-sublayer norms
        return "normalises each sublayer"
    if writer == "mlp" and family in MOE_FAMILIES:
        return "mixture of experts"
    return None


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("writer", list(CASES))
def test_baked_addition_equals_hook_addition(family, writer):
    m = _model(family)
    iv = steering.AddVector(_vec(m.d_model), alpha=3.0, **CASES[writer])
    refusal = _expected(family, writer)
    if refusal is not None:
        with pytest.raises(ValueError, match=refusal):
            bake_addition(m, iv)
        return
    plain, hooked = _logits(m), _logits(m, iv)
    assert _rel(hooked, plain) > 1e-2  # the addition matters, so equality below means something
    res = bake_addition(m, iv)
    assert res.exact and res.writers == (writer,) and res.rel_logit_error <= 1e-5
    assert _rel(_logits(res.model), hooked) <= 1e-5, family
    torch.testing.assert_close(_logits(m), plain, rtol=0, atol=0)  # the original is untouched (copy)
    saves = writer == "embed" or family in SAVES[writer]
    assert (memory_only(res.model) == []) == saves and any("memory only" in n for n in res.notes) != saves


def test_several_sites_and_interventions_sum_into_the_writers():
    m = _model("llama")
    norms = {0: 3.0, 1: 5.0}
    ivs = [steering.AddVector(_vec(m.d_model, 2), layers=[0, 1], sites=("resid_pre", "resid_mid", "resid_post")),
           steering.AddVector(_vec(m.d_model, 3), layers=1, sites="mlp_out", alpha=0.4, unit="residual", norms=norms),
           steering.AddVector({1: _vec(m.d_model, 4)}, layers=[1], sites="attn_out", alpha=-2.0)]
    res = bake_addition(m, *ivs)
    assert _rel(_logits(res.model), _logits(m, *ivs)) <= 1e-5
    frame = res.to_frame()
    assert set(zip(frame.writer, frame.layer.astype(object).where(frame.layer.notna(), None), strict=True)) == {
        ("embed", None), ("attn", 0), ("mlp", 0), ("attn", 1), ("mlp", 1)}
    # resid_pre of layer 1 and resid_post of layer 0 are the same stream: both land in layer 0's down_proj
    want = 2 * _vec(m.d_model, 2).double()
    got = res.model.block(0).mlp.down_proj.bias.double()
    torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-6, atol=1e-6)
    assert len(res.plot().data) >= 2 and any("mlp_bias=True" in n for n in res.notes)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt2", "gpt_neox"])
def test_saved_folder_reloads_with_transformers_alone(family, tmp_path):
    from transformers import AutoModelForCausalLM

    m = _model(family)
    sites = "attn_out" if family == "qwen3" else ("attn_out", "resid_post")
    iv = steering.AddVector(_vec(m.d_model), layers=[0, 1], sites=sites, alpha=2.0)
    res = bake_addition(m, iv)
    res.model.hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    if family == "llama":
        assert cfg["attention_bias"] and cfg["mlp_bias"]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    with torch.no_grad():
        got = loaded(IDS).logits
    torch.testing.assert_close(got, _logits(res.model), rtol=1e-6, atol=1e-6)
    assert _rel(got, _logits(m, iv)) <= 1e-5 and _rel(got, _logits(m)) > 1e-2


def test_refusals_name_the_fix():
    m = tiny_model("llama")
    v = _vec(m.d_model)
    for bad, match in [(steering.AddVector(v, layers=0, scope="generated"), "scope='both'"),
                       (steering.AddVector(v, layers=0, positions=[-1]), "positions='all'"),
                       (steering.AddVector(v, layers=0).when(v, 0.0), "no condition"),
                       (steering.AddVector(v, layers=0, sites="experts_out"), "not one writer")]:
        with pytest.raises(ValueError, match=match):
            bake_addition(m, bad)
    with pytest.raises(TypeError, match="steering.bake"):
        bake_addition(m, steering.DirectionalAblation(v))
    with pytest.raises(ValueError, match="at least one"):
        bake_addition(m)
    with pytest.raises(RuntimeError, match="hooks"):
        with steering.apply(m, steering.AddVector(v, layers=0)):
            bake_addition(m, steering.AddVector(v, layers=0))


def test_inplace_and_tied_embeddings():
    m = tiny_model("llama", tie_word_embeddings=True)
    assert m.hf.get_output_embeddings().weight.data_ptr() == m.hf.get_input_embeddings().weight.data_ptr()
    iv = steering.AddVector(_vec(m.d_model), layers=[0], sites="resid_pre", alpha=2.0)
    hooked = _logits(m, iv)
    unembed = m.hf.get_output_embeddings().weight.detach().clone()
    res = bake_addition(m, iv, inplace=True, measure=False)
    assert res.model is m and res.max_logit_error is None and any("untied" in n for n in res.notes)
    torch.testing.assert_close(m.hf.get_output_embeddings().weight, unembed, rtol=0, atol=0)
    assert _rel(_logits(m), hooked) <= 1e-5


def _memory_baked(family="mistral"):
    m = _model(family)
    iv = steering.AddVector(_vec(m.d_model), layers=[0, 1], sites=("attn_out", "resid_post"), alpha=2.0)
    return m, iv, bake_addition(m, iv)


def test_memory_only_bias_is_lost_by_a_saved_folder(tmp_path):
    """Why the save paths refuse: plain transformers reloads a no-flag family's folder without the baked biases."""
    from transformers import AutoModelForCausalLM

    m, iv, res = _memory_baked("qwen2")
    assert sorted(memory_only(res.model)) == [f"model.layers.{i}.{w}.bias" for i in (0, 1)
                                              for w in ("mlp.down_proj", "self_attn.o_proj")]
    res.model.hf.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    with torch.no_grad():
        got = loaded(IDS).logits
    assert _rel(got, _logits(m)) <= 1e-6 and _rel(_logits(res.model), _logits(m, iv)) <= 1e-5


def test_save_and_serve_paths_refuse_memory_only_biases(tmp_path):
    m, iv, res = _memory_baked("mistral")
    fix = "not built by its MistralConfig.*resid_pre 0 \\(the embedding"
    with pytest.raises(ValueError, match="save_for_serving|baked_for_serving: .*" + fix):
        save_for_serving(m, tmp_path / "served", iv)
    assert not (tmp_path / "served").exists()
    for bad in ([res.model], [m, iv]):
        with pytest.raises(ValueError, match="baked_for_serving: .*" + fix):
            baked_for_serving(*bad)
    # the fix works: the same family bakes at the embedding and saves
    emb = steering.AddVector(_vec(m.d_model), layers=[0], sites="resid_pre", alpha=2.0)
    assert save_for_serving(m, tmp_path / "emb", emb).is_dir()
    # export_gguf: a Llama whose config lost its flag holds a bias the file's reader would not build
    lm, _, lres = _memory_baked("llama")
    lres.model.hf.config.attention_bias = False
    with pytest.raises(ValueError, match="export_gguf: 8 parameters .*q_proj.bias.*resid_pre 0"):
        export_gguf(lres.model, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()
