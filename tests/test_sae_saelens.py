"""sae-lens interop: both directions, identical outputs; a sae-lens-trained TopK SAE in our splice."""

from __future__ import annotations

import json
import warnings

import pytest
import sae_lens  # a core dependency (pyproject): a broken install fails, it is never skipped
import torch

from sae.model import SAE, SAEConfig
from sae.saelens_io import load_saelens, save_saelens

warnings.filterwarnings("ignore", module="sae_lens")


def _ours(arch: str, d_in: int = 16, d_sae: int = 40, seed: int = 0) -> SAE:
    k = 5 if arch in ("topk", "batchtopk") else None
    sae = SAE(SAEConfig(d_in, d_sae, arch=arch, k=k, site="resid_post.1", model_id="tiny"), seed=seed)
    g = torch.Generator().manual_seed(seed + 10)
    with torch.no_grad():
        for p in (sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec):
            p.add_(0.2 * torch.randn(p.shape, generator=g))
        if sae.threshold is not None:
            sae.threshold.copy_(0.3 * torch.rand(d_sae, generator=g))
    return sae


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@pytest.mark.parametrize("arch", ["relu", "topk", "batchtopk", "jumprelu"])
def test_ours_to_saelens_and_back(tmp_path, arch):
    ours = _ours(arch)
    x = torch.randn(64, 16) * 2
    save_saelens(ours, tmp_path / "s")
    theirs = sae_lens.SAE.load_from_disk(str(tmp_path / "s"))
    assert theirs.cfg.metadata.hook_name == "blocks.1.hook_resid_post"
    with torch.no_grad():
        errs = (_max_err(theirs.encode(x), ours.encode(x)), _max_err(theirs.decode(ours.encode(x)), ours.decode(ours.encode(x))),
                _max_err(theirs(x), ours(x)))
    print(arch, "ours->sae-lens max abs errors (encode, decode, forward):", errs)
    assert max(errs) <= 1e-6
    back = load_saelens(tmp_path / "s")
    assert back.arch == arch and back.site == ours.site and back.cfg.k == ours.cfg.k
    with torch.no_grad():
        assert _max_err(back(x), ours(x)) <= 1e-6
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_saelens(ours, tmp_path / "s")


def _theirs(kind: str, **cfg_kw):
    from sae_lens.saes.jumprelu_sae import JumpReLUSAE, JumpReLUSAEConfig
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.standard_sae import StandardSAE, StandardSAEConfig
    from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig

    cls, ccls = {"standard": (StandardSAE, StandardSAEConfig), "topk": (TopKSAE, TopKSAEConfig),
                 "jumprelu": (JumpReLUSAE, JumpReLUSAEConfig)}[kind]
    md = SAEMetadata(hook_name="blocks.0.hook_resid_pre", model_name="tiny")
    sae = cls(ccls(d_in=16, d_sae=48, metadata=md, **cfg_kw))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            v = torch.randn(p.shape, generator=g)
            p.copy_(0.1 * v.abs() if name == "threshold" else 0.3 * v)
    return sae


@pytest.mark.parametrize("kind,kw", [("standard", {}), ("standard", {"apply_b_dec_to_input": False}),
                                     ("topk", {"k": 6}), ("topk", {"k": 6, "rescale_acts_by_decoder_norm": True}),
                                     ("jumprelu", {})])
def test_saelens_to_ours(tmp_path, kind, kw):
    theirs = _theirs(kind, **kw)
    theirs.save_model(str(tmp_path / "s"))
    ours = load_saelens(tmp_path / "s")
    assert ours.site == "blocks.0.hook_resid_pre" and ours.cfg.model_id == "tiny"
    x = torch.randn(64, 16) * 2
    with torch.no_grad():
        out, ref = ours(x), theirs(x)
        err, z_err = _max_err(out, ref), _max_err(ours.encode(x), theirs.encode(x))
    print(kind, kw, "sae-lens->ours max abs error (forward, encode)", err, z_err, "output scale", float(ref.abs().max()))
    if kw.get("rescale_acts_by_decoder_norm"):
        # decoder norms are folded into the weights (as sae-lens's save_inference_model does): float32 rounding
        assert err <= 1e-6 * float(ref.abs().max()) and z_err <= 1e-6 * float(ref.abs().max())
    else:
        assert err <= 1e-6 and z_err <= 1e-6


def test_pre6_config_matches_saelens(tmp_path):
    """An old (pre-6.0) sae-lens folder: both loaders agree."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(2)
    W = {"W_enc": torch.randn(16, 32, generator=g) * 0.3, "b_enc": torch.randn(32, generator=g) * 0.1,
         "W_dec": torch.randn(32, 16, generator=g) * 0.3, "b_dec": torch.randn(16, generator=g) * 0.1}
    (tmp_path / "old").mkdir()
    save_file(W, str(tmp_path / "old" / "sae_weights.safetensors"))
    cfg = {"d_in": 16, "d_sae": 32, "dtype": "float32", "device": "cpu", "hook_point": "blocks.1.hook_resid_post",
           "hook_point_layer": 1, "model_name": "gpt2", "activation_fn_str": "topk",
           "activation_fn_kwargs": {"k": 4}, "apply_b_dec_to_input": True, "normalize_activations": False,
           "sae_lens_training_version": "3.0.0", "context_size": 128}
    (tmp_path / "old" / "cfg.json").write_text(json.dumps(cfg))
    ours = load_saelens(tmp_path / "old")
    theirs = sae_lens.SAE.load_from_disk(str(tmp_path / "old"))
    assert ours.arch == "topk" and ours.cfg.k == 4 and ours.site == "blocks.1.hook_resid_post"
    x = torch.randn(20, 16)
    with torch.no_grad():
        assert _max_err(ours(x), theirs(x)) <= 1e-6


def test_expected_average_norm_is_folded(tmp_path):
    theirs = _theirs("standard", normalize_activations="expected_average_only_in")
    theirs.save_model(str(tmp_path / "s"))
    with pytest.raises(ValueError, match="norm_scaling_factor="):
        load_saelens(tmp_path / "s")
    ours = load_saelens(tmp_path / "s", norm_scaling_factor=0.25)
    theirs.fold_activation_norm_scaling_factor(0.25)  # sae-lens's own way of applying the factor
    x = torch.randn(20, 16) * 4
    with torch.no_grad():
        assert _max_err(ours(x), theirs(x)) <= 1e-6


def test_unsupported_folders_are_clear_errors(tmp_path):
    theirs = _theirs("standard", normalize_activations="layer_norm")
    theirs.save_model(str(tmp_path / "ln"))
    with pytest.raises(ValueError, match="cannot be folded"):
        load_saelens(tmp_path / "ln")
    (tmp_path / "release" / "layer_3").mkdir(parents=True)
    _theirs("topk", k=3).save_model(str(tmp_path / "release" / "layer_3"))
    with pytest.raises(FileNotFoundError, match="sub-folders: \\['layer_3'\\]"):
        load_saelens(tmp_path / "release")
    assert load_saelens(tmp_path / "release" / "layer_3").cfg.k == 3


def _train_saelens_topk(d_in: int, hook: str):
    from sae_lens.config import SAETrainerConfig
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.training.sae_trainer import SAETrainer

    torch.manual_seed(0)
    X = torch.randn(2048, d_in) * 2 + 0.5

    def provider():
        g = torch.Generator().manual_seed(0)
        while True:
            yield X[torch.randint(0, X.shape[0], (128,), generator=g)]

    sae = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=d_in, d_sae=4 * d_in, k=8,
                                                metadata=SAEMetadata(hook_name=hook, model_name="tiny")))
    cfg = SAETrainerConfig(total_training_samples=128 * 25, train_batch_size_samples=128, lr=1e-3, lr_end=1e-3)
    return SAETrainer(cfg, sae, provider()).fit()


@pytest.mark.parametrize("save", ["save_model", "save_inference_model"])
def test_saelens_trained_topk_in_our_splice(tmp_path, tiny_models, save):
    from interp.hooking import hooks
    from sae.edits import SAESplice

    model = tiny_models("llama")
    trained = _train_saelens_topk(model.d_model, "blocks.0.hook_resid_post")
    getattr(trained, save)(str(tmp_path / "s"))
    theirs = sae_lens.SAE.load_from_disk(str(tmp_path / "s"))
    ours = load_saelens(tmp_path / "s")
    assert ours.site == "blocks.0.hook_resid_post"
    ids = model.tokenizer(["the man said to the boy", "where is the old house"], return_tensors="pt", padding=True)
    seen: dict[str, torch.Tensor] = {}

    def before(x, ctx):
        seen["x"] = x.detach().clone()

    def after(x, ctx):
        seen["rec"] = x.detach().clone()

    with torch.no_grad():
        with hooks(model, [("blocks.0.hook_resid_post", before)]), \
             hooks(model, SAESplice(ours).hook_fns(model)), hooks(model, [("blocks.0.hook_resid_post", after)]):
            ours_logits = model.hf(**ids).logits
        with hooks(model, {"blocks.0.hook_resid_post": lambda x, ctx: theirs(x)}):
            their_logits = model.hf(**ids).logits
        ref = theirs(seen["x"])
    err = _max_err(seen["rec"], ref)
    print(save, "reconstruction error in our splice vs sae-lens:", err, "logits:", _max_err(ours_logits, their_logits))
    assert err <= 1e-5 and _max_err(ours_logits, their_logits) <= 1e-4
    assert _max_err(seen["rec"], seen["x"]) > 1e-2  # the splice really replaced the activation


def test_unhookable_hook_name_is_kept_and_splicing_says_why(tmp_path, tiny_models):
    from sae.edits import SAESplice

    theirs = _theirs("standard")
    theirs.cfg.metadata.hook_name = "blocks.0.ln1.hook_normalized"
    theirs.save_model(str(tmp_path / "q"))
    ours = load_saelens(tmp_path / "q")
    assert ours.site == "blocks.0.ln1.hook_normalized"
    with pytest.raises(ValueError, match="not a site we can hook"):
        SAESplice(ours).hook_fns(tiny_models("llama"))
