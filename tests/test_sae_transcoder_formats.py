"""Transcoder formats: sae-lens (its own classes are the oracle, both directions) and circuit-tracer's per-layer
folder (the tensor names, shapes and orientation its reader expects, checked against its forward written out by
hand from ``circuit_tracer/transcoder/single_layer_transcoder.py``; circuit-tracer itself does not install beside
our stack, see DESIGN.md)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import yaml
from safetensors.torch import load_file

from sae.circuit_tracer_io import load_circuit_tracer, save_circuit_tracer
from sae.saelens_io import load_saelens, save_saelens
from sae.transcoder import Transcoder, TranscoderConfig

D, D_SAE = 64, 96


def _random_tc(arch: str, skip: bool, layer: int = 0, seed: int = 0) -> Transcoder:
    """A transcoder with every weight random (biases, threshold and skip too), so a misplaced one shows."""
    tc = Transcoder(TranscoderConfig(d_in=D, d_sae=D_SAE, arch=arch, k=8 if arch == "topk" else None, layer=layer,
                                     skip=skip, model_id="tiny-llama"), seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in tc.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
        if tc.threshold is not None:
            tc.threshold.copy_(0.2 + 0.3 * torch.rand(D_SAE, generator=g))
    return tc


X = torch.randn(40, D, generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("arch,skip,cls", [("relu", False, "Transcoder"), ("relu", True, "SkipTranscoder"),
                                           ("jumprelu", False, "JumpReLUTranscoder"),
                                           ("jumprelu", True, "JumpReLUSkipTranscoder")])
def test_saelens_loads_what_we_write_with_the_same_outputs(tmp_path, arch, skip, cls):
    from sae_lens import SAE as LensSAE

    tc = _random_tc(arch, skip, layer=1)
    save_saelens(tc, tmp_path / "tc")
    theirs = LensSAE.load_from_disk(str(tmp_path / "tc"))
    assert type(theirs).__name__ == cls
    assert theirs.cfg.metadata.hook_name == "blocks.1.mlp.hook_in"
    assert theirs.cfg.metadata.hook_name_out == "blocks.1.mlp.hook_out"
    with torch.no_grad():
        torch.testing.assert_close(theirs.encode(X), tc.encode(X), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(theirs(X), tc(X), atol=1e-6, rtol=1e-6)
    back = load_saelens(tmp_path / "tc")
    assert isinstance(back, Transcoder) and (back.layer, back.cfg.skip, back.arch) == (1, skip, arch)
    assert (back.cfg.input_site, back.cfg.site) == ("blocks.1.mlp.hook_in", "blocks.1.mlp.hook_out")
    with torch.no_grad():
        torch.testing.assert_close(back(X), tc(X), atol=0, rtol=0)


@pytest.mark.parametrize("kind", ["SkipTranscoder", "JumpReLUSkipTranscoder", "Transcoder"])
def test_we_load_what_saelens_writes(tmp_path, kind):
    import sae_lens.saes as S

    cfg_cls = getattr(S, kind + "Config")
    theirs = getattr(S, kind)(cfg_cls(d_in=D, d_sae=D_SAE, d_out=D, apply_b_dec_to_input=False))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _, p in theirs.named_parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
        if hasattr(theirs, "threshold"):
            theirs.threshold.copy_(0.2 + 0.3 * torch.rand(D_SAE, generator=g))
    theirs.cfg.metadata.hook_name, theirs.cfg.metadata.hook_name_out = "blocks.3.mlp.hook_in", "blocks.3.mlp.hook_out"
    theirs.save_model(tmp_path / "tc")
    ours = load_saelens(tmp_path / "tc")
    assert isinstance(ours, Transcoder) and ours.layer == 3 and ours.cfg.skip == ("Skip" in kind)
    with torch.no_grad():
        torch.testing.assert_close(ours(X), theirs(X), atol=1e-6, rtol=1e-6)


def test_saelens_refuses_what_it_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match="sae-lens has no topk transcoder.*save_circuit_tracer"):
        save_saelens(_random_tc("topk", False), tmp_path / "tc")


def _their_forward(w: dict[str, torch.Tensor], x: torch.Tensor, activation: str, k: int | None) -> torch.Tensor:
    """circuit-tracer's SingleLayerTranscoder forward, written out from its source: encode F.linear(x, W_enc, b_enc),
    JumpReLU ``x * (x > threshold)`` / ReLU / TopK (top-k kept as they are), decode ``acts @ W_dec + b_dec``
    plus ``x @ W_skip.T``."""
    pre = F.linear(x, w["W_enc"], w["b_enc"])
    if activation == "jumprelu":
        acts = pre * (pre > w["activation_function.threshold"])
    elif activation == "topk":
        idx = pre.topk(k, dim=-1).indices
        acts = pre * torch.zeros_like(pre).scatter_(-1, idx, 1.0)
    else:
        acts = F.relu(pre)
    out = acts @ w["W_dec"] + w["b_dec"]
    return out + x @ w["W_skip"].T if "W_skip" in w else out


@pytest.mark.parametrize("arch,skip", [("jumprelu", True), ("relu", False), ("topk", True)])
def test_circuit_tracer_layout_and_round_trip(tmp_path, arch, skip):
    tcs = {i: _random_tc(arch, skip, layer=i, seed=i) for i in range(3)}
    if arch == "topk":  # keep the top k positive, where their TopK and ours agree (see sae.circuit_tracer_io)
        with torch.no_grad():
            for tc in tcs.values():
                tc.b_enc.add_(5.0)
    p = save_circuit_tracer(tcs, tmp_path / "set", model_name="tiny-llama")
    assert sorted(f.name for f in p.iterdir()) == ["config.yaml", "layer_0.safetensors", "layer_1.safetensors",
                                                   "layer_2.safetensors"]
    config = yaml.safe_load((p / "config.yaml").read_text())
    assert config["model_kind"] == "transcoder_set" and config["model_name"] == "tiny-llama"
    assert (config["feature_input_hook"], config["feature_output_hook"]) == ("mlp.hook_in", "mlp.hook_out")
    assert config["activation"] == arch and config.get("k") == (8 if arch == "topk" else None)
    for i, tc in tcs.items():
        w = load_file(str(p / f"layer_{i}.safetensors"))
        want = {"W_enc": (D_SAE, D), "W_dec": (D_SAE, D), "b_enc": (D_SAE,), "b_dec": (D,)}
        if arch == "jumprelu":
            want["activation_function.threshold"] = (D_SAE,)
        if skip:
            want["W_skip"] = (D, D)
        assert {k: tuple(v.shape) for k, v in w.items()} == want
        with torch.no_grad():
            torch.testing.assert_close(_their_forward(w, X, arch, config.get("k")), tc(X), atol=1e-5, rtol=1e-5)
    back = load_circuit_tracer(p)
    assert sorted(back) == [0, 1, 2]
    for i, tc in back.items():
        assert (tc.layer, tc.arch, tc.cfg.skip, tc.cfg.k) == (i, arch, skip, tcs[i].cfg.k)
        assert (tc.cfg.input_site, tc.cfg.site) == (f"blocks.{i}.mlp.hook_in", f"blocks.{i}.mlp.hook_out")
        assert tc.cfg.model_id == "tiny-llama"
        with torch.no_grad():
            torch.testing.assert_close(tc(X), tcs[i](X), atol=0, rtol=0)


def test_circuit_tracer_bad_input(tmp_path):
    tcs = {i: _random_tc("relu", False, layer=i) for i in range(3)}
    with pytest.raises(ValueError, match=r"every layer 0..n-1; got layers \[0, 2\]"):
        save_circuit_tracer({0: tcs[0], 2: tcs[2]}, tmp_path / "gap")
    mixed = {0: tcs[0], 1: _random_tc("jumprelu", False, layer=1)}
    with pytest.raises(ValueError, match="one activation, k, skip and width"):
        save_circuit_tracer(mixed, tmp_path / "mixed")
    p = save_circuit_tracer(tcs, tmp_path / "set")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_circuit_tracer(tcs, p)
    save_circuit_tracer({0: tcs[0], 1: tcs[1]}, p, overwrite=True)  # a shorter set leaves no stale layer file
    assert sorted(load_circuit_tracer(p)) == [0, 1]
    (p / "layer_1.safetensors").unlink()
    save_circuit_tracer({0: tcs[0]}, tmp_path / "one")
    (tmp_path / "one" / "layer_0.safetensors").rename(tmp_path / "one" / "layer_1.safetensors")
    with pytest.raises(FileNotFoundError, match=r"layers \[1\]; circuit-tracer needs layer_0"):
        load_circuit_tracer(tmp_path / "one")
    (tmp_path / "clt").mkdir()
    (tmp_path / "clt" / "config.yaml").write_text("model_kind: cross_layer_transcoder\n")
    with pytest.raises(ValueError, match="load_circuit_tracer_clt"):
        load_circuit_tracer(tmp_path / "clt")
