"""Data-parallel capture: `torchrun --nproc_per_node 2` of `interp capture` writes the same store, byte for byte, as
one process, resuming each rank's own shards; the distributed helpers are the identity without a process group."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import interp
from interp import distributed as dist
from interp.cli.main import main
from interp.models import load_model
from interp.store import MANIFEST, ActivationStore, shard_name
from tests.conftest import mixed_prompts, torchrun


def test_helpers_are_the_identity_without_a_process_group(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    assert not dist.launched() and not dist.active() and not dist.init_from_env()
    assert (dist.rank(), dist.world_size(), dist.local_rank(), dist.is_main()) == (0, 1, 0, True)
    assert all(dist.owns(k) for k in range(5)) and dist.gather_objects({"a": 1}) == [{"a": 1}]
    assert dist.on_main(lambda: 7) == 7 and dist.device_for("cuda") == "cuda"
    dist.barrier()
    dist.agree(None)
    with pytest.raises(KeyError, match="mine"):
        dist.agree(KeyError("mine"))
    t = torch.tensor([1.0, 2.0])
    assert dist.all_reduce_(t, "max") is t and t.tolist() == [1.0, 2.0]
    assert dist.process_info() == {"world_size": 1, "backend": None}
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert dist.launched() and dist.local_rank() == 1 and dist.device_for("cuda") == "cuda:1"


def test_capture_refuses_to_split_without_a_process_group(tiny_models, tmp_path, monkeypatch):
    m = tiny_models("llama")
    with pytest.raises(ValueError, match="init_from_env"):
        interp.capture(m, ["the a"], runtime=interp.Runtime(distributed=True, progress=False))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="every process would write the whole store.*init_from_env"):
        interp.capture(m, ["the a"], out=tmp_path / "s", runtime=interp.Runtime(progress=False))
    assert not (tmp_path / "s").exists()
    st = interp.capture(m, ["the a"], out=tmp_path / "s",
                        runtime=interp.Runtime(progress=False, distributed=False))  # one rank's own call
    assert st.complete and st.manifest["process"]["world_size"] == 1


def test_cli_refuses_commands_that_are_not_data_parallel_under_a_launcher(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["info", "--model", "nonexistent-model"]) == 2
    assert "does not run data-parallel; launch it without torchrun" in capsys.readouterr().err


def test_finish_refuses_a_store_with_missing_shards(tiny_models, tmp_path):
    st = interp.capture(tiny_models("llama"), interp.Prompts(mixed_prompts(4), chat=False),
                        out=tmp_path / "s", runtime=interp.Runtime(batch_size=2, progress=False))
    (tmp_path / "s" / shard_name(1)).unlink()
    with pytest.raises(RuntimeError, match=r"lacks shards \[1\].*rerun the capture"):
        st.finish()


def test_torchrun_capture_equals_one_process_byte_for_byte_and_resumes_per_rank(tiny_folder, tmp_path):
    prompts = mixed_prompts(11, seed=3)
    (tmp_path / "p.txt").write_text("\n".join(prompts))
    args = dict(sites="resid_post", positions="all",
                runtime=interp.Runtime(batch_size=3, sort_by_length=True, progress=False))
    one = interp.capture(load_model(str(tiny_folder)), interp.Prompts(prompts, chat=False),
                         out=tmp_path / "one", **args)
    assert one.n_shards == 4  # rank 0 owns shards 0 and 2, rank 1 shards 1 and 3
    # a run of two processes that stopped after rank 1 wrote shard 1 and rank 0 shard 2 (shards 0 and 3 missing)
    two = tmp_path / "two"
    shutil.copytree(tmp_path / "one", two)
    for k in (0, 3):
        (two / shard_name(k)).unlink()
    manifest = json.loads((two / MANIFEST).read_text())
    manifest["complete"] = False
    manifest.pop("process")
    (two / MANIFEST).write_text(json.dumps(manifest))
    kept = {k: (two / shard_name(k)).stat().st_mtime_ns for k in (1, 2)}
    torchrun("capture", "--model", str(tiny_folder), "--prompts", str(tmp_path / "p.txt"), "--sites", "resid_post",
             "--positions", "all", "--batch-size", "3", "--raw", "--sort-by-length", "--out", str(two))
    for k in range(one.n_shards):
        assert (two / shard_name(k)).read_bytes() == (tmp_path / "one" / shard_name(k)).read_bytes(), k
    assert {k: (two / shard_name(k)).stat().st_mtime_ns for k in (1, 2)} == kept  # each rank kept its own shards
    a, b = json.loads((tmp_path / "one" / MANIFEST).read_text()), json.loads((two / MANIFEST).read_text())
    assert a.pop("process") == {"world_size": 1, "backend": None}
    assert b.pop("process") == {"world_size": 2, "backend": "gloo"}
    assert a == b and b["complete"]
    assert sorted(b["sink_counts"]["shards"]) == ["0", "1", "2", "3"]       # every rank's shards, counted at finish
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in (tmp_path / "one").iterdir())
    torch.testing.assert_close(ActivationStore(two).load().tensor, one.load().tensor, rtol=0, atol=0)
