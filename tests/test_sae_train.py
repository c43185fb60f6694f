"""SAE training: planted-dictionary recovery, streaming from a store, exact resumption, bad input."""

from __future__ import annotations

import pytest
import torch

from interp.store import ActivationStore
from sae.model import SAE
from sae.quality import evaluate
from sae.stream import TokenStream
from sae.synthetic import planted_dictionary
from sae.trainer import TrainConfig, train_sae

D_IN, N_FEAT, K = 64, 128, 4


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These SAEs are tiny (64 x 192): thousands of sub-millisecond ops, where a second OpenMP thread only adds
    synchronisation (several times slower on a loaded 2-core machine). Restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def planted():
    x, D = planted_dictionary(38_000, D_IN, N_FEAT, K, seed=1)
    return x[:30_000], x[30_000:], D


@pytest.fixture(scope="module")
def trained(planted):
    x, _, _ = planted
    cfg = TrainConfig(d_sae=192, k=K, total_tokens=120_000, batch_size=256, lr=4e-3, progress=False)
    return {arch: train_sae(x, cfg, arch=arch) for arch in ("topk", "batchtopk", "jumprelu")}


def _max_cos(sae: SAE, D: torch.Tensor) -> torch.Tensor:
    W = sae.W_dec.detach()
    W = W / W.norm(dim=1, keepdim=True)
    return (D @ W.T).max(1).values


@pytest.mark.parametrize("arch", ["topk", "batchtopk"])
def test_topk_and_batchtopk_recover_the_planted_dictionary(trained, planted, arch):
    _, x_eval, D = planted
    res = trained[arch]
    cos = _max_cos(res.sae, D)
    print(f"{arch}: mean max cosine {cos.mean():.3f} (min {cos.min():.3f})")
    assert cos.mean() > 0.9
    m = evaluate(res.sae, x_eval)
    assert abs(m.l0 - K) < 0.5 and m.fvu < 0.25
    # a random dictionary of the same size is far from the planted one: the test can fail
    assert _max_cos(SAE(res.sae.cfg, seed=7), D).mean() < 0.6


def test_jumprelu_matches_topk_fvu_at_the_same_l0(trained, planted):
    _, x_eval, _ = planted
    top, jump = evaluate(trained["topk"].sae, x_eval), evaluate(trained["jumprelu"].sae, x_eval)
    print(f"topk L0 {top.l0:.2f} FVU {top.fvu:.3f} | jumprelu L0 {jump.l0:.2f} FVU {jump.fvu:.3f}")
    assert abs(jump.l0 - top.l0) / top.l0 < 0.25
    assert jump.fvu < 1.3 * top.fvu


def test_history_and_folded_scale(trained, planted):
    res = trained["topk"]
    h = res.history
    assert h["fvu"][-1] < 0.5 * h["fvu"][0] and len(h["l0"]) == len(h["tokens"]) > 10
    assert res.input_scale != 1.0  # inputs were normalised while training ...
    x = planted[1][:500]
    m = evaluate(res.sae, x)  # ... and the returned SAE reads raw activations
    assert m.fvu < 0.25
    torch.testing.assert_close(res.sae.W_dec.norm(dim=1), torch.ones(res.sae.d_sae), atol=1e-5, rtol=0)


# --- stores -------------------------------------------------------------------------------------
def _store(path, shards: list[torch.Tensor], masks: list[torch.Tensor] | None = None) -> ActivationStore:
    n = sum(s.shape[0] for s in shards)
    manifest = {"kind": "interp.ActivationStore", "version": 1, "sites": ["blocks.1.hook_resid_post"],
                "positions": "all" if masks else "last", "model_id": "synthetic", "d_model": shards[0].shape[-1],
                "prompt_ids": [str(i) for i in range(n)], "labels": None, "batch_size": shards[0].shape[0],
                "n_shards": len(shards), "dtype": "torch.float32", "meta": {}, "fingerprint": "test"}
    st = ActivationStore.open_for_writing(path, manifest)
    for k, s in enumerate(shards):
        st.write_shard(k, s, None if masks is None else masks[k])
    st.finish()
    return ActivationStore(path)


def test_store_stream_shuffles_without_repeats_and_bounds_memory(tmp_path):
    # 6 shards of 10 prompts x 5 positions, the first two positions padding; token value = its id
    shards, masks, nid = [], [], 0
    for _ in range(6):
        t = torch.zeros(10, 1, 5, 3)
        for p in range(10):
            for j in range(2, 5):
                t[p, 0, j] = nid
                nid += 1
        m = torch.zeros(10, 5, dtype=torch.bool)
        m[:, 2:] = True
        shards.append(t)
        masks.append(m)
    store = _store(tmp_path / "st", shards, masks)
    s = TokenStream(store, batch_size=8, seed=0, buffer_tokens=40)
    ids = torch.cat([next(s)[:, 0] for _ in range(nid // 8)])
    assert ids.unique().numel() == ids.numel() == nid // 8 * 8  # an epoch: no token twice, padding never read
    assert not torch.equal(ids, torch.arange(ids.numel(), dtype=ids.dtype))  # shuffled
    assert s.max_buffered <= 40 + 30  # the buffer plus one shard, never the whole store
    s2 = TokenStream(store, batch_size=8, seed=0, buffer_tokens=40)
    s2.skip(5)
    torch.testing.assert_close(next(s2)[:, 0], ids[40:48])  # replayable: what resumption relies on


def test_training_from_a_store_and_nan_store_error(tmp_path, planted):
    x = planted[0][:4000]
    store = _store(tmp_path / "good", list(x.reshape(8, 500, 1, D_IN)))
    res = train_sae(store, arch="topk", d_sae=128, k=K, total_tokens=20_000, batch_size=250, progress=False,
                    buffer_tokens=1000)
    assert res.sae.site == "blocks.1.hook_resid_post" and res.sae.cfg.model_id == "synthetic"
    assert res.history["fvu"][-1] < res.history["fvu"][0]
    bad = x.reshape(8, 500, 1, D_IN).clone()
    bad[5, 17, 0, 3] = float("nan")
    bad_store = _store(tmp_path / "bad", list(bad))
    with pytest.raises(ValueError, match="shard 5 of the store .* NaN/Inf .*recapture"):
        train_sae(bad_store, arch="topk", d_sae=128, k=K, total_tokens=20_000, batch_size=250, progress=False,
                  buffer_tokens=1000)
    with pytest.raises(ValueError, match="NaN/Inf"):
        train_sae(bad.reshape(-1, D_IN), arch="topk", d_sae=128, k=K, total_tokens=2000, batch_size=250,
                  progress=False)


def test_bad_training_input():
    x = torch.randn(1000, 16)
    with pytest.raises(ValueError, match="k=99 must be between 1 and the latent count d_sae=32"):
        train_sae(x, arch="topk", d_sae=32, k=99, total_tokens=2000, batch_size=100, progress=False)
    with pytest.raises(TypeError, match="cannot train on"):
        train_sae([1, 2, 3], total_tokens=2000, batch_size=100, progress=False)
    with pytest.raises(ValueError, match="less than one batch"):
        TrainConfig(total_tokens=10, batch_size=100)


# --- resumption ---------------------------------------------------------------------------------
class _Stop(Exception):
    pass


@pytest.mark.parametrize("arch,source", [("topk", "store"), ("jumprelu", "tensor")])
def test_interrupted_run_resumes_to_the_same_weights(tmp_path, planted, arch, source):
    x = planted[0][:3000]
    data = _store(tmp_path / "st", list(x.reshape(6, 500, 1, D_IN))) if source == "store" else x
    cfg = TrainConfig(arch=arch, d_sae=96, k=K, total_tokens=60 * 100, batch_size=100, lr=3e-3, progress=False,
                      checkpoint_every=7, buffer_tokens=700, dead_after_tokens=500)
    full = train_sae(data, cfg).sae

    def interrupt(tr):
        if tr.step == 24:
            raise KeyboardInterrupt

    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train_sae(data, cfg, out_dir=out, callback=interrupt)
    assert (out / "checkpoint" / "done.json").exists() and not (out / "sae").exists()
    with pytest.raises(ValueError, match="different settings"):
        train_sae(data, cfg, out_dir=out, lr=1e-3)
    resumed = train_sae(data, cfg, out_dir=out)
    assert resumed.steps == 60 and len(resumed.history["step"]) == len(train_sae(data, cfg).history["step"])
    for name, p in full.state_dict().items():
        torch.testing.assert_close(resumed.sae.state_dict()[name], p, atol=1e-6, rtol=0, msg=name)
    assert (out / "sae" / "meta.json").exists()
    with pytest.raises(FileExistsError, match="already holds a trained SAE"):
        train_sae(data, cfg, out_dir=out)


def test_training_from_activations_picks_the_site(planted):
    from interp.activations import Activations

    x = planted[0][:2000].reshape(100, 20, D_IN)
    t = torch.stack([x, x.flip(0)], 1)  # [prompts, sites, positions, d]
    mask = torch.ones(100, 20, dtype=torch.bool)
    mask[:, :5] = False  # left padding: never trained on
    t[:, :, :5] = float("nan")
    acts = Activations(t, sites=["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"], positions="all",
                       model_id="m", mask=mask)
    with pytest.raises(ValueError, match="pass site="):
        train_sae(acts, arch="topk", d_sae=64, k=K, total_tokens=1000, batch_size=100, progress=False)
    res = train_sae(acts, arch="topk", d_sae=64, k=K, total_tokens=3000, batch_size=100, progress=False,
                    site="resid_post.1")
    assert res.sae.site == "blocks.1.hook_resid_post" and res.sae.cfg.model_id == "m"
    assert torch.isfinite(res.sae.W_dec).all()
