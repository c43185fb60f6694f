"""The activation store owns only the files it names exactly, and damaged shards are named in the error."""

from __future__ import annotations

import json

import pytest

from interp.capturing import capture
from interp.store import ActivationStore, shard_name

PROMPTS = ["How do I bake bread?", "Name a colour.", "What is two plus two?", "Tell me a joke.",
           "Where is Paris?", "Why is the sky blue?"]
KW = dict(sites="resid_post", positions="last", batch_size=2, progress=False)


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
