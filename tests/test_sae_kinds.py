"""SAE kinds behind the registry: every kind sae-lens has equals sae-lens's own classes on the same weights (encode,
decode, training loss and its gradients), round-trips losslessly through our sae-lens files, and a kind registered
from outside trains, saves and loads without touching our files."""

from __future__ import annotations

import json
import warnings

import pytest
import sae_lens  # a core dependency: never skipped
import torch

from sae.kinds import Kind, get_kind, kind_names, register_kind
from sae.losses import train_step
from sae.model import SAE, SAEConfig
from sae.saelens_io import load_saelens, save_saelens
from sae.trainer import train_sae

warnings.filterwarnings("ignore", module="sae_lens")

D_IN, D_SAE, K, BW, COEF, TARGET = 12, 48, 4, 0.05, 0.7, 5.0
WIDTHS = [6, 20, D_SAE]
SAELENS_KINDS = ["relu", "topk", "batchtopk", "jumprelu", "jumprelu_target_l0", "gated", "matryoshka_batchtopk"]
TOL = 1e-5


def _ours(arch: str, seed: int = 0) -> SAE:
    """An SAE of ``arch`` in float64 with every parameter moved off its start (decoder rows not unit norm)."""
    k = K if get_kind(arch).needs_k else None
    options = {"widths": list(WIDTHS)} if arch == "matryoshka_batchtopk" else {}
    sae = SAE(SAEConfig(D_IN, D_SAE, arch=arch, k=k, dtype="float64", site="resid_post.1", options=options),
              seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in sae.state_dict().values():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        sae.W_dec.mul_(1 + torch.rand(D_SAE, 1, generator=g, dtype=torch.float64))
        if sae.threshold is not None:
            sae.threshold.copy_(0.2 + 0.3 * torch.rand(D_SAE, generator=g, dtype=torch.float64))
    return sae


def _theirs_training(arch: str, ours: SAE):
    """sae-lens's training class of the same kind, holding our weights (``b_enc`` is their ``b_gate``)."""
    from sae_lens.saes.batchtopk_sae import BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig
    from sae_lens.saes.gated_sae import GatedTrainingSAE, GatedTrainingSAEConfig
    from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig
    from sae_lens.saes.matryoshka_batchtopk_sae import (
        MatryoshkaBatchTopKTrainingSAE,
        MatryoshkaBatchTopKTrainingSAEConfig,
    )
    from sae_lens.saes.standard_sae import StandardTrainingSAE, StandardTrainingSAEConfig
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig

    base = {"d_in": D_IN, "d_sae": D_SAE, "dtype": "float64"}
    topk = {**base, "k": K, "rescale_acts_by_decoder_norm": False}
    jump = {**base, "jumprelu_bandwidth": BW, "l0_coefficient": COEF}
    cls, cfg = {
        "relu": (StandardTrainingSAE, StandardTrainingSAEConfig(**base, l1_coefficient=COEF)),
        "topk": (TopKTrainingSAE, TopKTrainingSAEConfig(**topk)),
        "batchtopk": (BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig(**topk)),
        "jumprelu": (JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig(**jump, jumprelu_sparsity_loss_mode="step")),
        "jumprelu_target_l0": (JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig(
            **jump, jumprelu_sparsity_loss_mode="quadratic", target_l0=TARGET)),
        "gated": (GatedTrainingSAE, GatedTrainingSAEConfig(**base, l1_coefficient=COEF)),
        "matryoshka_batchtopk": (MatryoshkaBatchTopKTrainingSAE, MatryoshkaBatchTopKTrainingSAEConfig(
            **topk, matryoshka_widths=list(WIDTHS))),
    }[arch]
    theirs = cls(cfg)
    names = ours.kind.saelens_names
    state = {names.get(k, k): v.detach().clone() for k, v in ours.state_dict().items()}
    if arch in ("batchtopk", "matryoshka_batchtopk"):
        state.pop("threshold")  # theirs keeps one running scalar while training
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"topk_threshold"}, (missing, unexpected)
    return theirs


def _our_loss(sae: SAE, x: torch.Tensor, sparse: bool = False) -> torch.Tensor:
    coeffs = {"sparsity": COEF, "aux": 0.0, "preact": 0.0}
    opts = {"sparse": sparse, "backend": "torch", "k_aux": D_IN // 2, "bandwidth": BW,
            "target_l0": TARGET if sae.arch == "jumprelu_target_l0" else None}
    return train_step(sae, x, torch.zeros(sae.d_sae, dtype=torch.bool), coeffs, opts).loss


def _their_loss(theirs, arch: str, x: torch.Tensor) -> torch.Tensor:
    from sae_lens.saes.sae import TrainStepInput

    coef = {"relu": {"l1": COEF}, "gated": {"l1": COEF}, "jumprelu": {"l0": COEF},
            "jumprelu_target_l0": {"l0": COEF}}.get(arch, {})
    step = TrainStepInput(sae_in=x, coefficients=coef, dead_neuron_mask=None, n_training_steps=0,
                          is_logging_step=False)
    return theirs.training_forward_pass(step).loss


def _x(seed: int = 3, n: int = 64) -> torch.Tensor:
    return torch.randn(n, D_IN, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _diffs(arch: str) -> dict[str, float]:
    """Max abs differences, ours vs sae-lens: inference encode / decode (their inference class, loaded from our
    file), training reconstruction, loss, and the loss's gradients."""
    ours, x = _ours(arch), _x()
    theirs = _theirs_training(arch, ours)
    out: dict[str, float] = {}
    if arch in ("batchtopk", "matryoshka_batchtopk"):  # training selection: theirs encodes by batch top-k
        with torch.no_grad():
            z_theirs, _ = theirs.encode_with_hidden_pre(x)
    loss_o, loss_t = _our_loss(ours, x), _their_loss(theirs, arch, x)
    assert float(loss_t.detach()) > 1e-3
    out["loss"] = float((loss_o - loss_t).detach().abs())
    loss_o.backward()
    loss_t.backward()
    names = ours.kind.saelens_names
    frozen = {"W_dec", "b_dec"} if arch == "gated" else set()  # ours: the gate's reconstruction reads a frozen decoder
    grads = [(ours.get_parameter(k).grad, theirs.get_parameter(names.get(k, k)).grad)
             for k, _ in ours.named_parameters() if k not in frozen and hasattr(theirs, names.get(k, k))]
    out["grad"] = max(float((a - b).abs().max()) for a, b in grads if a is not None and b is not None)
    inference = _inference(ours)
    with torch.no_grad():
        z = ours.encode(x)
        out["encode"] = float((z - inference.encode(x)).abs().max())
        out["decode"] = float((ours.decode(z) - inference.decode(z)).abs().max())
        if arch in ("batchtopk", "matryoshka_batchtopk"):
            x_hat = train_step(ours, x, torch.zeros(D_SAE, dtype=torch.bool), {"sparsity": 0, "aux": 0},
                               {"sparse": False, "backend": "torch"}).x_hat
            out["train_encode"] = float((x_hat - theirs.decode(z_theirs)).abs().max())
    return out


def _inference(sae: SAE):
    """sae-lens's inference class of our SAE, built by sae-lens from the files we write."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        save_saelens(sae, d)
        return sae_lens.SAE.load_from_disk(d, dtype="float64")


@pytest.mark.parametrize("arch", SAELENS_KINDS)
def test_each_kind_equals_saelens(arch):
    d = _diffs(arch)
    print(arch, "max abs diff vs sae-lens:", {k: f"{v:.2e}" for k, v in d.items()})
    assert max(d.values()) <= TOL, d


@pytest.mark.parametrize("arch", ["topk", "batchtopk"])
def test_sparse_training_path_equals_saelens(arch):
    """TopK / BatchTopK train through the sparse encode/decode kernels (torch backend here): same loss as sae-lens."""
    ours, x = _ours(arch), _x()
    theirs = _theirs_training(arch, ours)
    diff = float((_our_loss(ours, x, sparse=True) - _their_loss(theirs, arch, x)).detach().abs())
    print(arch, "sparse path loss diff:", diff)
    assert diff <= TOL


def test_the_equivalence_check_can_fail():
    """A small change to a kind's own parameter (gated's b_mag, JumpReLU's threshold) shows in the differences."""
    for arch, name in (("gated", "b_mag"), ("jumprelu_target_l0", "threshold")):
        ours, x = _ours(arch), _x()
        theirs = _theirs_training(arch, ours)
        with torch.no_grad():
            getattr(ours, name).add_(0.05)
        assert float((_our_loss(ours, x) - _their_loss(theirs, arch, x)).detach().abs()) > 1e-3


@pytest.mark.parametrize("arch", SAELENS_KINDS)
def test_saelens_round_trip_is_lossless(tmp_path, arch):
    ours = _ours(arch)
    save_saelens(ours, tmp_path / "s")
    back = load_saelens(tmp_path / "s")
    assert (back.arch, back.cfg.k, back.cfg.options, back.dtype) == (arch, ours.cfg.k, ours.cfg.options, ours.dtype)
    a, b = ours.state_dict(), back.state_dict()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    x = _x()
    with torch.no_grad():
        assert torch.equal(back(x), ours(x))


def test_saelens_gated_file_loads_as_ours(tmp_path):
    """A gated SAE written by sae-lens itself (b_gate, b_mag, r_mag) loads as our gated kind, same outputs."""
    from sae_lens.saes.gated_sae import GatedSAE, GatedSAEConfig

    theirs = GatedSAE(GatedSAEConfig(d_in=D_IN, d_sae=D_SAE, dtype="float64"))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    theirs.save_model(str(tmp_path / "g"))
    ours = load_saelens(tmp_path / "g")
    x = _x()
    assert ours.arch == "gated"
    with torch.no_grad():
        assert float((ours(x) - theirs(x)).abs().max()) <= TOL


class ToyKind(Kind):
    """A kind from outside: ``relu(pre - offset)`` with a trained per-latent offset kept non-negative, an L1 penalty,
    a hook after each step."""

    name = "toy_offset"
    extra = (("offset", True),)
    scaled = ("offset",)
    sparsity_coef = "l1_coefficient"
    steps_seen = 0

    def activate(self, sae, pre):
        return torch.relu(pre - sae.offset)

    def train_forward(self, sae, x, y, dead, coeffs, opts):
        from sae.kinds.base import KindOut, fired_and_l0, train_pre

        pre = train_pre(sae, x)
        z = torch.relu(pre - sae.offset)
        fired, l0 = fired_and_l0(z)
        penalty = z.sum(-1).mean()
        return KindOut(x_hat=z @ sae.W_dec + sae.b_dec, pre=pre.detach().clone(), fired=fired, l0=l0,
                       terms={"l1": coeffs["sparsity"] * penalty}, sparsity=penalty.detach())

    @torch.no_grad()
    def init_from_data(self, sae, xs, opts):
        sae.offset.fill_(0.5)

    @torch.no_grad()
    def after_step(self, trainer, out):
        type(self).steps_seen += 1
        trainer.sae.offset.clamp_(min=0.0)


def test_a_kind_registered_from_outside_trains_saves_and_loads(tmp_path, monkeypatch):
    import sae.kinds as kinds

    monkeypatch.setattr(kinds, "_KINDS", dict(kinds._KINDS))  # the registration ends with the test
    register_kind(ToyKind())
    assert "toy_offset" in kind_names()
    x = torch.randn(512, D_IN, generator=torch.Generator().manual_seed(0)) * 2
    res = train_sae(x, arch="toy_offset", d_sae=32, batch_size=64, total_tokens=64 * 8, progress=False,
                    warmup_steps=1, l1_coefficient=0.1)
    sae = res.sae
    assert ToyKind.steps_seen >= 8 and res.steps == 8
    assert sae.offset.requires_grad and not torch.allclose(sae.offset, torch.full_like(sae.offset, 0.5))
    assert bool((sae.offset >= 0).all()) and all(v == v for v in res.history["loss"])
    sae.save(tmp_path / "toy")
    back = SAE.load(tmp_path / "toy")
    assert back.arch == "toy_offset" and torch.equal(back(x), sae(x))
    with pytest.raises(ValueError, match="no sae-lens architecture"):
        save_saelens(sae, tmp_path / "sl")
    monkeypatch.delitem(kinds._KINDS, "toy_offset")
    with pytest.raises(ValueError, match=r"unknown SAE kind 'toy_offset'; registered kinds: \[.*'relu'.*register_kind"):
        SAE.load(tmp_path / "toy")


def test_a_saelens_file_naming_an_unregistered_kind_says_register_kind(tmp_path):
    save_saelens(_ours("jumprelu"), tmp_path / "s")
    cfg = json.loads((tmp_path / "s" / "cfg.json").read_text())
    cfg["metadata"]["interp_arch"] = "mystery"
    (tmp_path / "s" / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"unknown SAE kind 'mystery'; registered kinds: \[.*'gated'.*register_kind"):
        load_saelens(tmp_path / "s")
    cfg["architecture"], cfg["metadata"]["interp_arch"] = "unheard_of", None
    (tmp_path / "s" / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="'unheard_of' is not supported.*register_kind"):
        load_saelens(tmp_path / "s")


def test_bad_kind_settings_are_clear_errors():
    with pytest.raises(ValueError, match="needs options=.*widths"):
        SAEConfig(D_IN, D_SAE, arch="matryoshka_batchtopk", k=K)
    with pytest.raises(ValueError, match="strictly increasing"):
        SAEConfig(D_IN, D_SAE, arch="matryoshka_batchtopk", k=K, options={"widths": [20, 10]})
    with pytest.raises(TypeError, match="instance of a sae.kinds.Kind"):
        register_kind(ToyKind)
    with pytest.raises(ValueError, match="already registered"):
        register_kind(type("Other", (Kind,), {"name": "relu"})())
    from sae.transcoder import TranscoderConfig
    with pytest.raises(ValueError, match="transcoders support arch"):
        TranscoderConfig(D_IN, D_SAE, arch="gated")


@pytest.mark.parametrize("arch", ["gated", "matryoshka_batchtopk", "jumprelu_target_l0"])
def test_new_kinds_train(arch):
    """A few hundred steps on data with a sparse structure: the loss falls, the reconstruction is good, and the
    target-L0 JumpReLU lands near its target."""
    g = torch.Generator().manual_seed(0)
    dirs = torch.randn(64, D_IN, generator=g)
    codes = torch.rand(4096, 64, generator=g) * (torch.rand(4096, 64, generator=g) < 0.06)
    x = codes @ dirs
    res = train_sae(x, arch=arch, d_sae=64, k=4, batch_size=256, total_tokens=256 * 300, progress=False,
                    options={"widths": [8, 32]} if arch == "matryoshka_batchtopk" else {}, l1_coefficient=0.5,
                    l0_coefficient=0.05)
    h = res.history
    print(arch, "fvu", h["fvu"][-1], "l0", h["l0"][-1], "loss", h["loss"][0], "->", h["loss"][-1])
    assert h["loss"][-1] < 0.5 * h["loss"][0] and h["fvu"][-1] < 0.5
    if arch == "jumprelu_target_l0":
        assert 2 <= h["l0"][-1] <= 8


def test_l0_coefficient_warms_up_as_saelens_schedules_it():
    """The target-L0 JumpReLU's coefficient per step equals sae-lens's CoefficientScheduler (linear from zero over
    ``sparsity_warmup_frac * n_steps`` steps, then constant)."""
    from sae_lens.training.optim import CoefficientScheduler

    seen = []
    x = torch.randn(1024, D_IN, generator=torch.Generator().manual_seed(1))
    train_sae(x, arch="jumprelu_target_l0", d_sae=32, k=4, batch_size=64, total_tokens=64 * 12, progress=False,
              l0_coefficient=3.0, sparsity_warmup_frac=0.25, callback=lambda t: seen.append(t._coeffs()["sparsity"]))
    sched = CoefficientScheduler(warm_up_steps=3, final_value=3.0)
    theirs = [sched.step() for _ in range(12)]
    assert seen[:-1] == pytest.approx(theirs[1:], abs=1e-12)  # the callback runs after each step: the next one's


@pytest.mark.parametrize("arch", ["batchtopk", "matryoshka_batchtopk"])
def test_saelens_training_checkpoint_loads_as_our_kind(tmp_path, arch):
    """A sae-lens training checkpoint (decoder-norm rescaling, one scalar ``topk_threshold``) loads as our kind and
    encodes as the JumpReLU sae-lens itself saves for inference."""
    theirs = _theirs_training(arch, _ours(arch))
    theirs.cfg.rescale_acts_by_decoder_norm = True
    with torch.no_grad():
        theirs.topk_threshold.fill_(0.4)
    theirs.save_model(str(tmp_path / "train"))
    theirs.save_inference_model(str(tmp_path / "inf"))
    ref = sae_lens.SAE.load_from_disk(str(tmp_path / "inf"), dtype="float64")
    ours = load_saelens(tmp_path / "train")
    assert (ours.arch, ours.cfg.k) == (arch, K)
    if arch == "matryoshka_batchtopk":
        assert ours.cfg.options["widths"] == WIDTHS
    x = _x()
    with torch.no_grad():
        assert 0 < int((ref.encode(x) > 0).sum()) < x.shape[0] * D_SAE // 2
        assert float((ours.encode(x) - ref.encode(x)).abs().max()) <= TOL
        assert float((ours(x) - ref(x)).abs().max()) <= TOL


@pytest.mark.parametrize("arch", ["relu", "batchtopk", "jumprelu", "gated", "matryoshka_batchtopk"])
def test_rescalings_keep_outputs(arch):
    """The kind's ``scaled`` parameters follow the decoder-norm and input-scale folds: unit decoder rows leave the
    outputs as they were; an SAE of ``x * s`` folded to read raw ``x`` gives ``1/s`` of the latents and outputs."""
    sae, x = _ours(arch), _x()
    with torch.no_grad():
        before = sae(x)
        sae.normalize_decoder_()
        assert torch.allclose(sae.W_dec.norm(dim=1), torch.ones(D_SAE, dtype=torch.float64))
        assert float((sae(x) - before).abs().max()) <= 1e-10
        z, y = sae.encode(x * 3.0), sae(x * 3.0)
        sae.fold_input_scale_(3.0)
        assert float((sae.encode(x) - z / 3.0).abs().max()) <= 1e-10
        assert float((sae(x) - y / 3.0).abs().max()) <= 1e-10


def test_the_docstring_kind_needs_only_activate(monkeypatch):
    """A kind that defines only ``activate`` trains by its reconstruction alone (the default training forward)."""
    import sae.kinds as kinds

    monkeypatch.setattr(kinds, "_KINDS", dict(kinds._KINDS))
    register_kind(type("SquaredRelu", (Kind,), {"name": "sq_relu",
                                                 "activate": lambda self, sae, pre: torch.relu(pre) ** 2})())
    x = torch.randn(512, D_IN, generator=torch.Generator().manual_seed(2))
    res = train_sae(x, arch="sq_relu", d_sae=24, batch_size=64, total_tokens=64 * 20, progress=False, warmup_steps=1)
    assert res.history["loss"][-1] < res.history["loss"][0]
    assert torch.equal(res.sae.encode(x), torch.relu(res.sae.pre_acts(x)) ** 2)


def test_the_cli_offers_every_built_in_kind_and_matryoshka_widths():
    """`interp sae train --arch` lists the registry's built-in kinds (but the crosscoders, which read two models);
    --widths reaches Matryoshka's options only."""
    import argparse

    from interp.cli.sae_train import ARCHS, train_config
    from sae.kinds import get_kind, kind_names

    assert set(ARCHS) == {n for n in kind_names() if not get_kind(n).crosscoder}
    args = argparse.Namespace(arch="matryoshka_batchtopk", d_sae=64, expansion=8, k=8, steps=2, batch_size=4,
                              lr=None, seed=0, widths="16,32")
    assert train_config(args, "blocks.0.hook_resid_post").options == {"widths": [16, 32]}
    with pytest.raises(ValueError, match="--widths sets matryoshka"):
        train_config(argparse.Namespace(**{**vars(args), "arch": "topk"}), "blocks.0.hook_resid_post")
