"""Data-parallel SAE training: two ranks (gloo, torchrun's environment) train as one process would on the same global
batch (1e-5 after 20 steps), in memory and streaming each rank's own shards of a store; `interp sae train` runs
launched unchanged, rank 0 the one writer."""

from __future__ import annotations

import pytest
import torch

from interp import distributed as dist
from interp.store import ActivationStore
from interp.values import Prompts, Runtime
from sae.model import SAE
from sae.stream import TokenStream
from sae.trainer import TrainConfig, Trainer, train_sae
from tests.conftest import mixed_prompts, run_ranks

D, STEPS = 16, 20
CFG = dict(arch="topk", d_sae=64, k=4, total_tokens=STEPS * 64, batch_size=64, lr=4e-3, progress=False,
           buffer_tokens=256, dead_after_tokens=64)  # a latent silent for one step is dead: AuxK takes part


def _store(path) -> ActivationStore:
    """8 shards of 40 tokens; a token's first feature is its shard's index (so a batch shows where it came from)."""
    g = torch.Generator().manual_seed(0)
    manifest = {"kind": "interp.ActivationStore", "version": 1, "sites": ["blocks.0.hook_resid_post"],
                "positions": "last", "model_id": "synthetic", "d_model": D, "prompt_ids": [str(i) for i in range(320)],
                "labels": None, "batch_size": 40, "n_shards": 8, "dtype": "torch.float32", "meta": {},
                "fingerprint": "test"}
    st = ActivationStore.open_for_writing(path, manifest)
    for k in range(8):
        x = torch.randn(40, 1, D, generator=g)
        x[:, 0, 0] = k
        st.write_shard(k, x)
    st.finish()
    return ActivationStore(path)


def test_rank_streams_split_the_global_batch_or_the_shards(tmp_path):
    x = torch.randn(300, D, generator=torch.Generator().manual_seed(1))
    one = TokenStream(x, 16, seed=3)
    r0, r1 = TokenStream(x, 8, seed=3, rank=0, world=2), TokenStream(x, 8, seed=3, rank=1, world=2)
    for _ in range(40):  # across epochs: the ranks' halves are exactly the one-process batch
        assert torch.equal(torch.cat([next(r0), next(r1)]), next(one))
    store = _store(tmp_path / "st")
    s0, s1 = (TokenStream(store, 16, seed=0, buffer_tokens=64, rank=r, world=2) for r in (0, 1))
    seen = [torch.cat([next(s)[:, 0] for _ in range(20)]) for s in (s0, s1)]  # two epochs of each rank's shards
    assert set(seen[0].tolist()) == {0.0, 2.0, 4.0, 6.0} and set(seen[1].tolist()) == {1.0, 3.0, 5.0, 7.0}
    with pytest.raises(ValueError, match="8 shards for 9 processes"):
        TokenStream(store, 8, rank=0, world=9)


def _ddp_from_store(path: str) -> tuple:
    """One rank: DDP steps streaming its shards; its initial state, the batches it drew and the final state."""
    dist.init_from_env()
    try:
        t = Trainer(ActivationStore(path), TrainConfig(**CFG))
        t.prepare()
        init = ({k: v.clone() for k, v in t.sae.state_dict().items()}, t.scale)
        xs = []
        for _ in range(STEPS):
            xs.append(next(t.stream).clone())
            t.train_one(xs[-1])
        return init, xs, {k: v.clone() for k, v in t.sae.state_dict().items()}, t.tokens_since_fired.clone()
    finally:
        dist.shutdown()


def _close(a: dict, b: dict, atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=atol, msg=k)


def test_ddp_from_a_store_equals_one_process_on_the_same_global_batches(tmp_path):
    store = _store(tmp_path / "st")
    one = Trainer(store, TrainConfig(**CFG))  # first: the ranks fork with its imports done (torch.optim's)
    one.prepare()
    (init0, xs0, end0, fired0), (init1, xs1, end1, fired1) = run_ranks(_ddp_from_store, str(store.path))
    assert {v for x in xs0 for v in x[:, 0].tolist()} <= {0.0, 2.0, 4.0, 6.0}  # each rank read only its shards
    assert {v for x in xs1 for v in x[:, 0].tolist()} <= {1.0, 3.0, 5.0, 7.0}
    _close(end0, end1, atol=0)  # identical replicas
    assert torch.equal(fired0, fired1)
    _close(init0[0], {k: v for k, v in one.sae.state_dict().items()}, atol=0)  # starts where one process would
    assert init0[1] == one.scale == init1[1]
    for a, b in zip(xs0, xs1, strict=True):
        one.train_one(torch.cat([a, b]))
    _close(end0, dict(one.sae.state_dict()))
    assert torch.equal(fired0, one.tokens_since_fired)
    assert (fired0 >= 64).any()  # some latents were dead, so AuxK (over the global batch) took part
    assert any((end0[k] - init0[0][k]).abs().max() > 1e-3 for k in end0)  # it trained: the comparison can fail


def test_interp_sae_train_launched_equals_one_process_training(tiny_folder, tmp_path):
    import interp
    from interp.cli.main import build_parser, main
    from interp.cli.sae_train import train_config
    from interp.models import load_model

    (tmp_path / "p.txt").write_text("\n".join(mixed_prompts(14, seed=5)))
    argv = ["sae", "train", "--model", str(tiny_folder), "--prompts", str(tmp_path / "p.txt"), "--raw",
            "--site", "blocks.1.hook_resid_post", "--d-sae", "64", "--k", "4", "--steps", str(STEPS),
            "--batch-size", "32", "--out", str(tmp_path / "run")]
    model = load_model(str(tiny_folder))
    acts = interp.capture(model, Prompts(mixed_prompts(14, seed=5), chat=False),
                          sites="blocks.1.hook_resid_post", positions="all", runtime=Runtime(progress=False))
    cfg = train_config(build_parser().parse_args(argv), "blocks.1.hook_resid_post")
    cfg.progress = False
    alone = train_sae(acts, cfg)
    assert run_ranks(main, argv) == [0, 0]
    assert (tmp_path / "run" / "run.json").exists() and (tmp_path / "run" / "saelens").is_dir()
    launched = SAE.load(tmp_path / "run" / "sae")
    assert launched.cfg.meta["processes"] == 2
    assert alone.dead_fraction > 0  # dead latents at the end: AuxK took part
    _close(dict(launched.state_dict()), dict(alone.sae.state_dict()))
