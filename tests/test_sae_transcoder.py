"""Transcoders: training on MLP input -> output pairs (TopK, JumpReLU, skip), a mixture-of-experts block, the
quality metrics with every MLP replaced (CE checked against a plain HF forward with module hooks), resumption and
bad input. Formats are in test_sae_transcoder_formats.py.

Figures (organism, a trained 4-layer width-64 Llama; TopK d_sae 256, k 16, 300 steps of 256 tokens; 48 held-out
chat prompts): FVU of the MLP output 0.011 / 0.051 / 0.029 / 0.038 by layer (a random transcoder: > 1); CE 2.091
nats clean, 2.062 with all four MLPs replaced, 6.609 with them zeroed: 1.006 of the loss recovered. Layer 0 after
200 steps, no skip / skip: TopK 0.016 / 0.014, JumpReLU 0.018 / 0.015 at L0 16.2 / 16.3.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sae.quality import evaluate
from sae.train_config import TrainConfig
from sae.transcoder import Transcoder, TranscoderConfig, check_transcoders
from sae.transcoder_quality import ce_loss_recovered_transcoders, evaluate_transcoders
from sae.transcoder_train import capture_pairs, fit_transcoder, pair_sites, train_transcoder

FAST = dict(d_sae=256, k=16, total_tokens=76_800, batch_size=256, lr=3e-3, progress=False)


@pytest.fixture(scope="module")
def trained(organism):
    m, train, _ = organism
    return train_transcoder(m, train, cfg=TrainConfig(arch="topk", **FAST))


@pytest.fixture(scope="module")
def pairs(organism):
    m, train, val = organism
    return capture_pairs(m, train, [0]), capture_pairs(m, val, [0])


def _xy(acts, layer=0):
    a, b = pair_sites(layer)
    return acts.flat_tokens(a), acts.flat_tokens(b)


def test_training_lowers_the_fvu_of_every_mlp_output(organism, trained):
    m, _, val = organism
    q = evaluate_transcoders(m, trained.transcoders, val, ce=False)
    df = q.to_frame()
    print(df[["layer", "fvu", "l0", "dead_fraction"]])
    assert list(df.layer) == [0, 1, 2, 3] and (df.fvu < 0.15).all() and (abs(df.l0 - 16) < 0.5).all()
    assert (df.dead_fraction < 0.3).all()  # never fired on ~1100 held-out tokens
    untrained = Transcoder(trained[0].cfg, seed=3)  # same shape, random weights: far worse, so the test can fail
    x, y = _xy(capture_pairs(m, val, [0]))
    assert evaluate(untrained, x, target=y).fvu > 1.0
    h = trained.to_frame()
    assert set(h.layer) == {0, 1, 2, 3} and h[h.layer == 0].fvu.iloc[-1] < 0.5 * h[h.layer == 0].fvu.iloc[0]
    tc = trained[2]
    assert (tc.layer, tc.cfg.input_site, tc.cfg.site) == (2, "blocks.2.mlp.hook_in", "blocks.2.mlp.hook_out")
    assert tc.cfg.model_id == m.name and tc.cfg.meta["target_scale"] > 0


@pytest.mark.parametrize("arch", ["topk", "jumprelu"])
def test_skip_and_no_skip_train(pairs, arch):
    (tr, ev) = pairs
    x, y = _xy(tr)
    xe, ye = _xy(ev)
    kw = {**FAST, "total_tokens": 51_200}  # 200 steps
    res = {skip: fit_transcoder((x, y), 0, arch=arch, skip=skip, **kw) for skip in (False, True)}
    fvu = {s: evaluate(r.sae, xe, target=ye).fvu for s, r in res.items()}
    l0 = {s: evaluate(r.sae, xe, target=ye).l0 for s, r in res.items()}
    print(arch, "FVU no skip / skip", fvu, "L0", l0)
    assert res[False].sae.W_skip is None and float(res[True].sae.W_skip.detach().abs().sum()) > 0  # the skip was trained
    assert fvu[False] < 0.05 and fvu[True] < 0.05 and fvu[True] < 1.2 * fvu[False]
    if arch == "jumprelu":
        assert all(10 < v < 24 for v in l0.values())  # near the L0 target k=16
    with pytest.raises(ValueError, match="skip connection: pass the MLP input"):
        res[True].sae.decode(res[True].sae.encode(xe))


@pytest.mark.parametrize("family", ["qwen2_moe", "mixtral"])
def test_moe_block_as_a_whole(tiny_models, family):
    m = tiny_models(family)
    ids = torch.randint(7, 256, (48, 24), generator=torch.Generator().manual_seed(0))
    acts = capture_pairs(m, ids, [1])
    seen = {}
    block = m.hf.model.layers[1].mlp  # the sparse MoE block (and its shared expert)
    h_in = block.register_forward_pre_hook(lambda mod, a, kw: seen.__setitem__("in", (a or (kw["hidden_states"],))[0]),
                                           with_kwargs=True)
    h_out = block.register_forward_hook(lambda mod, a, out: seen.__setitem__("out", out[0] if isinstance(out, tuple)
                                                                             else out))
    try:
        with torch.no_grad():
            m.hf(input_ids=ids[:1])
    finally:
        h_in.remove(), h_out.remove()
    x, y = _xy(acts, 1)
    torch.testing.assert_close(x[:24], seen["in"][0].float(), atol=1e-5, rtol=1e-5)  # the oracle: plain module hooks
    torch.testing.assert_close(y[:24], seen["out"][0].float(), atol=1e-5, rtol=1e-5)
    r = fit_transcoder(acts, 1, arch="topk", d_sae=256, k=16, total_tokens=51_200, batch_size=256, lr=3e-3,
                       progress=False)
    f = evaluate(r.sae, x, target=y).fvu
    print(family, "MoE block FVU", f)
    assert f < 0.6 and r.sae.cfg.site == "blocks.1.mlp.hook_out"


def _hand_ce(m, prompts, tcs, mode):
    """Mean next-token CE with plain HF forwards, one prompt at a time, MLP modules hooked by hand."""
    from interp.forward import encodings

    handles = []
    for layer, tc in tcs.items():
        mlp, box = m.hf.model.layers[layer].mlp, {}
        handles.append(mlp.register_forward_pre_hook(lambda mod, a, box=box: box.__setitem__("x", a[0])))

        def out_hook(mod, a, out, box=box, tc=tc):
            if mode == "zero":
                return torch.zeros_like(out)
            return tc(box["x"]).to(out.dtype)

        if mode != "clean":
            handles.append(mlp.register_forward_hook(out_hook))
    tot, n = 0.0, 0
    try:
        with torch.no_grad():
            for e in encodings(m, prompts, chat=True):
                ids = torch.tensor([e.ids])
                logits = m.hf(input_ids=ids).logits[0].double()
                tot += float(F.cross_entropy(logits[:-1], ids[0, 1:], reduction="sum"))
                n += ids.shape[1] - 1
    finally:
        for h in handles:
            h.remove()
    return tot / n


def test_ce_recovered_with_every_mlp_replaced_matches_a_hand_computation(organism, trained):
    m, _, val = organism
    tcs = trained.transcoders
    ce = ce_loss_recovered_transcoders(m, tcs, val, batch_size=5)  # padded batches; the oracle: one by one
    print(ce.to_frame())
    for mode, ours in (("clean", ce.clean), ("replaced", ce.sae), ("zero", ce.zero_ablated)):
        assert ours == pytest.approx(_hand_ce(m, val, tcs, mode), rel=1e-5), mode
    # replaced within a tenth of the ablations' gap of clean (it may land a little below clean on held-out prompts)
    assert ce.clean < ce.mean_ablated < ce.zero_ablated and abs(ce.sae - ce.clean) < 0.1 * (ce.mean_ablated - ce.clean)
    assert 0.9 < ce.recovered_zero < 1.1 and 0.9 < ce.recovered_mean < 1.1
    one = ce_loss_recovered_transcoders(m, {1: tcs[1]}, val[:8])  # a dict replaces only those layers
    assert one.n_predictions > 0 and one.sae < one.zero_ablated


def test_splice_keeping_the_error_leaves_the_logits(organism, trained):
    from interp.forward import batch_of, forward
    from sae.edits import TranscoderSplice

    m, _, val = organism
    b = batch_of(m, val[:4])
    clean = forward(m, b)
    sp = TranscoderSplice(trained.transcoders, keep_error=True)
    torch.testing.assert_close(forward(m, b, sp.hook_fns(m)), clean, atol=1e-5, rtol=1e-5)
    assert sorted(sp.last_latents) == [0, 1, 2, 3] and sp.last_latents[0].shape[-1] == 256
    replaced = forward(m, b, TranscoderSplice(trained.transcoders).hook_fns(m))
    assert not torch.allclose(replaced, clean, atol=1e-4)


def test_out_dir_resumes_exactly(tmp_path, pairs):
    x, y = _xy(pairs[0])
    kw = dict(arch="jumprelu", skip=True, d_sae=128, k=8, total_tokens=256 * 30, batch_size=256, lr=3e-3,
              progress=False, checkpoint_every=10)
    full = fit_transcoder((x, y), 0, **kw)

    def stop(tr):
        if tr.step == 20:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fit_transcoder((x, y), 0, out_dir=tmp_path, callback=stop, **kw)
    resumed = fit_transcoder((x, y), 0, out_dir=tmp_path, **kw)
    for k, v in full.sae.state_dict().items():
        torch.testing.assert_close(resumed.sae.state_dict()[k], v, atol=1e-6, rtol=1e-5)
    assert resumed.target_scale == pytest.approx(full.target_scale)
    back = Transcoder.load(tmp_path / "sae")
    torch.testing.assert_close(back(x[:50]), full.sae(x[:50]), atol=1e-6, rtol=1e-5)


def test_bad_input_gets_clear_errors(tiny_models, organism):
    m, *_ = organism
    tiny = tiny_models("llama")
    ok = Transcoder(TranscoderConfig(d_in=64, d_sae=32, arch="topk", k=4, layer=0, model_id=m.name))
    narrow = Transcoder(TranscoderConfig(d_in=32, d_sae=32, arch="topk", k=4, layer=0))
    with pytest.raises(ValueError, match="d_model=64; train or load transcoders for this model"):
        check_transcoders(m, {0: narrow})
    with pytest.raises(ValueError, match=r"1 transcoders for the 4 layers .* dict"):
        check_transcoders(m, [ok])
    with pytest.raises(ValueError, match="layers are 0..3"):
        check_transcoders(m, {7: Transcoder(TranscoderConfig(d_in=64, d_sae=32, arch="topk", k=4, layer=7))})
    with pytest.raises(ValueError, match="trained for layer 0; key it by its layer"):
        check_transcoders(m, {1: ok})
    with pytest.raises(ValueError, match="trained on 'organism', not 'tiny-llama'"):
        ce_loss_recovered_transcoders(tiny, {0: ok}, [[7, 8, 9]])
    with pytest.raises(ValueError, match=r"layer 5 is out of range: tiny-llama has layers 0..1"):
        train_transcoder(tiny, [[7, 8, 9]], layers=[5])
    with pytest.raises(ValueError, match="name a layer twice"):
        capture_pairs(tiny, [[7, 8, 9]], layers=[1, -1])
    x = torch.randn(100, 64)
    with pytest.raises(ValueError, match=r"transcoders train as arch \['relu', 'topk', 'jumprelu'\]"):
        fit_transcoder((x, x), arch="batchtopk", total_tokens=256, batch_size=64)
    with pytest.raises(ValueError, match="same tokens"):
        fit_transcoder((x, x[:50]), total_tokens=256, batch_size=64)
    with pytest.raises(ValueError, match="use sae.transcoder_train.fit_transcoder"):
        from sae.trainer import train_sae
        train_sae((x, x), total_tokens=256, batch_size=64)


def test_pairs_stream_from_a_store(tmp_path, tiny_models):
    from sae.stream import TokenStream

    m = tiny_models("llama")
    ids = torch.randint(7, 256, (24, 16), generator=torch.Generator().manual_seed(2))
    store = capture_pairs(m, ids, [0, 1], batch_size=6, out=tmp_path / "pairs")  # 4 shards on disk
    mem = capture_pairs(m, ids, [0, 1])
    x, y = _xy(mem, 1)
    s = TokenStream(store, 64, site="mlp_in.1", target_site="mlp_module_out.1", buffer_tokens=128)
    assert (s.d, s.d_out) == (64, 64)
    xb, yb = s.split(next(s))
    idx = torch.cdist(xb, x).argmin(1)  # each streamed input row is a captured one, with its own output beside it
    torch.testing.assert_close(xb, x[idx], atol=1e-6, rtol=0)
    torch.testing.assert_close(yb, y[idx], atol=1e-6, rtol=0)
    r = fit_transcoder(store, 1, arch="topk", d_sae=128, k=8, total_tokens=64 * 20, batch_size=64, progress=False)
    assert r.sae.cfg.input_site == "blocks.1.mlp.hook_in" and r.steps == 20


def test_skip_sink_trains_on_every_token_but_each_prompts_first(organism, pairs):
    """``skip_sink=True`` equals training on the captured pairs with each prompt's first token removed by hand."""
    from interp.positions import without_first

    m, train, _ = organism
    cfg = dict(FAST, total_tokens=2560)
    got = train_transcoder(m, train, [0], cfg=TrainConfig(arch="topk", **cfg), sinks="exclude")[0]
    acts, _ = pairs
    keep = without_first(acts.mask)
    a, b = pair_sites(0)
    cols = acts.tensor.permute(0, 2, 1, 3)[keep]
    x, y = cols[:, acts.sites.index(a)], cols[:, acts.sites.index(b)]
    assert x.shape[0] == int(acts.mask.sum()) - acts.mask.shape[0]
    want = fit_transcoder((x, y), 0, arch="topk", model_id=m.name, **cfg).sae
    assert all(torch.equal(p, q) for p, q in zip(got.state_dict().values(), want.state_dict().values()))


def test_transcoder_ablation_equals_decoder_edits_at_every_position(tiny_models):
    """Ablating features at every position through ``sae.edits.TranscoderAblation`` gives the logits of
    ``patching.graph_edits.DecoderEdit`` with one scale-0 edit per (layer, position, feature); errors stay."""
    import steering
    from interp.forward import batch_of, forward
    from interp.patching.graph_edits import DecoderEdit, FeatureEdit
    from sae.edits import TranscoderAblation

    m = tiny_models("llama")
    tcs = {}
    for layer in range(m.n_layers):
        tc = Transcoder(TranscoderConfig(d_in=m.d_model, d_sae=32, arch="relu", layer=layer), seed=layer)
        with torch.no_grad():
            tc.W_enc.mul_(3.0)
            tc.b_enc.fill_(0.2)
        tcs[layer] = tc
    ids = torch.tensor([[1, 20, 31, 42, 55, 60]])
    b = batch_of(m, ids)
    feats = [(0, 3), (0, 7), (1, 11)]
    with torch.no_grad():
        base = forward(m, b)[0]
        with steering.apply(m, TranscoderAblation(tcs, feats)):
            ours = forward(m, b)[0]
        edits = [FeatureEdit(la, p, f, scale=0.0) for la, f in feats for p in range(ids.shape[1])]
        with steering.apply(m, DecoderEdit(tcs, edits)):
            theirs = forward(m, b)[0]
    assert (ours - base).abs().max() > 1e-4 and (ours - theirs).abs().max() < 1e-5
    with pytest.raises(ValueError, match="no transcoder for layer 3"):
        TranscoderAblation(tcs, [(3, 0)])
    with pytest.raises(ValueError, match="out of range"):
        TranscoderAblation(tcs, [(0, 99)])


def test_quality_without_the_sink_counts_one_token_fewer_per_prompt(organism, trained):
    m, _, val = organism
    full = evaluate_transcoders(m, trained.transcoders, val[:6], ce=False)
    less = evaluate_transcoders(m, trained.transcoders, val[:6], ce=False, sinks="exclude")
    assert all(less.layers[la].n_tokens == full.layers[la].n_tokens - 6 for la in full.layers)
