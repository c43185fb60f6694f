"""Exact activation patching: batched sweeps against a naive one-forward-per-cell loop, clean/corrupted
sanity (clean source restores the clean metric, corrupted source changes nothing), alignments, bad input."""

from __future__ import annotations

import pytest
import torch

import interp
from interp.forward import last_logits
from interp.hooking import hooks
from interp.patching import logit_diff, make_pairs, patch, sweep_layers, sweep_positions
from interp.patching.activation import Patch, sweep_heads
from interp.testing.tiny import tiny_model

CLEAN = ["the man is big", "a man can go home", "you are here now"]
CORRUPT = ["the boy is small", "a boy can see home", "we are there now"]


def _setup(family: str, n_layers: int = 2):
    m = tiny_model(family, n_layers=n_layers)
    tok = m.tokenizer
    met = logit_diff(tok.convert_tokens_to_ids("the"), tok.convert_tokens_to_ids("a"))
    return m, make_pairs(m, CLEAN, CORRUPT), met


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", "qwen2_moe"])
def test_clean_source_restores_clean_metric(family):
    m, pairs, met = _setup(family)
    L = m.n_layers
    vals = patch(m, pairs, [Patch("resid_pre.0"), Patch(f"resid_post.{L - 1}"), Patch(f"resid_post.{L - 1}", position=-1)],
                 met)
    sw = sweep_positions(m, pairs, met, "resid_post")
    assert abs(sw.reference - sw.baseline) > 1e-4  # the runs differ, so the test has teeth
    assert torch.allclose(vals, torch.full_like(vals, sw.reference), atol=1e-5)
    assert abs(float(sw.values[-1, -1]) - sw.reference) < 1e-5  # last layer, last position carries everything read
    assert abs(float(sw.normalized()[-1, -1]) - 1.0) < 1e-3


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", "qwen2_moe"])
def test_corrupted_source_changes_nothing(family):
    m, pairs, met = _setup(family)
    for site in ("resid_pre", "resid_mid", "attn_out", "mlp_out"):
        if site == "resid_mid" and m.spec.resid_mid_in is None:
            continue
        sw = sweep_positions(m, pairs, met, site, runs=("corrupted", "corrupted"))
        assert torch.allclose(sw.values, torch.full_like(sw.values, sw.baseline), atol=1e-5), site
    sh = sweep_heads(m, pairs, met, runs=("corrupted", "corrupted"))
    assert torch.allclose(sh.values, torch.full_like(sh.values, sh.baseline), atol=1e-5)
    if not m.spec.is_moe:
        v = patch(m, pairs, [Patch("mlp_post.1", neuron=3), Patch("attn_z.0", position=2, head=1)], met,
                  runs=("corrupted", "corrupted"))
        assert torch.allclose(v, torch.full_like(v, sh.baseline), atol=1e-5)


def _naive_sweep(m, pairs, met, kind):
    """One forward per (layer, position): capture the clean site, overwrite it in the corrupted run."""
    clean_in, corr_in = pairs.clean, pairs.corrupted
    out = torch.zeros(m.n_layers, pairs.n_positions)
    rows = torch.arange(pairs.n_pairs)
    for layer in range(m.n_layers):
        site = f"blocks.{layer}.hook_{kind}"
        got = {}

        def keep(x, ctx, got=got):
            got["x"] = x.clone()

        with torch.no_grad(), hooks(m, {site: keep}):
            m.hf(**clean_in.model_inputs)
        for p in range(pairs.n_positions):
            src = got["x"][rows, pairs.cols["clean"][:, p]]

            def put(x, ctx, p=p, src=src):
                x = x.clone()
                x[rows, pairs.cols["corrupted"][:, p]] = src
                return x

            with torch.no_grad(), hooks(m, {site: put}):
                out[layer, p] = met(last_logits(m, corr_in))
    return out


@pytest.mark.parametrize("family,kind", [("llama", "resid_pre"), ("gpt2", "attn_out"), ("phi3", "mlp_out")])
def test_batched_sweep_matches_naive_loop(family, kind):
    m, pairs, met = _setup(family)
    naive = _naive_sweep(m, pairs, met, kind)
    for bs in (pairs.n_pairs, 1000):  # one variant per forward, and every variant in one forward
        sw = sweep_positions(m, pairs, met, kind, runtime=interp.Runtime(batch_size=bs))
        assert sw.shape == (m.n_layers, pairs.n_positions)
        assert torch.allclose(sw.values, naive, atol=1e-5), (bs, (sw.values - naive).abs().max())
    assert (naive - sw.baseline).abs().max() > 1e-4


def test_sweep_layers_and_heads_shapes_and_consistency():
    m, pairs, met = _setup("llama")
    sl = sweep_layers(m, pairs, met)
    assert sl.shape == (2, 3) and sl.cols == ["resid_pre", "attn_out", "mlp_out"]
    # patching a layer's whole attention output == patching all its heads' z at once (o_proj is linear, no bias)
    all_heads = patch(m, pairs, [[Patch("attn_z.1", head=h) for h in range(m.n_heads)]], met)
    assert abs(float(all_heads[0]) - float(sl.values[1, 1])) < 1e-5
    sh = sweep_heads(m, pairs, met, layers=[1], positions=[-1, -2])
    assert sh.shape == (1, m.n_heads)
    fig = sh.plot()
    assert fig.data[0].type == "heatmap"
    assert len(sl.top(3)) == 3


def test_different_lengths_with_alignment():
    m = tiny_model("llama")
    tok = m.tokenizer
    met = logit_diff(tok.convert_tokens_to_ids("the"), tok.convert_tokens_to_ids("a"))
    clean = ["the man is big and old", "a man can go"]
    corrupt = ["the boy is small", "a big boy can see the water"]
    pairs = make_pairs(m, clean, corrupt)  # aligned from the end
    lc, lr = pairs.clean.attention_mask.sum(1), pairs.corrupted.attention_mask.sum(1)
    assert pairs.n_positions == int(torch.minimum(lc, lr).min())
    # last layer, last aligned position: the corrupted run then reads exactly the clean logits
    v = patch(m, pairs, [Patch("resid_post.1", position=-1)], met)
    with torch.no_grad():
        clean_metric = float(met(last_logits(m, pairs.clean)))
    assert abs(float(v[0]) - clean_metric) < 1e-5
    same = sweep_positions(m, pairs, met, "resid_pre", runs=("corrupted", "corrupted"))
    assert torch.allclose(same.values, torch.full_like(same.values, same.baseline), atol=1e-5)
    explicit = make_pairs(m, clean, corrupt, align=[(0, 0), (-1, -1)])
    T_c, T_r = pairs.clean.input_ids.shape[1], pairs.corrupted.input_ids.shape[1]
    assert explicit.cols["clean"][:, 1].tolist() == [T_c - 1, T_c - 1]
    assert explicit.cols["corrupted"][:, 0].tolist() == [T_r - int(lr[0]), T_r - int(lr[1])]
    per_pair = make_pairs(m, clean, corrupt, align=[[(1, 1)], [(2, 3)]])
    assert per_pair.n_positions == 1


def test_bad_input():
    m, pairs, met = _setup("llama")
    with pytest.raises(ValueError, match="out of range"):
        make_pairs(m, CLEAN, CORRUPT, align=[(0, 0), (40, 1)])
    with pytest.raises(ValueError, match="out of range"):
        make_pairs(m, CLEAN, CORRUPT, align=[(-30, 0)])
    with pytest.raises(ValueError, match="paired 1:1"):
        make_pairs(m, CLEAN, CORRUPT[:2])
    with pytest.raises(ValueError, match="align must be"):
        make_pairs(m, CLEAN, CORRUPT, align="middle")
    with pytest.raises(ValueError, match="aligned position"):
        patch(m, pairs, [Patch("resid_pre.0", position=pairs.n_positions)], met)
    with pytest.raises(ValueError, match="one\nnumber|one number"):
        sweep_positions(m, pairs, lambda logits: logits[:, 0], "resid_pre")
    with pytest.raises(TypeError, match="scalar tensor"):
        sweep_positions(m, pairs, lambda logits: "high", "resid_pre")
    with pytest.raises(ValueError, match="attn_z"):
        patch(m, pairs, [Patch("resid_pre.0", head=1)], met)
    with pytest.raises(ValueError, match="heads 0..3"):
        patch(m, pairs, [Patch("attn_z.0", head=9)], met)
    with pytest.raises(ValueError, match="layers 0..1"):
        sweep_positions(m, pairs, met, "resid_pre", layers=[5])
    with pytest.raises(ValueError, match="run must be"):
        sweep_positions(m, pairs, met, runs=("dirty", "corrupted"))
    with pytest.raises(TypeError, match="PromptPairs"):
        sweep_positions(m, (CLEAN, CORRUPT), met)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox", "gemma2", "olmo2", "qwen3_moe"])
def test_prefix_reuse_matches_full_forwards(family):
    """Recomputing only the columns from the first patched one gives the same metrics (padded batch)."""
    from interp.forward import prefix_cache
    from interp.patching.activation import Edit, prepare_patching, run_variants
    from interp.sites import Site

    m = tiny_model(family)
    tok = m.tokenizer
    met = logit_diff(tok.convert_tokens_to_ids("the"), tok.convert_tokens_to_ids("a"))
    pairs = make_pairs(m, ["the man is big and old", "a man can go"], ["the boy is small", "a big boy can see the water"])
    sites = [Site("resid_pre", 1), Site("attn_z", 0), Site("mlp_out", 1)]
    prep = prepare_patching(m, pairs, sites, met, "clean", "corrupted")
    P = pairs.n_positions
    variants = [[Edit(sites[0], torch.tensor([p]))] for p in range(P)]
    variants += [[Edit(sites[1], torch.tensor([p, P - 1]), 2), Edit(sites[2], torch.tensor([P - 1]))] for p in range(P)]
    args = (m, pairs.corrupted, variants, prep.values, prep.dst_cols, met)
    full = run_variants(*args, interp.Runtime(batch_size=8), reuse_prefix=False)
    reuse = run_variants(*args, interp.Runtime(batch_size=8), reuse_prefix=True)
    assert torch.allclose(full, reuse, atol=1e-5), (full - reuse).abs().max()
    assert (full - prep.baseline).abs().max() > 1e-5
    # full-attention caches are reused; sliding-window ones (gemma2) fall back to full forwards
    assert (prefix_cache(m, pairs.corrupted) is None) == (family == "gemma2")
