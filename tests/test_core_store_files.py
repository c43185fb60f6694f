"""The activation store owns only the files it names exactly, and damaged shards are named in the error."""

from __future__ import annotations

import json

import pytest

from interp.capturing import capture
from interp.store import ActivationStore, shard_name
from interp.values import Runtime

PROMPTS = ["How do I bake bread?", "Name a colour.", "What is two plus two?", "Tell me a joke.",
           "Where is Paris?", "Why is the sky blue?"]
KW = dict(sites="resid_post", positions="last", runtime=Runtime(batch_size=2, progress=False))


def test_overwrite_keeps_a_users_dot_tmp_file(tiny_models, tmp_path):
    m = tiny_models("llama")
    out = tmp_path / "s"
    capture(m, PROMPTS, out=out, **KW)
    notes = out / ".my_notes.tmp"
    notes.write_text("mine")
    with pytest.raises(FileExistsError, match="not part of an activation store"):
        capture(m, PROMPTS[:4], out=out, overwrite=True, **KW)
    assert notes.read_text() == "mine"
    assert ActivationStore(out).n_prompts == len(PROMPTS)  # nothing of the store was removed either


def test_resume_removes_a_killed_writers_temp_file_only(tiny_models, tmp_path):
    m = tiny_models("llama")
    out = tmp_path / "s"
    capture(m, PROMPTS, out=out, **KW)
    full = ActivationStore(out).load().tensor.clone()
    # what a writer killed during shard 1 leaves: no shard 1, its temp file, an unfinished manifest
    (out / shard_name(1)).unlink()
    stale = out / f".{shard_name(1)}.k1ll3d_x.tmp"
    stale.write_bytes(b"partial")
    manifest = json.loads((out / "store.json").read_text())
    (out / "store.json").write_text(json.dumps({**manifest, "complete": False}))
    resumed = capture(m, PROMPTS, out=out, **KW)
    assert resumed.complete and not stale.exists()
    assert (resumed.load().tensor == full).all()


def test_truncated_shard_names_the_file(tiny_models, tmp_path):
    m = tiny_models("llama")
    out = tmp_path / "s"
    store = capture(m, PROMPTS, out=out, **KW)
    f = out / shard_name(2)
    f.write_bytes(f.read_bytes()[:-7])
    with pytest.raises(ValueError, match=rf"{shard_name(2)} is truncated.*rerun the capture"):
        store.shard(2)
    f.write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match=rf"{shard_name(2)} is not a readable safetensors file"):
        store.shard(2)


def test_atomic_writes_get_the_usual_permissions(tmp_path):
    import os
    import stat

    from interp.io import write_json

    write_json(tmp_path / "a.json", {"x": 1})
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o666 & ~mask


def test_owned_folder_owns_exact_names_and_their_temp_files_only(tmp_path):
    from interp.io import OwnedFolder

    for name in ("run.json", ".run.json.ab12_x.tmp", "shard_00003.safetensors", "direction", ".my_notes.tmp",
                 "run.json.bak", "notes.txt"):
        (tmp_path / name).mkdir() if name == "direction" else (tmp_path / name).write_text("x")
    f = OwnedFolder(tmp_path, ["run.json", "direction"], [r"shard_\d{5}\.safetensors"])
    assert f.foreign() == [".my_notes.tmp", "notes.txt", "run.json.bak"]
    f.clear(temps_only=True)
    assert not (tmp_path / ".run.json.ab12_x.tmp").exists() and (tmp_path / "run.json").exists()
    f.clear(keep=("direction",))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".my_notes.tmp", "direction", "notes.txt", "run.json.bak"]


_KILLED_WRITER = """
import resource, signal, sys
from interp.capturing import capture
from interp.store import ActivationStore
from interp.testing.tiny import tiny_model

write = ActivationStore.write_shard


def write_shard(self, k, acts, mask=None, **kw):
    if k == 1:  # the file-size limit kills the process (SIGXFSZ) while safetensors writes shard 1
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it by default
        limit = acts.numel() * acts.element_size() // 2
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return write(self, k, acts, mask, **kw)


ActivationStore.write_shard = write_shard
capture(tiny_model("llama"), PROMPTS, out=sys.argv[1], **KW)
"""


def test_a_writer_killed_inside_safetensors_resumes(tiny_models, tmp_path):
    """A process killed mid-shard (by the kernel, no cleanup) leaves the temp files of the write; rerunning the
    capture removes them and the store equals an uninterrupted one."""
    import signal
    import subprocess
    import sys

    from .conftest import REPO

    out, ref = tmp_path / "s", tmp_path / "ref"
    kw = {**KW, "positions": "all"}
    script = f"import torch\nfrom interp.values import Runtime\nPROMPTS = {PROMPTS!r}\nKW = {kw!r}\n" + _KILLED_WRITER
    done = subprocess.run([sys.executable, "-c", script, str(out)], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == -signal.SIGXFSZ, done.stderr[-2000:]
    assert (out / shard_name(0)).exists() and not (out / shard_name(1)).exists()
    left = [p.relative_to(out).as_posix() for p in out.rglob("*") if p.name.startswith(".")]
    assert left, "the kill left no temp file: the test no longer reproduces a kill inside the write"
    m = tiny_models("llama")
    resumed = capture(m, PROMPTS, out=out, **kw)
    assert resumed.complete
    assert sorted(p.name for p in out.iterdir()) == ["shard_00000.safetensors", "shard_00001.safetensors",
                                                     "shard_00002.safetensors", "store.json"]
    whole = capture(m, PROMPTS, out=ref, **kw)
    for k in range(whole.n_shards):
        assert (out / shard_name(k)).read_bytes() == (ref / shard_name(k)).read_bytes()


def test_a_users_file_in_the_store_folder_is_refused_by_name(tiny_models, tmp_path):
    m = tiny_models("llama")
    out = tmp_path / "s"
    capture(m, PROMPTS, out=out, **KW)
    manifest = json.loads((out / "store.json").read_text())
    (out / "store.json").write_text(json.dumps({**manifest, "complete": False}))  # an unfinished store
    (out / ".tmpAbC123").write_bytes(b"not ours")  # even a name like safetensors' temp files is the user's
    with pytest.raises(FileExistsError, match=r"\.tmpAbC123.*choose an empty or new output folder"):
        capture(m, PROMPTS, out=out, **KW)
    assert (out / ".tmpAbC123").read_bytes() == b"not ours"
