"""Attention sites in activation patching (q / k / v / rot_q / rot_k / scores / pattern, per head), concat of
captured patterns, and the nnsight backend's refusal of attention sites."""

from __future__ import annotations

import warnings

import pytest
import torch

import interp
from interp.activations import Activations
from interp.attention import expand_kv
from interp.forward import last_logits
from interp.nnsight_backend import TraceEdit
from interp.patching.activation import Patch, chunk_hooks, patch, prepare_patching, resolve, sweep_layers
from interp.patching.measures import logit_diff
from interp.patching.runs import make_pairs, run_with_capture
from interp.sites import Site

QUIET = interp.Runtime(progress=False)
# pairs of equal token length, every position aligned (unequal lengths: test_pattern_patch_with_unaligned_keys)
CLEAN = [[5, 9, 14, 20, 7, 6], [3, 11, 8, 30, 12, 40]]
CORRUPT = [[5, 9, 21, 20, 7, 6], [3, 17, 8, 30, 12, 22]]


def _metric(m):
    return lambda logits: logits[:, 3].mean() - logits[:, 4].mean()


def _patched(m, pairs, patches, grab):
    """Run the corrupted batch with ``patches`` (one variant) from the clean run; keep ``grab`` sites."""
    edits = [resolve(m, p, pairs.n_positions) for p in patches]
    prep = prepare_patching(m, pairs, [e.site for e in edits], _metric(m), "clean", "corrupted")
    got = {}

    def keeper(name):
        return lambda x, ctx: got.__setitem__(name, x.detach().clone())

    keep = [(s, keeper(s)) for s in grab]
    with torch.no_grad(), interp.hooks(m, chunk_hooks([edits], prep.values, prep.dst_cols, pairs.n_pairs) + keep):
        last_logits(m, pairs.corrupted)
    return got


def _group_variants(m, layer):
    """Per key-value group: (its heads' last pattern rows + its v, its heads' last attn_z) as patch variants.
    Only at the last layer are the two the same edit: v at every position also changes the earlier positions'
    outputs, which later layers would read."""
    kv = m.n_heads // m.n_kv_heads
    groups = [range(g * kv, (g + 1) * kv) for g in range(m.n_kv_heads)]
    both = [[Patch(f"pattern.{layer}", position=-1, head=h) for h in hs] + [Patch(f"v.{layer}", head=g)]
            for g, hs in enumerate(groups)]
    z = [[Patch(f"attn_z.{layer}", position=-1, head=h) for h in hs] for hs in groups]
    return both, z


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen3"])
def test_pattern_of_one_head_gives_source_pattern_times_target_v(tiny_models, family):
    m = tiny_models(family)
    pairs = make_pairs(m, CLEAN, CORRUPT)
    layer, head = 1, 1
    src, _ = run_with_capture(m, pairs.clean, [Site("pattern", layer)])
    dst, _ = run_with_capture(m, pairs.corrupted, [Site("v", layer), Site("attn_z", layer)])
    got = _patched(m, pairs, [Patch(f"pattern.{layer}", head=head)], [f"attn_z.{layer}", f"pattern.{layer}"])
    v = expand_kv(dst[Site("v", layer)], m.n_heads)  # [n, T, H, d]
    want = torch.matmul(src[Site("pattern", layer)][:, head], v[:, :, head])  # [n, T, d]
    for r, n in enumerate(pairs.corrupted.attention_mask.sum(1).tolist()):
        T = want.shape[1]
        torch.testing.assert_close(got[f"attn_z.{layer}"][r, T - n:, head], want[r, T - n:], atol=1e-5, rtol=0)
        torch.testing.assert_close(got[f"pattern.{layer}"][r, head, T - n:], src[Site("pattern", layer)][r, head, T - n:],
                                   atol=0, rtol=0)
    others = [h for h in range(m.n_heads) if h != head]
    torch.testing.assert_close(got[f"attn_z.{layer}"][:, :, others], dst[Site("attn_z", layer)][:, :, others])


@pytest.mark.parametrize("kinds", [("q", "k"), ("rot_q", "rot_k"), ("scores",)])
def test_query_key_sites_from_the_source_reproduce_its_pattern(tiny_models, kinds):
    m = tiny_models("llama")
    pairs = make_pairs(m, CLEAN, CORRUPT)
    src, _ = run_with_capture(m, pairs.clean, [Site("pattern", 1)])
    got = _patched(m, pairs, [Patch(f"{k}.1") for k in kinds], ["pattern.1"])
    mask = pairs.corrupted.attention_mask.bool()[:, None, :, None]
    torch.testing.assert_close(got["pattern.1"] * mask, src[Site("pattern", 1)] * mask, atol=1e-6, rtol=0)


def test_pattern_and_v_patches_equal_the_head_output_patch(tiny_models):
    """At the last layer, pattern (last query row) of a key-value group's heads + the group's v (every position) ==
    attn_z of those heads at the last position, through the batched ``patch``; prefix reuse on == off; a kv head
    out of range is refused."""
    m = tiny_models("llama")
    pairs = make_pairs(m, CLEAN, CORRUPT)
    metric = _metric(m)
    both, z = _group_variants(m, m.n_layers - 1)
    torch.testing.assert_close(patch(m, pairs, both, metric), patch(m, pairs, z, metric), atol=1e-5, rtol=0)
    only = [Patch("pattern.1", position=-1, head=h) for h in range(m.n_heads)]
    torch.testing.assert_close(patch(m, pairs, only, metric), patch(m, pairs, only, metric, reuse_prefix=False),
                               atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="key-value heads 0..1"):
        resolve(m, Patch("k.1", head=m.n_kv_heads), pairs.n_positions)
    with pytest.raises(ValueError, match="head=.*needs"):
        resolve(m, Patch("resid_pre.1", head=0), pairs.n_positions)


def test_pattern_patch_with_unaligned_keys(tiny_models):
    """A source query whose earlier keys are not all aligned is refused; a target with extra (unaligned) keys,
    padded in its batch, gets the source row on the aligned keys and 0 on the others."""
    m = tiny_models("llama")
    short, long = [[9, 21, 20, 7], [1, 2, 3, 4]], [[5, 9, 14, 20, 7, 8], [4, 3, 2, 1]]
    bad = make_pairs(m, long, short)  # the clean (source) prompt is longer
    with pytest.raises(ValueError, match="keys .* not aligned.*align"):
        patch(m, bad, [Patch("pattern.1", position=0)], _metric(m))
    pairs = make_pairs(m, short, long)
    src, _ = run_with_capture(m, pairs.clean, [Site("pattern", 1)])
    got = _patched(m, pairs, [Patch("pattern.1", position=-1, head=0)], ["pattern.1"])["pattern.1"]
    T = got.shape[-1]
    want = torch.zeros(2, T)
    want[:, T - 4:] = src[Site("pattern", 1)][:, 0, -1]
    torch.testing.assert_close(got[:, 0, -1], want, atol=0, rtol=0)


def test_sweep_layers_over_attention_sites_runs(tiny_models):
    m = tiny_models("gpt2")
    pairs = make_pairs(m, CLEAN, CORRUPT)
    sw = sweep_layers(m, pairs, _metric(m), sites=("q", "k", "v", "pattern", "attn_z"), runtime=QUIET)
    assert sw.values.shape == (m.n_layers, 5) and torch.isfinite(sw.values).all()
    # patching v, q and k together at every position moves every head's output to the source's
    torch.testing.assert_close(sw.values[:, 4], sweep_layers(m, pairs, _metric(m), sites=("attn_z",),
                                                             runtime=QUIET).values[:, 0])


@pytest.mark.slow
def test_smollm2_ioi_head_sweep_of_patterns():
    m = interp.load_model("smollm2-135m-instruct")
    clean = "When Mary and John went to the store, John gave a drink to"
    corrupt = "When John and Mary went to the store, Mary gave a drink to"
    tok = m.tokenizer
    mary, john = tok.encode(" Mary")[0], tok.encode(" John")[0]
    pairs = make_pairs(m, interp.Prompts([clean], chat=False), interp.Prompts([corrupt], chat=False))
    metric = logit_diff(mary, john)
    layers = [0, 14, m.n_layers - 1]
    heads = [[Patch(f"pattern.{L}", position=-1, head=h)] for L in layers for h in range(m.n_heads)]
    vals = patch(m, pairs, heads, metric).view(len(layers), m.n_heads)
    prep = prepare_patching(m, pairs, [], metric, "clean", "corrupted")
    assert prep.reference > 0 > prep.baseline  # Mary in the clean run, John in the corrupted one
    assert torch.isfinite(vals).all()
    assert vals[-1].ne(prep.baseline).any()  # the last layer's patterns matter to its last row
    # at the last layer, a key-value group's last pattern rows and v == its heads' outputs at the last position
    both, z = _group_variants(m, m.n_layers - 1)
    torch.testing.assert_close(patch(m, pairs, both, metric), patch(m, pairs, z, metric), atol=2e-3, rtol=0)


def test_concat_of_patterns_pads_keys_and_merges_key_lengths(tiny_models):
    m = tiny_models("llama")
    a = interp.capture(m, [[5, 9, 14]], "pattern", positions="last", runtime=QUIET)
    b = interp.capture(m, [[3, 11, 8, 30, 12], [7, 7]], "pattern", positions="last", runtime=QUIET)
    both = Activations.concat([a, b], on_duplicate="suffix")
    assert both.meta["key_lengths"] == [3, 5, 2]
    assert both.meta["site_shapes"][both.sites[0]] == [m.n_heads, 5]
    one = interp.capture(m, [[5, 9, 14], [3, 11, 8, 30, 12], [7, 7]], "pattern", positions="last", runtime=QUIET)
    torch.testing.assert_close(both.tensor, one.tensor)
    allpos = interp.capture(m, [[5, 9, 14]], "pattern", positions="all", runtime=QUIET)
    allb = interp.capture(m, [[3, 11, 8, 30, 12]], "pattern", positions="all", runtime=QUIET)
    joined = Activations.concat([allpos, allb], on_duplicate="suffix")
    whole = interp.capture(m, [[5, 9, 14], [3, 11, 8, 30, 12]], "pattern", positions="all", runtime=QUIET)
    torch.testing.assert_close(joined.tensor, whole.tensor)
    assert joined.meta["key_lengths"] == [3, 5]
    resid = interp.capture(m, [[5, 9, 14]], "resid_post", positions="last", runtime=QUIET)
    with pytest.raises(ValueError, match="different sites"):
        Activations.concat([a, resid], on_duplicate="suffix")


def _nnsight(m):
    from nnsight import LanguageModel

    from interp.adapters import from_nnsight

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lm = LanguageModel(m.hf, tokenizer=m.tokenizer)
    return from_nnsight(lm, backend="nnsight")


@pytest.mark.parametrize("site", ["q.0", "k.1", "v.0", "rot_q.1", "rot_k.0", "scores.1", "pattern.0"])
def test_nnsight_backend_refuses_attention_sites(tiny_models, site):
    a = _nnsight(tiny_models("llama"))
    fix = r"attention sites.*interp\.load_model.*interp\.from_hf"
    with pytest.raises(ValueError, match=fix):
        interp.capture(a, [[5, 9, 14]], site, positions="last", runtime=QUIET)
    with pytest.raises(NotImplementedError, match=fix):
        with interp.hooks(a, {site: lambda x, ctx: None}):
            pass
    u = torch.zeros(1, a.d_model)
    with pytest.raises(ValueError, match=fix), a.editing([TraceEdit(site, u, u)]):
        pass


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_rot_k_patch_at_late_positions_with_prefix_reuse(tiny_models, family):
    """rot_k inside attention spans every key (the cached prefix too): a patch at the last positions lands on the
    same key with prefix reuse on and off, and equals patching k there (same positions, no qk-norm)."""
    m = tiny_models(family)
    pairs = make_pairs(m, CLEAN, CORRUPT)
    metric = _metric(m)
    rot = [Patch("rot_k.1", position=-1, head=h) for h in range(m.n_kv_heads)] + [Patch("rot_k.0", position=[-2, -1])]
    k = [Patch("k.1", position=-1, head=h) for h in range(m.n_kv_heads)] + [Patch("k.0", position=[-2, -1])]
    got = patch(m, pairs, rot, metric)
    torch.testing.assert_close(got, patch(m, pairs, rot, metric, reuse_prefix=False), atol=1e-5, rtol=0)
    torch.testing.assert_close(got, patch(m, pairs, k, metric), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["pattern", "scores", "rot_k"])
def test_prefix_reuse_under_a_short_sliding_window(kind):
    """A window of 4 keys, shorter than the prompts: patches at the last positions agree with prefix reuse on/off."""
    from interp.testing.tiny import tiny_model

    m = tiny_model("mistral", sliding_window=4)
    pairs = make_pairs(m, CLEAN, CORRUPT)
    n = m.n_kv_heads if kind == "rot_k" else m.n_heads
    variants = [[Patch(f"{kind}.{L}", position=-1, head=h)] for L in range(m.n_layers) for h in range(n)]
    got = patch(m, pairs, variants, _metric(m))
    torch.testing.assert_close(got, patch(m, pairs, variants, _metric(m), reuse_prefix=False), atol=1e-5, rtol=0)


def test_concat_without_masks_marks_the_left_padding():
    a = Activations(tensor=torch.ones(1, 1, 2, 4), sites=["blocks.0.hook_resid_post"], positions="all", model_id="x",
                    prompt_ids=["a"])
    b = Activations(tensor=torch.ones(1, 1, 3, 4), sites=["blocks.0.hook_resid_post"], positions="all", model_id="x",
                    prompt_ids=["b"])
    both = Activations.concat([a, b])
    assert both.mask.tolist() == [[False, True, True], [True, True, True]]
    assert both.tensor[0, 0, 0].eq(0).all() and both.tensor[1].eq(1).all()
