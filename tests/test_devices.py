"""Models split across devices by an accelerate ``device_map`` with CPU and disk offload: captures, steering,
generation and patching equal the unsplit model; bakes refuse offloaded weights with a clear error and bake a
materialized copy that equals hooks on the split model; a model dispatched with hooks bakes in place."""

from __future__ import annotations

import copy

import pytest
import torch

import interp
import steering
from interp import patching
from interp.capturing import capture
from interp.forward import batch_of, last_logits
from interp.models import from_hf, load_model, materialize, offloaded
from interp.patching.activation import sweep_heads
from interp.patching.heads import head_outputs
from interp.testing.tiny import tiny_model
from interp.values import Runtime

PROMPTS = ["the man is here", "a boy went home now", "you can see the water"]
CLEAN = ["the man is big", "a man can go home", "you are here now"]
CORRUPT = ["the boy is small", "a boy can see home", "we are there now"]
# the embedding, a middle block and the unembedding offloaded to disk; the rest resident on the CPU
DEVICE_MAP = {"model.embed_tokens": "disk", "model.layers.0": "cpu", "model.layers.1": "disk", "model.layers.2": "cpu",
              "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(unsplit, split): the same saved tiny Llama loaded plainly and with DEVICE_MAP."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    base = tiny_model("llama", n_layers=3)
    base.hf.save_pretrained(folder)
    base.tokenizer.save_pretrained(folder)
    plain = load_model(str(folder))
    split = load_model(str(folder), device_map=DEVICE_MAP, offload_folder=str(folder / "offload"))
    return plain, split


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def _last(model, *ivs):
    with steering.apply(model, *ivs):
        return last_logits(model, batch_of(model, PROMPTS))


def test_the_split_is_real(pair):
    plain, split = pair
    assert split.hf.hf_device_map == DEVICE_MAP
    off = offloaded(split)
    assert any(n.startswith("model.layers.1.") for n in off) and "model.embed_tokens.weight" in off
    assert not any(n.startswith("model.layers.0.") for n in off) and not offloaded(plain)
    assert split.device == torch.device("cpu")  # the embedding's execution device, not meta


def test_auto_device_map_under_a_memory_cap_offloads_and_captures_the_same(pair, tmp_path):
    plain, _ = pair
    auto = load_model(plain.name, device_map="auto", max_memory={"cpu": "250KB"}, offload_folder=str(tmp_path))
    assert "disk" in auto.hf.hf_device_map.values() and offloaded(auto)
    a = capture(plain, PROMPTS, positions="all", runtime=Runtime(progress=False)).tensor
    torch.testing.assert_close(capture(auto, PROMPTS, positions="all",
                                       runtime=Runtime(progress=False)).tensor, a, rtol=0, atol=1e-5)


def test_captures_equal_the_unsplit_model(pair):
    plain, split = pair
    sites = ["resid_pre", "resid_mid", "attn_out", "mlp_out", "resid_post"]
    a = capture(plain, PROMPTS, sites=sites, positions="all", runtime=Runtime(progress=False))
    b = capture(split, PROMPTS, sites=sites, positions="all", runtime=Runtime(progress=False))
    assert a.sites == b.sites and a.tensor.abs().max() > 0.1
    torch.testing.assert_close(b.tensor, a.tensor, rtol=0, atol=1e-5)
    z = capture(split, PROMPTS, sites="attn_z", layers=[1], runtime=Runtime(progress=False)).tensor
    torch.testing.assert_close(z, capture(plain, PROMPTS, sites="attn_z", layers=[1],
                                          runtime=Runtime(progress=False)).tensor,
                               rtol=0, atol=1e-5)


def test_steering_and_generation_equal_the_unsplit_model(pair):
    plain, split = pair
    g = torch.Generator().manual_seed(3)
    v, r = torch.randn(plain.d_model, generator=g), torch.randn(plain.d_model, generator=g)
    ivs = [steering.AddVector(v, layers=[1, 2], alpha=2.0), steering.DirectionalAblation(r),
           steering.Clamp(r, 1.5, layers=[0])]
    assert _rel(_last(plain, *ivs), _last(plain)) > 1e-3
    for iv in ivs:
        torch.testing.assert_close(_last(split, iv), _last(plain, iv), rtol=0, atol=1e-5)
    a = steering.generate(plain, PROMPTS, ivs[0], max_new_tokens=6, runtime=interp.Runtime(progress=False))
    b = steering.generate(split, PROMPTS, ivs[0], max_new_tokens=6, runtime=interp.Runtime(progress=False))
    assert a.token_ids == b.token_ids


def test_patching_equals_the_unsplit_model(pair):
    plain, split = pair
    tok = plain.tokenizer
    met = patching.logit_diff(tok.convert_tokens_to_ids("the"), tok.convert_tokens_to_ids("a"))

    def both(fn):
        return fn(plain), fn(split)

    for a, b in [both(lambda m: patching.sweep_positions(m, patching.make_pairs(m, CLEAN, CORRUPT), met).values),
                 both(lambda m: sweep_heads(m, patching.make_pairs(m, CLEAN, CORRUPT), met).values),
                 both(lambda m: patching.attribute(m, patching.make_pairs(m, CLEAN, CORRUPT), met,
                                                   runtime=Runtime(progress=False))["attn_z"].delta),
                 both(lambda m: head_outputs(m, PROMPTS, layers=[1]).per_head)]:
        assert a.abs().max() > 1e-4
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
    # receivers inside the offloaded block read its q/k/v weights inside a hook
    heads = [f"head.1.{h}" for h in range(plain.n_heads)]
    a, b = both(lambda m: patching.path_patch(m, patching.make_pairs(m, CLEAN, CORRUPT), met, "mlp.0", heads))
    assert abs(a - b) < 1e-5
    a, b = both(lambda m: patching.learn_mask(m, PROMPTS, met, config=patching.MaskConfig(steps=3),
                                              runtime=Runtime(progress=False)).scores)
    torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
    with patching.ablate_heads(split, [(1, 2)]):
        got = last_logits(split, batch_of(split, PROMPTS))
    with patching.ablate_heads(plain, [(1, 2)]):
        torch.testing.assert_close(got, last_logits(plain, batch_of(plain, PROMPTS)), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="materialize"):
        with patching.transplant(split, plain, [1], ["attn"]):
            pass


def test_bake_refuses_offloaded_weights_and_bakes_a_materialized_copy(pair):
    plain, split = pair
    r = torch.randn(plain.d_model, generator=torch.Generator().manual_seed(4))
    with pytest.raises(ValueError, match=r"materialize\(model\)"):
        steering.bake(split, r)
    solid = materialize(split)
    assert not offloaded(solid) and not hasattr(solid.hf, "hf_device_map")
    torch.testing.assert_close(_last(solid), _last(split), rtol=0, atol=1e-6)
    hooked = _last(split, steering.DirectionalAblation(r))
    assert _rel(hooked, _last(split)) > 1e-3
    assert _rel(_last(steering.bake(solid, r).model), hooked) <= 1e-4
    add = steering.AddVector(r, layers=[0, 1], sites=("attn_out", "resid_post"), alpha=2.0)
    with pytest.raises(ValueError, match="materialize"):
        steering.bake_addition(split, add)
    added = _last(split, add)
    assert _rel(added, _last(split)) > 1e-3
    assert _rel(_last(steering.bake_addition(solid, add).model), added) <= 1e-5


def test_a_model_dispatched_with_hooks_bakes_in_place_and_by_copy():
    """accelerate's own hooks on every block (as on a multi-GPU split): bake copies and edits through them."""
    from accelerate import dispatch_model

    m = tiny_model("llama", n_layers=3)
    dm = {k: "cpu" for k in DEVICE_MAP}
    split = from_hf(dispatch_model(copy.deepcopy(m.hf), dm, force_hooks=True), m.tokenizer, name="dispatched")
    assert hasattr(split.block(1), "_hf_hook") and not offloaded(split)
    r = torch.randn(m.d_model, generator=torch.Generator().manual_seed(5))
    hooked = _last(split, steering.DirectionalAblation(r))
    assert _rel(_last(steering.bake(split, r).model), hooked) <= 1e-4
    assert _rel(_last(split), hooked) > 1e-3  # the copy left the original alone
    steering.bake(split, r, inplace=True)
    assert _rel(_last(split), hooked) <= 1e-4
