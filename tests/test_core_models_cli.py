"""Specs for every family, loading (folders, GGUF, embedded, SmolLM2), the CLI and bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

import interp
from interp.arch import SPECS, register_spec, spec_for
from interp.capturing import capture
from interp.testing.tiny import FAMILIES, MOE_FAMILIES, tiny_config, tiny_model

from .conftest import REPO, shared_path

PROMPTS = ["the man said to the boy", "what is the good word"]


@pytest.mark.parametrize("family", FAMILIES)
def test_spec_names_every_writer(tiny_models, family):
    m = tiny_models(family)
    spec = m.spec
    assert spec.is_moe == (family in MOE_FAMILIES)
    block = m.block(0)
    for path in (spec.attn_proj, spec.attn_out, spec.mlp_out, *spec.norms):
        assert m.module(path, 0) is not None
    if spec.is_moe:
        experts = m.module(spec.experts, 0)
        down = getattr(experts, spec.expert_down)
        assert down.dim() == 3 and down.shape[1] == m.d_model  # fused [E, d_model, ffn]
        assert m.module(spec.router, 0) is not None
        assert (spec.shared_expert is not None) == (family == "qwen2_moe")
    else:
        assert m.module(spec.mlp_proj, 0) is not None
    assert spec.post_sublayer_norms == (family in ("gemma2", "gemma3_text", "olmo2"))
    assert spec.parallel_residual == (family == "gpt_neox")
    assert block is m.blocks[0]


def test_unknown_architecture_error_shows_how_to_register():
    class Weird(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = type("C", (), {"model_type": "weirdformer"})()
            self.stack = torch.nn.ModuleList([torch.nn.Linear(4, 4)])

    with pytest.raises(ValueError, match="register_spec") as e:
        spec_for(Weird())
    assert "weirdformer" in str(e.value)


def test_standard_layout_is_inferred_and_registration_works():
    m = tiny_model("llama")
    m.hf.config.model_type = "my_llama_clone"
    spec = spec_for(m.hf)
    assert "inferred" in spec.family and spec.layers == "model.layers"
    register_spec("my_llama_clone", SPECS["llama"])
    try:
        assert spec_for(m.hf).family == "llama"
    finally:
        SPECS.pop("my_llama_clone")


def test_register_spec_refuses_to_replace_a_spec_silently():
    before = SPECS["llama"]
    with pytest.raises(ValueError, match="replace=True"):
        register_spec("llama", SPECS["gpt2"])
    assert SPECS["llama"] is before
    register_spec("llama", before, replace=True)  # explicit replacement is allowed
    assert SPECS["llama"] is before


def test_bad_sites_and_prompts(tiny_models):
    m = tiny_models("llama")
    with pytest.raises(ValueError, match="unknown site"):
        capture(m, PROMPTS, sites="resid_sideways.0", runtime=interp.Runtime(progress=False))
    with pytest.raises(ValueError, match=r"layer 7 is out of range; this model has layers 0..1"):
        capture(m, PROMPTS, sites="blocks.7.hook_resid_post", runtime=interp.Runtime(progress=False))
    with pytest.raises(ValueError, match="prompt list is empty"):
        capture(m, [], runtime=interp.Runtime(progress=False))
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        capture(m, ["fine", "   "], runtime=interp.Runtime(progress=False))
    with pytest.raises(TypeError, match="not a single string"):
        capture(m, "one prompt", runtime=interp.Runtime(progress=False))
    with pytest.raises(ValueError, match="context is 128 tokens"):
        capture(m, ["the " * 200], runtime=interp.Runtime(progress=False))
    with pytest.raises(ValueError, match="unknown position rule"):
        capture(m, PROMPTS, positions="middle", runtime=interp.Runtime(progress=False))
    with pytest.raises(ValueError, match="resid_post.3"):
        interp.sites.parse_site("resid_post")
    assert interp.sites.parse_site("resid_post.-1", n_layers=2).layer == 1
    neox = tiny_models("gpt_neox")
    with pytest.raises(ValueError, match="parallel residual"):
        capture(neox, PROMPTS, sites="resid_mid.0", runtime=interp.Runtime(progress=False))


def test_plain_fallback_without_chat_template(tiny_models):
    m = tiny_model("llama")
    m.tokenizer.chat_template = None
    with pytest.warns(UserWarning, match="no chat template"):
        acts = capture(m, PROMPTS, sites="resid_post.0", positions="post_instruction",
                       runtime=interp.Runtime(progress=False))
    assert acts.tensor.shape[2] >= 1


def test_load_hf_folder_roundtrip(tmp_path):
    m = tiny_model("qwen2")
    m.hf.save_pretrained(tmp_path / "q")
    m.tokenizer.save_pretrained(tmp_path / "q")
    loaded = interp.load_model(str(tmp_path / "q"))
    assert loaded.spec.family == "qwen2" and loaded.tokenizer.padding_side == "left"
    a = capture(m, PROMPTS, runtime=interp.Runtime(progress=False))
    b = capture(loaded, PROMPTS, runtime=interp.Runtime(progress=False))
    torch.testing.assert_close(a.tensor, b.tensor, atol=1e-6, rtol=0)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        interp.load_model(str(tmp_path))
    # accelerate's device_map path (a dispatched model) captures the same numbers
    mapped = interp.load_model(str(tmp_path / "q"), device_map="auto")
    torch.testing.assert_close(capture(mapped, PROMPTS,
                                       runtime=interp.Runtime(progress=False)).tensor, a.tensor, atol=1e-6, rtol=0)


def test_stories260k_gguf_loads_and_captures(tmp_path, monkeypatch):
    gguf = shared_path("models", "stories260K.gguf")
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path))
    m = interp.load_model(str(gguf))
    assert m.spec.family == "llama" and m.n_layers == 5 and m.d_model == 64
    acts = capture(m, interp.Prompts(["Once upon a time there was a little cat"], chat=False),
                   sites="resid_post", positions="all", runtime=interp.Runtime(progress=False))
    ids = m.tokenizer("Once upon a time there was a little cat", return_tensors="pt")
    with torch.no_grad():
        hs = m.hf(**ids, output_hidden_states=True).hidden_states
    torch.testing.assert_close(acts.site("resid_post.3")[0], hs[4][0], atol=1e-5, rtol=0)
    cached = list((tmp_path / "gguf").iterdir())
    assert len(cached) == 1 and (cached[0] / "config.json").exists()
    again = interp.load_model(str(gguf))  # second load reads the dequantised folder
    torch.testing.assert_close(again.hf.lm_head.weight, m.hf.lm_head.weight)
    # the folder is named by the file's content: a copy elsewhere (another environment) reuses it, and a file
    # that differs in one byte of its last tensor gets its own
    (tmp_path / "elsewhere").mkdir()
    copy = tmp_path / "elsewhere" / gguf.name
    shutil.copyfile(gguf, copy)
    interp.load_model(str(copy))
    assert [p.name for p in (tmp_path / "gguf").iterdir()] == [cached[0].name]
    raw = bytearray(copy.read_bytes())
    raw[-4] ^= 1
    copy.write_bytes(bytes(raw))
    interp.load_model(str(copy))
    assert len(list((tmp_path / "gguf").iterdir())) == 2
    # the model is a real pretrained one: it continues a story better than chance
    with torch.no_grad():
        loss = m.hf(**ids, labels=ids["input_ids"]).loss
    assert loss < 4.0  # uniform over 512 tokens would be 6.24


@pytest.mark.slow
def test_smollm2_loads_and_captures():
    m = interp.load_model("smollm2-135m-instruct")
    assert m.n_layers == 30 and m.d_model == 576
    acts = capture(m, ["Hello, how are you?", "Write a haiku about rain."], sites="resid_post",
                   positions="post_instruction", runtime=interp.Runtime(progress=False))
    text = interp.format_prompts(m, ["Hello, how are you?"])[0]
    ids = m.tokenizer(text, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        hs = m.hf(**ids, output_hidden_states=True).hidden_states
    P = acts.tensor.shape[2]
    torch.testing.assert_close(acts.site("resid_post.10")[0, -P:][acts.mask[0, -P:]], hs[11][0, -int(acts.mask[0].sum()):],
                               atol=1e-4, rtol=0)


def test_embedded_default_loads():
    folder = REPO / "interp" / "embedded" / "organism"
    if not (folder / "config.json").exists():
        pytest.fail("the embedded organism is missing; run python -m interp.organisms.train")
    m = interp.load_model("organism")
    assert m.spec.family == "llama" and interp.format_prompts(m, ["hi"])[0]


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "interp.cli.main", *args], capture_output=True, text=True, cwd=cwd)


def test_cli_info_and_capture(tmp_path):
    m = tiny_model("gpt2")
    m.hf.save_pretrained(tmp_path / "g")
    m.tokenizer.save_pretrained(tmp_path / "g")
    r = _cli("info", "--model", str(tmp_path / "g"))
    assert r.returncode == 0, r.stderr
    assert "gpt2" in r.stdout and "layers" in r.stdout and "hook_resid_post" in r.stdout
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"instruction": p}) for p in PROMPTS * 3))
    out = tmp_path / "store"
    r = _cli("capture", "--model", str(tmp_path / "g"), "--prompts", str(prompts), "--sites", "resid_pre,resid_post",
             "--positions", "all", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "blocks.1.hook_resid_post" in r.stdout and "mean norm" in r.stdout
    assert interp.ActivationStore(out).n_prompts == 6
    r = _cli("capture", "--model", str(tmp_path / "g"), "--prompts", str(prompts), "--out", str(out))
    assert r.returncode == 2 and "overwrite" in r.stderr
    r = _cli("capture", "--model", str(tmp_path / "g"), "--prompts", str(prompts), "--column", "nope", "--out",
             str(tmp_path / "s2"))
    assert r.returncode == 2 and "column 'nope' does not exist" in r.stderr


def test_tiny_config_rejects_unknown_family():
    with pytest.raises(ValueError, match="unknown tiny family"):
        tiny_config("transformer-xl")


def test_unknown_model_names_fail_at_once_with_the_accepted_forms(monkeypatch, tmp_path):
    """Each bad name fails before any network attempt (so no Hub retries): no name lookup, no connect."""
    import socket

    from interp.models import load_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    attempts: list[object] = []

    def refuse(*args, **kwargs):  # name lookup or connect: either is a network attempt
        attempts.append(args[:2])
        raise socket.gaierror(f"the test refuses network access {args[:2]}")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    with pytest.raises(ValueError, match=r"did you mean 'smollm2-135m-instruct'.*built-in names"):
        load_model("smollm2-360m-instruct")
    with pytest.raises(FileNotFoundError, match=r"HF_HUB_OFFLINE.*organism-base"):
        load_model("someone/not-a-cached-model")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(str(tmp_path / "missing.gguf"))
    assert attempts == []  # no connection tried, so no Hub retries
