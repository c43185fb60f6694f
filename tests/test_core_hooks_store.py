"""Hooks (editing, nesting, cleanup), the on-disk store, specs, loading and bad input."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from interp.activations import Activations
from interp.capturing import capture
from interp.hooking import count_hooks, hooks
from interp.store import ActivationStore
from interp.values import Prompts, Runtime

PROMPTS = ["the man said to the boy", "what is the good word", "help", "where is the old house by the water now ?",
           "tell me a kind word", "the water is low", "why do they play", "give me the name"]


def _logits(m, text="the man said to the boy"):
    ids = m.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        return m.hf(**ids).logits


def test_hook_edits_change_output_and_nest(tiny_models):
    m = tiny_models("llama")
    n0 = count_hooks(m.hf)
    base = _logits(m)
    with hooks(m, {"resid_post.0": lambda x, ctx: x * 0.5}):
        half = _logits(m)
        with hooks(m, {"blocks.0.hook_resid_post": lambda x, ctx: x * 2.0}):
            back = _logits(m)  # the two hooks compose: x * 0.5 * 2
    assert (half - base).abs().max() > 1e-3
    torch.testing.assert_close(back, base, atol=1e-5, rtol=0)
    assert count_hooks(m.hf) == n0


def test_resid_mid_write_edits_the_stream(tiny_models):
    """Writing resid_mid changes the stream exactly: capture after the edit sees the edited value."""
    m = tiny_models("llama")
    seen = {}
    with hooks(m, [("resid_mid.1", lambda x, ctx: torch.zeros_like(x)),
                   ("resid_post.1", lambda x, ctx: seen.setdefault("post", x.clone())),
                   ("mlp_out.1", lambda x, ctx: seen.setdefault("mlp", x.clone()))]):
        _logits(m)
    torch.testing.assert_close(seen["post"], seen["mlp"], atol=1e-6, rtol=0)  # post = mid (0) + mlp(0-input)


def test_hooks_removed_when_user_code_raises(tiny_models):
    m = tiny_models("mixtral")
    n0 = count_hooks(m.hf)
    with pytest.raises(RuntimeError, match="boom"):
        with hooks(m, {"resid_pre.1": lambda x, ctx: None, "attn_z.0": lambda x, ctx: None}):
            assert count_hooks(m.hf) > n0
            raise RuntimeError("boom")
    assert count_hooks(m.hf) == n0

    def bad(x, ctx):
        raise ValueError("inside the forward")

    with pytest.raises(ValueError, match="inside the forward"):
        with hooks(m, {"resid_mid.0": bad}):
            _logits(m)
    assert count_hooks(m.hf) == n0
    with pytest.raises(ValueError, match="out of range"):
        capture(m, PROMPTS, sites=["resid_post.0", "resid_post.9"], runtime=Runtime(progress=False))
    assert count_hooks(m.hf) == n0


def test_hook_returning_wrong_shape_is_an_error(tiny_models):
    m = tiny_models("llama")
    n0 = count_hooks(m.hf)
    with pytest.raises(ValueError, match="returned shape"):
        with hooks(m, {"resid_post.0": lambda x, ctx: x[..., :3]}):
            _logits(m)
    assert count_hooks(m.hf) == n0


def test_attn_z_and_mlp_post_shapes(tiny_models):
    m = tiny_models("qwen2")
    got = {}
    with hooks(m, {"attn_z.0": lambda x, ctx: got.update(z=x.shape),
                   "mlp_post.1": lambda x, ctx: got.update(n=x.shape)}):
        _logits(m)
    assert got["z"][-2:] == (m.n_heads, m.d_head)
    assert got["n"][-1] == m.config.intermediate_size


def _digest(folder: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())}


def test_store_resumes_byte_identical(tiny_models, tmp_path):
    m = tiny_models("llama")
    kw = dict(sites=["resid_pre", "resid_post"], positions="all", runtime=Runtime(batch_size=2, progress=False))
    given = Prompts(PROMPTS, labels=list(range(8)))
    full = capture(m, given, out=tmp_path / "full", **kw)
    seen = []

    def interrupt_third_batch(x, ctx):  # the user pressing Ctrl-C while batch 2 runs
        seen.append(1)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), hooks(m, {"resid_pre.0": interrupt_third_batch}):
        capture(m, given, out=tmp_path / "part", **kw)
    part = ActivationStore(tmp_path / "part")
    assert not part.complete and part.has_shard(1) and not part.has_shard(2)
    resumed = capture(m, given, out=tmp_path / "part", **kw)
    assert resumed.complete and full.complete
    assert _digest(tmp_path / "full") == _digest(tmp_path / "part")
    mem = capture(m, given, **kw)
    loaded = resumed.load()
    torch.testing.assert_close(loaded.tensor, mem.tensor)
    assert torch.equal(loaded.mask, mem.mask) and loaded.labels == list(range(8))
    shard = resumed.shard(0)
    P = shard.tensor.shape[2]
    torch.testing.assert_close(shard.tensor, mem.tensor[:2, :, -P:])


def test_store_refuses_to_overwrite(tiny_models, tmp_path):
    m = tiny_models("llama")
    capture(m, PROMPTS[:2], out=tmp_path / "s", runtime=Runtime(progress=False))
    with pytest.raises(FileExistsError, match="overwrite=True"):
        capture(m, PROMPTS[:2], out=tmp_path / "s", runtime=Runtime(progress=False))
    with pytest.raises(FileExistsError, match="overwrite=True"):
        capture(m, PROMPTS[:3], out=tmp_path / "s", runtime=Runtime(progress=False))  # another run
    capture(m, PROMPTS[:3], out=tmp_path / "s", overwrite=True, runtime=Runtime(progress=False))
    assert ActivationStore(tmp_path / "s").n_prompts == 3
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="not part of an activation store"):
        capture(m, PROMPTS[:2], out=user, overwrite=True, runtime=Runtime(progress=False))
    assert (user / "notes.txt").read_text() == "precious"


def test_activations_save_load_roundtrip(tiny_models, tmp_path):
    m = tiny_models("gpt2")
    acts = capture(m, Prompts(PROMPTS[:3], labels=["a", "b", "a"]), sites="resid_post",
                   positions="post_instruction", runtime=Runtime(progress=False))
    acts.save(tmp_path / "a")
    back = Activations.load(tmp_path / "a")
    assert torch.equal(back.tensor, acts.tensor) and torch.equal(back.mask, acts.mask)
    assert back.sites == acts.sites and back.labels == acts.labels and back.model_id == acts.model_id
    with pytest.raises(FileExistsError, match="overwrite=True"):
        acts.save(tmp_path / "a")
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["positions"] == "post_instruction"


BOUNDED = textwrap.dedent("""
    import resource, sys, torch
    from interp.testing.tiny import tiny_model
    from interp.capturing import capture
    from interp.store import ActivationStore
    from interp.values import Runtime
    torch.set_num_threads(1)
    m = tiny_model("llama", d_model=128, n_layers=4)
    words = "the man said to the boy what is the good word where is the old house by the water".split()
    prompts = [" ".join(words[(i + j) % len(words)] for j in range(40)) for i in range(1200)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    store = capture(m, prompts, sites=["resid_pre", "resid_mid", "resid_post"], positions="all",
                    out=sys.argv[1], runtime=Runtime(batch_size=16, progress=False))
    after_write = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    total = 0.0
    for shard in ActivationStore(sys.argv[1]).iter_shards():
        total += float(shard.tensor[:, 0, -1].sum())
    after_read = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    size = sum(f.stat().st_size for f in __import__("pathlib").Path(sys.argv[1]).iterdir())
    print(before, after_write, after_read, size)
""")


def test_store_memory_is_bounded(tmp_path):
    """A store much larger than the memory growth we allow is written and read with bounded memory."""
    out = subprocess.run([sys.executable, "-c", BOUNDED, str(tmp_path / "big")], capture_output=True, text=True,
                         check=True)
    before, after_write, after_read, size = map(int, out.stdout.split()[-4:])
    growth_kb = max(after_write, after_read) - before
    assert size > 250e6, f"store only {size} bytes; the test must write more than the allowed growth"
    assert growth_kb * 1024 < size / 4, f"RSS grew {growth_kb} kB for a {size / 1e6:.0f} MB store"
