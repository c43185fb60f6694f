"""GGUF export for llama.cpp: a plain and a baked tiny Llama read back with transformers to the same logits
(F32 exactly, F16 within its rounding), the file's tensors and keys read with gguf's own reader, a byte-level
BPE vocabulary round trip, and llama.cpp control vectors (structure, and the block-output semantics)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader

import steering
from interp.hooking import module_hooks
from interp.models import from_hf
from interp.testing.tiny import _WORDS, tiny_model
from steering.gguf_export import export_control_vector, export_gguf

IDS = torch.randint(7, 200, (2, 12), generator=torch.Generator().manual_seed(0))


def _vec(d, seed=1):
    return torch.randn(d, generator=torch.Generator().manual_seed(seed))


def _logits(model, *ivs):
    with torch.no_grad(), steering.apply(model, *ivs):
        return model.hf(IDS).logits


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def _export(model, path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny word-level tokenizer is left out, with a warning
        return export_gguf(model, path, **kw)


def _load(path, **kw):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32, **kw).eval()


def _field(reader, key):
    f = reader.fields[key]
    v = f.parts[f.data[0]]
    return bytes(v).decode() if f.types[0].name == "STRING" else v.tolist()[0]


@pytest.mark.parametrize("tied", [False, True])
def test_plain_llama_reads_back_with_transformers(tmp_path, tied):
    m = tiny_model("llama", tie_word_embeddings=tied)
    with pytest.warns(UserWarning, match="no_vocab"):
        p = export_gguf(m, tmp_path / "m.gguf")
    with torch.no_grad():
        torch.testing.assert_close(_load(p)(IDS).logits, _logits(m), rtol=0, atol=1e-6)
    r = GGUFReader(p)
    names = {t.name for t in r.tensors}
    assert ("output.weight" in names) != tied and _field(r, "general.architecture") == "llama"
    assert _field(r, "llama.block_count") == 2 and _field(r, "llama.attention.head_count_kv") == 2


def test_baked_llama_reads_back_and_keeps_its_steering(tmp_path):
    m = tiny_model("llama")
    ivs = [steering.AddVector(_vec(m.d_model), layers=[0, 1], sites=("attn_out", "resid_post"), alpha=2.0)]
    ablated = steering.bake(m, _vec(m.d_model, 7)).model      # both bakes: an ablation, then an addition
    hooked = _logits(ablated, *ivs)
    baked = steering.bake_addition(ablated, *ivs).model
    want = _logits(baked)
    assert _rel(want, hooked) <= 1e-5 and _rel(hooked, _logits(ablated)) > 1e-2
    p = _export(baked, tmp_path / "b.gguf")
    with torch.no_grad():
        got = _load(p, config=baked.config)(IDS).logits
        dropped = _load(p)(IDS).logits  # transformers builds its config from the GGUF keys: no biases
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert (dropped - want).abs().max() > 1e-2
    r = GGUFReader(p)
    t = {x.name: x for x in r.tensors}
    for name in ("blk.0.attn_output.bias", "blk.1.ffn_down.bias", "blk.0.attn_q.bias"):
        assert t[name].tensor_type == GGMLQuantizationType.F32
    d = baked.hf.model.layers[1].mlp.down_proj.bias.detach()
    np.testing.assert_array_equal(np.asarray(t["blk.1.ffn_down.bias"].data), d.numpy())
    # the query rows in ggml's rotary order: per head, HF rows (i, i + dh/2) become (2i, 2i + 1)
    q = baked.hf.model.layers[0].self_attn.q_proj.weight.detach()
    dh = baked.d_head
    order = [h * dh + j // 2 + (dh // 2) * (j % 2) for h in range(baked.n_heads) for j in range(dh)]
    np.testing.assert_array_equal(np.asarray(t["blk.0.attn_q.weight"].data), q[order].numpy())


def test_f16_export_is_the_model_rounded_to_f16(tmp_path):
    m = tiny_model("llama")
    baked = steering.bake_addition(m, steering.AddVector(_vec(m.d_model), layers=[1], alpha=2.0)).model
    p = _export(baked, tmp_path / "h.gguf", dtype="f16")
    r = GGUFReader(p)
    kinds = {x.name: x.tensor_type for x in r.tensors}
    assert kinds["blk.0.ffn_down.weight"] == GGMLQuantizationType.F16
    assert kinds["blk.0.ffn_down.bias"] == kinds["output_norm.weight"] == GGMLQuantizationType.F32
    rounded = from_hf(type(baked.hf)(baked.config), baked.tokenizer)
    with torch.no_grad():
        for (_, a), (_, b) in zip(rounded.hf.named_parameters(), baked.hf.named_parameters(), strict=True):
            a.copy_(b.half().float() if b.dim() > 1 else b)
        got = _load(p, config=baked.config)(IDS).logits
    torch.testing.assert_close(got, _logits(rounded), rtol=0, atol=1e-5)
    assert 0 < _rel(got, _logits(baked)) < 1e-2


def _bpe_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<bos>", "<eos>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator([" ".join(_WORDS[i:i + 12]) for i in range(0, len(_WORDS), 7)], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")


def test_byte_level_bpe_vocabulary_round_trips(tmp_path):
    from transformers import AutoTokenizer

    tok = _bpe_tokenizer()
    m = from_hf(tiny_model("llama", vocab_size=len(tok)).hf, tok, name="bpe-llama")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing left out
        p = export_gguf(m, tmp_path / "t.gguf")
    r = GGUFReader(p)
    assert _field(r, "tokenizer.ggml.model") == "gpt2" and _field(r, "tokenizer.ggml.eos_token_id") == 2
    back = AutoTokenizer.from_pretrained(tmp_path, gguf_file=p.name)
    for s in ["the man is here, 123!", "Hello wörld  two  spaces"]:
        assert back(s).input_ids == tok(s).input_ids


def test_export_refusals(tmp_path):
    m = tiny_model("llama")
    _export(m, tmp_path / "m.gguf")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        _export(m, tmp_path / "m.gguf")
    with pytest.raises(ValueError, match="dtype"):
        export_gguf(m, tmp_path / "q.gguf", dtype="q4_0")
    with pytest.raises(ValueError, match="convert_hf_to_gguf"):
        export_gguf(tiny_model("gpt2"), tmp_path / "g.gguf")


def test_control_vector_structure_and_block_output_semantics(tmp_path):
    m = tiny_model("llama", n_layers=4)
    a, b = _vec(m.d_model, 2), _vec(m.d_model, 3)
    ivs = [steering.AddVector({1: a, 2: b}, layers=[1, 2], alpha=1.5),
           steering.AddVector(a, layers=3, sites="resid_pre", alpha=-0.5)]   # resid_pre 3 is block 2's output
    p = export_control_vector(m, tmp_path / "cv.gguf", *ivs)
    r = GGUFReader(p)
    assert _field(r, "general.architecture") == "controlvector" and _field(r, "controlvector.model_hint") == "llama"
    assert _field(r, "controlvector.layer_count") == 4
    t = {x.name: x for x in r.tensors}
    assert sorted(t) == ["direction.1", "direction.2"]
    assert all(x.tensor_type == GGMLQuantizationType.F32 and len(x.shape) == 1 for x in t.values())
    np.testing.assert_allclose(np.asarray(t["direction.1"].data), (1.5 * a).numpy(), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(t["direction.2"].data), (1.5 * b - 0.5 * a).numpy(), rtol=1e-6, atol=1e-6)

    def add(vec):  # llama.cpp: direction.k is added to block k's output at every position
        return lambda mod, args, out: (out[0] + vec, *out[1:]) if isinstance(out, tuple) else out + vec

    raw = [(m.block(int(n.split(".")[1])), "post", add(torch.from_numpy(np.asarray(x.data).copy()))) for n, x in t.items()]
    with module_hooks(raw), torch.no_grad():
        read = m.hf(IDS).logits
    torch.testing.assert_close(read, _logits(m, *ivs), rtol=0, atol=1e-5)


def test_control_vector_refusals(tmp_path):
    m = tiny_model("llama")
    v = _vec(m.d_model)
    for iv, match in [(steering.AddVector(v, layers=0), "block 0"), (steering.AddVector(v, layers=1, sites="attn_out"),
                                                                     "resid_post"),
                      (steering.AddVector(v, layers=1, scope="generated"), "scope='both'")]:
        with pytest.raises(ValueError, match=match):
            export_control_vector(m, tmp_path / "x.gguf", iv)
    assert not (tmp_path / "x.gguf").exists()
