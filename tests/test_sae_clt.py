"""Cross-layer transcoders: the CLT's arithmetic, our bundle and circuit-tracer's CLT layout (round trips, refusals, a
CLT of another model), the replacement model, attribution graphs and interventions with a CLT on a tiny 3-layer
Llama, and training on the organism. Equality with circuit-tracer's graphs: test_graphs_clt_circuit_tracer.py.

Figures (organism, a trained 4-layer width-64 Llama; JumpReLU d_sae 256 at L0 16, stage 1 100 steps of 256 tokens
per layer, stage 2 100 steps of 512 tokens): mean FVU of the MLP outputs over the layers on the training capture
0.082 after stage 1, 0.059 with the cross-layer decoders, 0.069 for the control (the same refit with the
cross-layer decoders held at zero).
"""

from __future__ import annotations

import pytest
import torch

from interp.forward import forward
from interp.patching import GraphConfig, ReplacementModel, attribution_graph
from interp.patching.graph_edits import DecoderEdit, FeatureEdit, intervene
from interp.testing.tiny import tiny_model
from sae.circuit_tracer_io import load_circuit_tracer, save_circuit_tracer
from sae.clt import CLTConfig, CrossLayerTranscoder
from sae.clt_io import load_circuit_tracer_clt, save_circuit_tracer_clt
from sae.train_config import TrainConfig
from sae.transcoder import Transcoder, TranscoderConfig

from .test_graphs_clt_circuit_tracer import IDS, seeded_clt


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", num_hidden_layers=3)


@pytest.fixture(scope="module")
def clt(model):
    return seeded_clt(model)


def _state_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_layer_predicts_from_every_earlier_layers_features(clt):
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(5, clt.d_in, generator=g) for _ in range(clt.n_layers)]
    zs = {i: clt.encode(i, xs[i]) for i in range(clt.n_layers)}
    out = clt(xs)
    for L in range(clt.n_layers):
        want = clt.layers[L].b_dec + sum(zs[s] @ (clt.layers[s].W_dec if s == L else clt.W_later[s][:, L - s - 1])
                                         for s in range(L + 1))
        assert torch.allclose(out[L], want, atol=1e-6)
    assert float(zs[0].ne(0).float().mean()) > 0.05                          # features fire, so the sums are not 0
    with pytest.raises(ValueError, match="write only into layers 2..2, not 1"):
        clt.decoder(2, 1)
    with pytest.raises(ValueError, match=r"needs the latents of layers \[0\]"):
        clt.predict(1, {1: zs[1]})


def test_per_layer_transcoders_are_a_clt_with_zero_cross_decoders(model, clt):
    tcs = clt.transcoders
    same = CrossLayerTranscoder.from_transcoders(tcs)
    assert all(float(w.detach().abs().max()) == 0 for w in same.W_later if w.numel())
    g1 = attribution_graph(ReplacementModel(model, tcs), IDS, config=GraphConfig(constant_positions=1))
    g2 = attribution_graph(ReplacementModel(model, same), IDS, config=GraphConfig(constant_positions=1))
    assert torch.equal(g1.features, g2.features) and (g1.adjacency - g2.adjacency).abs().max() < 1e-6
    mixed = dict(tcs)
    mixed[1] = Transcoder(TranscoderConfig(d_in=model.d_model, d_sae=16, arch="jumprelu", layer=1))
    with pytest.raises(ValueError, match="shares one kind and width"):
        CrossLayerTranscoder.from_transcoders(mixed)


def test_bundle_round_trip_is_exact(clt, tmp_path):
    clt.save(tmp_path / "clt")
    back = CrossLayerTranscoder.load(tmp_path / "clt")
    assert _state_equal(clt, back) and back.cfg == clt.cfg
    with pytest.raises(FileExistsError):
        clt.save(tmp_path / "clt")


@pytest.mark.parametrize("arch", ["relu", "jumprelu"])
def test_circuit_tracer_layout_round_trip_is_exact(model, arch, tmp_path):
    clt = seeded_clt(model, arch=arch, seed=1)
    p = save_circuit_tracer_clt(clt, tmp_path / "ct")
    names = sorted(f.name for f in p.iterdir())
    assert names == ["W_dec_0.safetensors", "W_dec_1.safetensors", "W_dec_2.safetensors", "W_enc_0.safetensors",
                     "W_enc_1.safetensors", "W_enc_2.safetensors", "config.yaml"]
    from safetensors.torch import load_file

    enc, dec = load_file(str(p / "W_enc_1.safetensors")), load_file(str(p / "W_dec_1.safetensors"))
    assert enc["W_enc_1"].shape == (clt.d_sae, clt.d_in) and dec["W_dec_1"].shape == (clt.d_sae, 2, clt.d_in)
    assert ("threshold_1" in enc) == (arch == "jumprelu")
    back = load_circuit_tracer_clt(p, model=model)
    assert _state_equal(clt, back) and back.cfg.arch == arch and back.cfg.model_id == model.name
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_circuit_tracer_clt(clt, p)
    save_circuit_tracer_clt(clt, p, overwrite=True)


def test_circuit_tracer_layout_refusals(model, clt, tmp_path):
    topk = CrossLayerTranscoder(CLTConfig(n_layers=3, d_in=model.d_model, d_sae=32, arch="topk", k=4))
    with pytest.raises(ValueError, match="ReLU or JumpReLU, not 'topk'"):
        save_circuit_tracer_clt(topk, tmp_path / "topk")
    save_circuit_tracer(clt.transcoders, tmp_path / "set")                  # per-layer transcoders, not a CLT
    with pytest.raises(ValueError, match="load them with sae.circuit_tracer_io.load_circuit_tracer"):
        load_circuit_tracer_clt(tmp_path / "set")
    p = save_circuit_tracer_clt(clt, tmp_path / "ct")
    with pytest.raises(ValueError, match="load_circuit_tracer_clt"):
        load_circuit_tracer(p)
    (p / "W_enc_1.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"layers \[0, 2\]"):
        load_circuit_tracer_clt(p)
    with pytest.raises(FileNotFoundError, match="config.yaml missing"):
        load_circuit_tracer_clt(tmp_path / "nothing")


def test_a_clt_of_another_model_is_refused(model, clt, tmp_path):
    two = tiny_model("llama")                                                 # 2 layers, same width and name
    save_circuit_tracer_clt(clt, tmp_path / "ct")
    for attempt in (lambda: ReplacementModel(two, clt), lambda: load_circuit_tracer_clt(tmp_path / "ct", model=two)):
        with pytest.raises(ValueError, match="spans 3 layers but tiny-llama has 2.*sae.clt_train.train_clt"):
            attempt()
    wide = tiny_model("llama", num_hidden_layers=3, hidden_size=96)
    with pytest.raises(ValueError, match="reads width 64 but tiny-llama has d_model=96"):
        ReplacementModel(wide, clt)
    resid = CrossLayerTranscoder(CLTConfig(n_layers=3, d_in=model.d_model, d_sae=8, input_hook="hook_resid_mid",
                                           output_hook="hook_mlp_out"))      # circuit-tracer's default hooks
    with pytest.raises(ValueError, match="needs transcoders from mlp_in.L to mlp_module_out.L"):
        ReplacementModel(model, resid)
    other = seeded_clt(model)
    other.cfg.model_id = "google/gemma-3-270m"
    for tc in other.layers:
        tc.cfg.model_id = "google/gemma-3-270m"
    save_circuit_tracer_clt(other, tmp_path / "gemma")
    with pytest.raises(ValueError, match="trained on 'google/gemma-3-270m', not 'tiny-llama'"):
        load_circuit_tracer_clt(tmp_path / "gemma", model=model)


def test_the_replacement_model_with_a_clt_keeps_the_logits(model, clt):
    rm = ReplacementModel(model, clt)
    run = rm.run(IDS)
    real = forward(model, rm.batch(IDS))[0]
    assert (run.logits - real).abs().max() < 1e-5
    assert (rm.replaced(run)["logits"][0] - real).abs().max() < 1e-5          # re-encoded, errors held: the same
    assert (rm.linear(run)["logits"][0] - real).abs().max() < 1e-4            # linearised at the run: the same
    g = attribution_graph(rm, IDS, config=GraphConfig(constant_positions=1))
    assert g.completeness() < 1e-4                                            # edges sum to each row's value


def test_interventions_follow_the_cross_layer_decoders(model, clt):
    rm = ReplacementModel(model, clt)
    g = attribution_graph(rm, IDS, config=GraphConfig(constant_positions=1))
    i = int(g.activations[:g.n_features][g.features[:, 0] == 0].abs().argmax())   # the strongest layer-0 feature
    L, p, f = g.features[i].tolist()
    res = intervene(rm, g, [FeatureEdit(L, p, f, scale=0.0)], mode="linear")
    assert (res.delta - res.predicted).abs().max() < 1e-4 * max(1.0, float(res.delta.abs().max()))
    assert float(res.delta.abs().max()) > 1e-3
    # the real model: MLP 2's output is its own output plus the change written through D(0, 2)
    seen = {}
    edit = DecoderEdit(clt, [FeatureEdit(L, p, f, value=5.0)])
    fns = list(edit.hook_fns(model).items()) + [("mlp_in.2", lambda x, ctx: seen.__setitem__("x", x)),
                                                 ("mlp_module_out.2", lambda y, ctx: seen.__setitem__("y", y)),
                                                 ("mlp_in.0", lambda x, ctx: seen.__setitem__("x0", x))]
    forward(model, rm.batch(IDS), fns)
    with torch.no_grad():
        z = clt.encode(0, seen["x0"].clone())[0, p, f]
        want = model.block(2).mlp(seen["x"].clone())
        want[0, p] += (5.0 - z) * clt.decoder(0, 2)[f]
    assert (seen["y"] - want).abs().max() < 1e-5 and float((5.0 - z).abs()) > 0
    from sae.edits import TranscoderAblation

    with pytest.raises(TypeError, match="DecoderEdit"):
        TranscoderAblation(clt, [(0, f)])


def test_training_a_clt_on_the_organism(organism, tmp_path):
    from sae.clt_train import CrossConfig, evaluate_clt, train_clt

    m, train, _ = organism
    cfg = TrainConfig(arch="jumprelu", d_sae=256, k=16, total_tokens=25_600, batch_size=256, lr=3e-3, progress=False)
    tr = train_clt(m, train, cfg=cfg, cross=CrossConfig(steps=100, batch_size=512))
    ctl = train_clt(m, train, cfg=cfg, cross=CrossConfig(steps=100, batch_size=512, cross_layer=False))
    print(tr.summary(), ctl.summary())
    assert tr.fvu_joint < 0.9 * tr.fvu_per_layer                              # stage 2 helps
    assert tr.fvu_joint < ctl.fvu_joint                                       # and the cross-layer writes are part of it
    assert all(float(w.detach().abs().max()) == 0 for w in ctl.clt.W_later if w.numel())
    q = evaluate_clt(m, tr.clt, train[:16])
    assert q.summary()["recovered_zero"] > 0.9 and abs(q.summary()["fvu_mean"] - tr.fvu_joint) < 0.05
    back = load_circuit_tracer_clt(save_circuit_tracer_clt(tr.clt, tmp_path / "ct"), model=m)
    assert _state_equal(tr.clt, back)
