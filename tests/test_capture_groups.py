"""``capture_groups``: sites of different widths in one forward pass per batch, each group equal (bitwise) to
``interp.capture`` of that group alone, with its mask, sink flags and meta.

Reading an attention pattern runs the pass's attention in the open (``interp.attention``), so in a model loaded with
SDPA the other groups of a pass with patterns are SDPA's values only to float rounding; bitwise equality of every
group is tested on models loaded with eager attention, and on SDPA models for the pattern group and for passes
without inner attention sites."""

from __future__ import annotations

import pytest
import torch

import interp
from interp.capturing import capture_groups
from interp.hooking import module_hooks
from interp.testing.tiny import MOE_FAMILIES, tiny_model

from .conftest import mixed_prompts

GROUPS = {"pattern": "pattern", "resid": "resid_post", "z": "attn_z", "neurons": "mlp_post"}


def _same(got, want):
    assert got.sites == want.sites and got.prompt_ids == want.prompt_ids and got.positions == want.positions
    assert got.tensor.dtype == want.tensor.dtype and got.tensor.shape == want.tensor.shape
    torch.testing.assert_close(got.tensor, want.tensor, atol=0, rtol=0)
    for a, b in ((got.mask, want.mask), (got.sinks, want.sinks)):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a, b)
    assert got.meta == want.meta


def _passes(model):
    """A counter of forward passes (calls of the first block)."""
    calls = []
    return calls, module_hooks([(model.block(0), "post", lambda mod, args, out: calls.append(1))])


_EAGER: dict[str, object] = {}


def _eager(family):
    if family not in _EAGER:
        _EAGER[family] = tiny_model(family, attn_implementation="eager")
    return _EAGER[family]


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", "qwen2"])
@pytest.mark.parametrize("positions", ["last", "all", [0, -1], "prompt_mean"])
def test_each_group_equals_its_own_capture(family, positions):
    m = _eager(family)
    texts = mixed_prompts(5, seed=3, longest=12)                     # mixed lengths: padded batches
    groups = {k: v for k, v in GROUPS.items() if not (k == "pattern" and positions == "prompt_mean")}
    run = interp.Runtime(batch_size=2, sort_by_length=True, progress=False)
    calls, hooked = _passes(m)
    with hooked:
        got = capture_groups(m, texts, groups, positions, runtime=run)
    assert len(calls) == 3                                           # one pass per batch (5 prompts, batches of 2)
    assert list(got) == list(groups)
    for name, sites in groups.items():
        _same(got[name], interp.capture(m, texts, sites, positions, runtime=run))


def test_sdpa_model_pattern_group_bitwise_the_rest_to_rounding(tiny_models):
    m = tiny_models("llama")
    assert m.config._attn_implementation == "sdpa"
    texts = mixed_prompts(5, seed=4, longest=12)
    run = interp.Runtime(batch_size=2, progress=False)
    got = capture_groups(m, texts, {"pattern": "pattern", "resid": "resid_post"}, "all", runtime=run)
    _same(got["pattern"], interp.capture(m, texts, "pattern", "all", runtime=run))
    torch.testing.assert_close(got["resid"].tensor, interp.capture(m, texts, "resid_post", "all", runtime=run).tensor,
                               atol=1e-5, rtol=1e-5)
    plain = capture_groups(m, texts, {"resid": "resid_post", "z": "attn_z", "neurons": "mlp_post"}, "all", runtime=run)
    for name, sites in (("resid", "resid_post"), ("z", "attn_z"), ("neurons", "mlp_post")):
        _same(plain[name], interp.capture(m, texts, sites, "all", runtime=run))


def test_layers_chat_prompts_and_dtype():
    m = _eager("llama")
    prompts = interp.Prompts(mixed_prompts(4, seed=1), responses=["a", "the of", "to", "it is"], labels=[0, 1, 0, 1])
    run = interp.Runtime(batch_size=3, dtype=torch.float64, progress=False)
    groups = {"pattern": ["pattern.1", "scores.0"], "resid": "resid_mid"}
    got = capture_groups(m, prompts, groups, "post_instruction", layers=[1], runtime=run)
    for name, sites in groups.items():
        _same(got[name], interp.capture(m, prompts, sites, "post_instruction", layers=[1], runtime=run))
    assert got["resid"].labels == [0, 1, 0, 1]


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_moe_groups(family):
    m = _eager(family)
    texts = mixed_prompts(3, seed=2, longest=10)
    groups = {"experts": "experts_out", "resid": "resid_post", "pattern": "pattern"}
    if m.spec.shared_expert:
        groups["shared"] = "shared_expert_out"
    run = interp.Runtime(batch_size=2, progress=False)
    got = capture_groups(m, texts, groups, "all", runtime=run)
    for name, sites in groups.items():
        _same(got[name], interp.capture(m, texts, sites, "all", runtime=run))


def test_bad_groups_and_the_width_error_names_capture_groups(tiny_models):
    m = tiny_models("llama")
    with pytest.raises(TypeError, match="non-empty dict"):
        capture_groups(m, ["a b"], {})
    with pytest.raises(TypeError, match="non-empty dict"):
        capture_groups(m, ["a b"], ["resid_post", "pattern"])
    with pytest.raises(ValueError, match="different widths.*capture_groups"):
        capture_groups(m, ["a b"], {"mixed": ["resid_post.0", "pattern.0"]})
    with pytest.raises(ValueError, match="capture_groups"):
        interp.capture(m, ["a b"], ["resid_post.0", "mlp_post.0"])


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_pattern_rows_are_the_full_tables_rows(family):
    """A row rule picks query rows before aligning keys (no ``T x T`` copy): the rows equal the ``all`` table's."""
    m = _eager(family)
    texts = mixed_prompts(5, seed=5, longest=12)
    run = interp.Runtime(batch_size=2, progress=False)
    full = interp.capture(m, texts, ["pattern.0", "scores.1"], "all", runtime=run)
    lengths = full.meta["key_lengths"]
    P = full.tensor.shape[2]
    for rule, rows in (("last", [[-1]] * 5), ([0, -2], [[0, -2]] * 5)):
        got = interp.capture(m, texts, ["pattern.0", "scores.1"], rule, runtime=run)
        for r, n in enumerate(lengths):
            cols = [P - n + (q if q >= 0 else n + q) for q in rows[r]]  # left-padded columns of the full table
            want = full.tensor[r, :, cols]
            have = got.tensor[r] if rule == "last" else got.tensor[r, :, -len(cols):]
            torch.testing.assert_close(have.reshape(want.shape), want, atol=0, rtol=0)


@pytest.mark.parametrize("positions", ["last", "prompt_mean"])
def test_nnsight_backend_groups_in_one_trace(positions):
    """The nnsight backend: every group read in one trace, each equal to that group's own capture there."""
    import warnings

    from nnsight import LanguageModel

    m = tiny_model("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = interp.from_nnsight(LanguageModel(m.hf, tokenizer=m.tokenizer), backend="nnsight")
    texts = mixed_prompts(4, seed=6, longest=10)
    run = interp.Runtime(batch_size=2, progress=False)
    groups = {"resid": "resid_post", "neurons": "mlp_post", "z": "attn_z"}
    got = capture_groups(a, texts, groups, positions, runtime=run)
    for name, sites in groups.items():
        _same(got[name], interp.capture(a, texts, sites, positions, runtime=run))
        torch.testing.assert_close(got[name].tensor, interp.capture(m, texts, sites, positions, runtime=run).tensor,
                                   atol=1e-5, rtol=1e-5)
