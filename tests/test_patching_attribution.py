"""Attribution patching: exact where the metric is linear in the patched site, correlated with exact patching
elsewhere (tiny model always; the organism when it exists), shapes and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

from interp.patching import attribute, logit_diff, make_pairs
from interp.patching.attribution import compare_attribution
from interp.testing.tiny import tiny_model

CLEAN = ["the man is big", "a man can go home", "you are here now"]
CORRUPT = ["the boy is small", "a boy can see home", "we are there now"]
ORGANISM = Path(__file__).resolve().parents[1] / "interp" / "embedded"


def _metric(m):
    tok = m.tokenizer
    return logit_diff(tok.convert_tokens_to_ids("the"), tok.convert_tokens_to_ids("a"))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_exact_for_final_norm_output(family):
    """ln_final's output reaches a logit difference only through the (linear) unembedding."""
    m = tiny_model(family)
    pairs = make_pairs(m, CLEAN, CORRUPT)
    chk = compare_attribution(m, pairs, _metric(m), sites=["ln_final"])
    assert chk.exact["ln_final"].abs().max() > 1e-4
    assert chk.max_abs_err["ln_final"] < 1e-6
    assert chk.summary()["kinds"]["ln_final"] == {"n": chk.exact["ln_final"].numel(), "pearson_r": chk.r["ln_final"],
                                                  "max_abs_err": chk.max_abs_err["ln_final"]}


def test_exact_when_everything_after_the_site_is_linear():
    """Final norm replaced by identity: the last layer's residual, MLP output and MLP neurons reach the logits
    linearly; with the last MLP also silenced, so do its heads and attention output."""
    m = tiny_model("llama", n_layers=2)
    m.hf.model.norm = nn.Identity()
    pairs = make_pairs(m, CLEAN, CORRUPT)
    met = _metric(m)
    chk = compare_attribution(m, pairs, met, sites=("resid_post", "mlp_out", "mlp_post"), layers=[1], n_neurons=16)
    for kind in ("resid_post", "mlp_out", "mlp_post"):
        assert chk.exact[kind].abs().max() > 1e-5, kind
        assert chk.max_abs_err[kind] < 1e-6, (kind, chk.max_abs_err[kind])
    nonlinear = compare_attribution(m, pairs, met, sites=["attn_z"], layers=[1])
    assert nonlinear.max_abs_err["attn_z"] > 1e-6  # heads still feed the (nonlinear) MLP here
    with torch.no_grad():
        m.module("mlp.down_proj", 1).weight.zero_()
    chk = compare_attribution(m, pairs, met, sites=("attn_z", "attn_out", "resid_mid"), layers=[1])
    for kind in ("attn_z", "attn_out", "resid_mid"):
        assert chk.exact[kind].abs().max() > 1e-5, kind
        assert chk.max_abs_err[kind] < 1e-6, (kind, chk.max_abs_err[kind])


def test_correlates_with_exact_patching_on_tiny_model():
    m = tiny_model("llama", n_layers=3)
    pairs = make_pairs(m, CLEAN, CORRUPT)
    chk = compare_attribution(m, pairs, _metric(m))
    print("tiny llama attribution vs exact:", chk.table())
    for kind, r in chk.r.items():
        assert r > 0.8, (kind, r)
    fig = chk.plot()
    assert len(fig.data) == len(chk.r) + 1


def test_shapes_and_baseline():
    m = tiny_model("llama")
    pairs = make_pairs(m, CLEAN, CORRUPT)
    att = attribute(m, pairs, _metric(m))
    P = pairs.n_positions
    assert att["resid_pre"].shape == (2, P)
    assert att["attn_z"].shape == (2, m.n_heads)
    assert att["mlp_post"].shape == (2, m.d_mlp)
    assert att.per_position["mlp_post"].shape == (2, P, m.d_mlp)
    # heads summed over positions == the per-position estimates summed
    assert torch.allclose(att["attn_z"].delta, att.per_position["attn_z"].sum(1), atol=1e-6)
    # source == target: every estimate is exactly zero
    same = attribute(m, pairs, _metric(m), runs=("corrupted", "corrupted"))
    assert all(float(sw.delta.abs().max()) == 0.0 for sw in same.sweeps.values())
    # the weights stay untouched and get no gradients
    assert all(p.grad is None for p in m.hf.parameters())
    with pytest.raises(KeyError, match="computed"):
        att["resid_mid"]


def test_bad_metric():
    m = tiny_model("llama")
    pairs = make_pairs(m, CLEAN, CORRUPT)
    with pytest.raises(ValueError, match="one number"):
        attribute(m, pairs, lambda logits: logits.sum(-1))


@pytest.mark.skipif(not (ORGANISM / "organism" / "config.json").exists(),
                    reason="the organism checkpoint is not in interp/embedded yet (python -m interp.organisms.train)")
def test_correlates_on_organism():
    from interp import load_model
    from interp.data import load_prompts
    from interp.patching import refusal_score
    from interp.patching.measures import refusal_token_ids

    m = load_model("organism")
    harmful = [r["instruction"] if isinstance(r, dict) else r for r in load_prompts("organism_harmful_val")][:8]
    harmless = [r["instruction"] if isinstance(r, dict) else r for r in load_prompts("organism_harmless_val")][:8]
    pairs = make_pairs(m, harmful, harmless)
    met = refusal_score(refusal_token_ids(m.tokenizer))
    chk = compare_attribution(m, pairs, met, n_neurons=32)
    print("organism attribution vs exact:", chk.table())
    assert chk.meta["reference"] > chk.meta["baseline"]  # harmful prompts score higher for refusal
    for kind in ("attn_out", "mlp_out", "attn_z", "mlp_post"):
        assert chk.r[kind] > 0.5, (kind, chk.r[kind])
