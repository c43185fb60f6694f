"""Crosscoders (sae.crosscoder, sae.crosscoder_analysis): the loss of both kinds against a direct computation, latent
scaling against a direct least-squares fit, norm ratios and classes, exact resumption, training from two stores and
from two models on the fly (tiny random models), steering with a crosscoder latent, save / load, bad input."""

from __future__ import annotations

import copy

import pytest
import torch

from interp.hooking import hooks
from interp.testing.tiny import tiny_model
from sae.crosscoder import Crosscoder, PairedStore, capture_paired, check_models, paired, train_crosscoder
from sae.crosscoder_analysis import Classes, classify, cross_contexts, cross_diff, latent_scaling, norm_ratios
from sae.edits import LatentSteering
from sae.losses import train_step
from sae.train_config import TrainConfig

D = 16


def _cc(arch: str = "crosscoder_batchtopk", d_sae: int = 48, k: int | None = 4, seed: int = 0) -> Crosscoder:
    cc = Crosscoder.build(D, d_sae, arch, k, models=("base", "tuned"), site="blocks.1.hook_resid_post", seed=seed)
    with torch.no_grad():  # unequal per-model norms, so the norm weighting matters
        g = torch.Generator().manual_seed(seed + 1)
        cc.W_dec.mul_(torch.rand(d_sae, 2 * D, generator=g) * 2)
        cc.b_enc.normal_(0, 0.1, generator=g)
        cc.b_dec.normal_(0, 0.1, generator=g)
    return cc


def _pair(n: int = 512, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two models' activations: six shared directions, one the tuned model alone writes (at three times the scale)
    and one that only the base writes."""
    g = torch.Generator().manual_seed(seed)
    basis = torch.randn(8, D, generator=g)
    coef = torch.rand(n, 8, generator=g) * (torch.rand(n, 8, generator=g) < 0.2)  # sparse, as features are
    a = coef[:, :6] @ basis[:6] + coef[:, 6:7] * basis[6]
    b = coef[:, :6] @ basis[:6] + coef[:, 7:8] * basis[7] * 3
    return a + 0.01 * torch.randn(n, D, generator=g), b + 0.01 * torch.randn(n, D, generator=g)


def _opts() -> dict:
    return {"sparse": False, "backend": "torch", "k_aux": 4, "bandwidth": 0.1, "target_l0": None}


# --- the loss -------------------------------------------------------------------------------------------------
def test_batchtopk_crosscoder_loss_equals_a_direct_computation():
    cc = _cc()
    xa, xb = _pair(64)
    x = torch.cat([xa, xb], -1)
    out = train_step(cc, x, torch.zeros(cc.d_sae, dtype=torch.bool), {"sparsity": 0.0, "aux": 0.0, "preact": 0.0},
                     _opts())
    with torch.no_grad():
        pre = (x - cc.b_dec) @ cc.W_enc + cc.b_enc
        w = cc.W_dec.reshape(cc.d_sae, 2, D).norm(dim=-1).sum(-1)
        score = torch.relu(pre) * w
        keep = torch.zeros(score.numel(), dtype=torch.bool)
        keep[score.flatten().topk(64 * 4).indices] = True
        z = torch.where(keep.reshape(score.shape), torch.relu(pre), torch.zeros_like(pre))
        x_hat = z @ cc.W_dec + cc.b_dec
        mse = (x_hat - x).pow(2).sum(-1).mean()
    torch.testing.assert_close(out.x_hat, x_hat, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.mse, mse, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(out.loss.detach(), mse, atol=1e-5, rtol=1e-6)
    assert out.l0 == pytest.approx(float((z > 0).sum()) / 64)
    assert out.min_active == pytest.approx(float(score.flatten().topk(64 * 4).values.min()), rel=1e-5)


def test_l1_crosscoder_loss_equals_a_direct_computation():
    cc = _cc("crosscoder_relu", k=None)
    xa, xb = _pair(64)
    x = torch.cat([xa, xb], -1)
    out = train_step(cc, x, torch.zeros(cc.d_sae, dtype=torch.bool), {"sparsity": 0.7, "aux": 0.0, "preact": 0.0},
                     _opts())
    with torch.no_grad():
        z = torch.relu((x - cc.b_dec) @ cc.W_enc + cc.b_enc)
        norms = cc.W_dec[:, :D].norm(dim=1) + cc.W_dec[:, D:].norm(dim=1)
        mse = (z @ cc.W_dec + cc.b_dec - x).pow(2).sum(-1).mean()
        l1 = (z * norms).sum(-1).mean()
    torch.testing.assert_close(out.loss.detach(), mse + 0.7 * l1, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(out.sparsity, l1, atol=1e-5, rtol=1e-6)


def test_inference_keeps_the_latents_whose_norm_weighted_score_passes_the_threshold():
    cc = _cc()
    with torch.no_grad():
        cc.threshold.fill_(0.3)
    x = torch.cat(_pair(32), -1)
    pre = cc.pre_acts(x)
    w = cc.decoder_norms().sum(-1)
    want = torch.relu(pre) * (torch.relu(pre) * w > 0.3)
    torch.testing.assert_close(cc.encode(x), want)
    torch.testing.assert_close(cc.decode_models(cc.encode(x)).flatten(-2), cc.decode(cc.encode(x)))


# --- latent scaling, norm ratios, classes ---------------------------------------------------------------------
def test_latent_scaling_equals_a_direct_least_squares_fit():
    cc = _cc("crosscoder_relu", k=None)
    xa, xb = _pair(300)
    lat = [i for i in range(cc.d_sae) if (cc.encode(cc.join(xa, xb))[:, i] > 0).sum() > 3][:5]
    s = latent_scaling(cc, (xa, xb), lat, batch_size=77)
    z = cc.encode(cc.join(xa, xb)).double()
    rec = cc.decode_models(cc.encode(cc.join(xa, xb))).double()
    xs = torch.stack([xa, xb], 1).double()
    dec = cc.decoders().double()
    for row, j in enumerate(lat):
        d, f = dec[j, 1], z[:, j]
        A = (f[:, None] * d).reshape(-1, 1)
        for m in range(2):
            own = f[:, None] * dec[j, m]
            for t, target in enumerate((xs[:, m] - rec[:, m] + own, rec[:, m] - own)):
                beta = torch.linalg.lstsq(A, target.reshape(-1, 1)).solution.item()
                assert float(s.beta[row, t, m]) == pytest.approx(beta, rel=1e-5, abs=1e-6)
    torch.testing.assert_close(s.nu_error, s.beta[:, 0, 0] / s.beta[:, 0, 1])


def test_norm_ratios_and_classes():
    cc = _cc(d_sae=6)
    with torch.no_grad():
        cc.W_dec.zero_()
        cc.W_dec[0, :D] = 1.0          # base only
        cc.W_dec[1, D:] = 1.0          # tuned only
        cc.W_dec[2] = 1.0              # shared
        cc.W_dec[3, :D], cc.W_dec[3, D:] = 1.0, 3.0   # ratio 0.75: other
        cc.W_dec[4, :D], cc.W_dec[4, D:] = 1.0, 9.5   # ratio 0.905: tuned-only
    r = norm_ratios(cc)
    torch.testing.assert_close(r[:5], torch.tensor([0.0, 1.0, 0.5, 0.75, 9.5 / 10.5]))
    assert r[5].isnan()
    assert classify(r) == ["base-only", "tuned-only", "shared", "other", "tuned-only", "dead"]
    assert classify(r, Classes(tuned_only=0.95))[4] == "other"
    with pytest.raises(ValueError, match="base_only < shared"):
        Classes(base_only=0.5)


@pytest.mark.parametrize("arch", ["crosscoder_batchtopk", "crosscoder_relu"])
def test_planted_tuned_only_and_base_only_directions_get_their_own_latents(arch):
    g = torch.Generator().manual_seed(3)
    basis = torch.randn(8, D, generator=g)
    which = torch.randint(0, 8, (4096,), generator=g)  # one feature per token: 0-5 shared, 6 base-only, 7 tuned-only
    coef = torch.nn.functional.one_hot(which, 8).float() * (0.5 + torch.rand(4096, 1, generator=g))
    xa, xb = coef[:, :7] @ basis[:7], coef[:, :6] @ basis[:6] + coef[:, 7:8] * basis[7] * 2
    res = train_crosscoder((xa, xb), TrainConfig(arch=arch, d_sae=16, k=1, total_tokens=300 * 256, batch_size=256,
                                                 lr=1e-2, l1_coefficient=1.0, progress=False))
    cd = cross_diff(res.sae, (xa, xb))
    assert res.history["fvu"][-1] < 0.05
    dec = res.sae.decoders().detach()
    for cls, m, feat in (("tuned-only", 1, 7), ("base-only", 0, 6)):
        lats = [j for j in cd.of(cls) if cd.freq[j] > 0]
        assert lats, cd.counts()
        cos = torch.nn.functional.cosine_similarity(dec[lats, m], basis[feat][None], dim=-1)
        assert float(cos.max()) > 0.9
    true = cd.true_tuned_only()
    assert true and all(j in cd.of("tuned-only") for j in true)
    assert len(cd.to_frame()) == 16 and cd.summary()["counts"] == cd.counts()


# --- training: resumption, stores, on the fly -----------------------------------------------------------------
def test_interrupted_crosscoder_run_resumes_to_the_same_weights(tmp_path):
    xa, xb = _pair(2000)
    cfg = TrainConfig(arch="crosscoder_batchtopk", d_sae=32, k=4, total_tokens=40 * 100, batch_size=100, lr=3e-3,
                      progress=False, checkpoint_every=7, dead_after_tokens=500)
    full = train_crosscoder((xa, xb), cfg).sae

    def interrupt(tr):
        if tr.step == 17:
            raise KeyboardInterrupt

    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train_crosscoder((xa, xb), cfg, out_dir=out, callback=interrupt)
    resumed = train_crosscoder((xa, xb), cfg, out_dir=out)
    assert resumed.steps == 40 and isinstance(resumed.sae, Crosscoder)
    for name, p in full.state_dict().items():
        torch.testing.assert_close(resumed.sae.state_dict()[name], p, atol=1e-6, rtol=0, msg=name)
    loaded = Crosscoder.load(out / "sae")
    assert loaded.models == ["base", "tuned"] or loaded.models == ["base", "chat"]
    torch.testing.assert_close(loaded.W_dec, resumed.sae.W_dec)


@pytest.fixture(scope="module")
def two_models():
    base = tiny_model("llama", seed=0)
    tuned = copy.deepcopy(base)
    with torch.no_grad():
        for p in tuned.hf.model.layers[1].parameters():
            p.add_(0.05 * torch.randn_like(p))
    tuned.name = "tiny-llama-tuned"
    return base, tuned


PROMPTS = [f"prompt number {i} says {'hello ' * (i % 5)}" for i in range(24)]


def test_training_from_two_stores_and_on_the_fly(tmp_path, two_models):
    from interp.values import Runtime

    site = "blocks.1.hook_resid_post"
    mem = capture_paired(two_models, PROMPTS, site, runtime=Runtime(batch_size=8, progress=False))
    stores = capture_paired(two_models, PROMPTS, site, out=tmp_path / "st",
                            runtime=Runtime(batch_size=8, progress=False))
    assert isinstance(stores, PairedStore) and stores.d_model == 2 * two_models[0].d_model
    loaded = torch.cat([s.tensor for s in stores.iter_shards()])
    torch.testing.assert_close(loaded, mem.tensor)
    cfg = TrainConfig(arch="crosscoder_batchtopk", d_sae=64, k=4, total_tokens=30 * 64, batch_size=64, lr=3e-3,
                      progress=False)
    for data in (mem, stores):
        res = train_crosscoder(data, cfg, models=(two_models[0].name, two_models[1].name))
        assert res.sae.site == site and res.sae.models == ["tiny-llama", "tiny-llama-tuned"]
        assert res.history["fvu"][-1] < res.history["fvu"][0]
    ctx = cross_contexts(two_models, res.sae, [0, 1], PROMPTS[:6], top=2)
    assert set(ctx) == {0, 1} and all(len(c) <= 2 for c in ctx.values())


def test_steering_with_a_crosscoder_latent_adds_its_tuned_decoder_vector(two_models):
    base, _ = two_models
    cc = Crosscoder.build(base.d_model, 20, k=4, models=("tiny-llama", "tiny-llama-tuned"), site="blocks.1.hook_resid_post")
    edit = LatentSteering(cc.view("tiny-llama-tuned"), [3, 5], [2.0, -1.0])
    d = cc.decoders()[:, 1]
    torch.testing.assert_close(edit.vector(), 2.0 * d[3] - d[5])
    fns = edit.hook_fns(base)
    assert list(fns) == ["blocks.1.hook_resid_post"]
    x = torch.randn(2, 3, base.d_model)
    torch.testing.assert_close(fns["blocks.1.hook_resid_post"](x, None), x + edit.vector())
    ids = torch.tensor([[1, 5, 7, 9]])
    seen = {}
    with hooks(base, {"blocks.1.hook_resid_post": lambda x, ctx: seen.setdefault("plain", x.clone())}):
        base.hf(ids)
    with hooks(base, {**edit.hook_fns(base)}):
        with hooks(base, {"blocks.1.hook_resid_post": lambda x, ctx: seen.setdefault("steered", x.clone())}):
            base.hf(ids)
    torch.testing.assert_close(seen["steered"], seen["plain"] + edit.vector(), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="not one of"):
        cc.view(2)


def test_a_views_encoder_is_the_crosscoders_with_the_other_inputs_filled_in():
    """``view(m, "same")`` encodes x as the crosscoder encodes (x, x); ``view(m, "alone")`` as it encodes the other
    model at its ``b_dec``; a BatchTopK crosscoder's threshold on the weighted score carries over (JumpReLU)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=g)
    for arch in ("crosscoder_batchtopk", "crosscoder_relu"):
        cc = Crosscoder.build(16, 24, arch=arch, k=4 if arch == "crosscoder_batchtopk" else None)
        with torch.no_grad():
            for p in (cc.W_enc, cc.b_enc, cc.b_dec):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            cc.W_dec.mul_(torch.rand(24, 1, generator=g) * 2)  # latents with different decoder norms
            if cc.threshold is not None:
                cc.threshold.fill_(1.5)
        b0, b1 = cc.b_dec[:16].expand_as(x), cc.b_dec[16:].expand_as(x)
        for m, other in ((0, b1), (1, b0)):
            same = cc.view(m, inputs="same").encode(x)
            torch.testing.assert_close(same, cc.encode(cc.join(x, x)), atol=1e-5, rtol=0)
            pair = (x, other) if m == 0 else (other, x)
            torch.testing.assert_close(cc.view(m).encode(x), cc.encode(cc.join(*pair)), atol=1e-5, rtol=0)
            assert 0 < (same > 0).float().mean() < 0.9  # the threshold cuts some latents, not all
        torch.testing.assert_close(cc.view(1).W_dec, cc.decoders()[:, 1])
    with pytest.raises(ValueError, match="inputs must be"):
        cc.view(0, inputs="both")


# --- bad input ------------------------------------------------------------------------------------------------
def test_bad_input_is_refused_with_the_fix(tmp_path, two_models):
    from interp.values import Runtime

    base, tuned = two_models
    with pytest.raises(ValueError, match="differ in shape"):
        check_models(base, tiny_model("llama", d_model=32))
    other_tok = copy.copy(tuned)
    other_tok.tokenizer = copy.deepcopy(tuned.tokenizer)
    other_tok.tokenizer.add_tokens(["<a token the base lacks>"])
    with pytest.raises(ValueError, match="different tokenizers"):
        check_models(base, other_tok)
    other_template = copy.copy(tuned)
    other_template.tokenizer = copy.deepcopy(tuned.tokenizer)
    other_template.tokenizer.chat_template = None
    with pytest.raises(ValueError, match="different chat templates.*load_pair"):
        check_models(base, other_template)
    with pytest.raises(ValueError, match="same tokens through both"):
        paired(torch.zeros(10, D), torch.zeros(11, D))
    rt = Runtime(batch_size=8, progress=False)
    from interp.capturing import capture

    sa = capture(base, PROMPTS, sites=["blocks.1.hook_resid_post"], positions="all", out=tmp_path / "a", runtime=rt)
    sb = capture(tuned, PROMPTS[:16], sites=["blocks.1.hook_resid_post"], positions="all", out=tmp_path / "b",
                 runtime=rt)
    with pytest.raises(ValueError, match="hold different prompts"):
        paired(sa, sb)
    with pytest.raises(ValueError, match="crosscoder trains as arch"):
        train_crosscoder((torch.zeros(100, D), torch.zeros(100, D)), TrainConfig(arch="topk", total_tokens=100,
                                                                                  batch_size=50))
    with pytest.raises(ValueError, match="n_models"):
        from sae.model import SAE, SAEConfig
        SAE(SAEConfig(d_in=2 * D, d_sae=8, arch="crosscoder_relu"))
    cc = _cc()
    with pytest.raises(ValueError, match="reads 2 models"):
        cc.join(torch.zeros(3, D))


def _ddp_crosscoder(xa: torch.Tensor, xb: torch.Tensor, cfg: TrainConfig) -> dict:
    from interp import distributed as dist

    dist.init_from_env()
    try:
        return {k: v.clone() for k, v in train_crosscoder((xa, xb), cfg).sae.state_dict().items()}
    finally:
        dist.shutdown()


def test_data_parallel_crosscoder_training_equals_one_process():
    """Two ranks (gloo, torchrun's environment) train the L1 crosscoder (a per-token loss) as one process does on
    the same global batches."""
    from tests.conftest import run_ranks

    xa, xb = _pair(1000)
    cfg = TrainConfig(arch="crosscoder_relu", d_sae=32, total_tokens=20 * 64, batch_size=64, lr=3e-3,
                      l1_coefficient=0.5, progress=False)
    one = train_crosscoder((xa, xb), cfg).sae.state_dict()
    s0, s1 = run_ranks(_ddp_crosscoder, xa, xb, cfg)
    for k, v in one.items():
        torch.testing.assert_close(s0[k], s1[k], atol=0, rtol=0, msg=k)
        torch.testing.assert_close(s0[k], v, atol=1e-5, rtol=0, msg=k)
