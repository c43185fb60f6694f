"""Reusing the plain prompt columns before the post-instruction tokens (``interp.forward.untouched_prefix``).

An edit at the post-instruction and generated tokens only cannot change the keys and values of the earlier
columns of a causal model, so batched scoring (``score_rows``) and generation (a ``steering.GenerationSession``)
compute those columns once, plainly. Checked against the same runs that recompute every
column (the reference path, itself checked against plain hooks in ``tests/test_refusal_positions.py``)."""

from __future__ import annotations

import pytest
import torch

import interp
import steering
from interp.forward import batches, forward, prepare, untouched_prefix
from interp.studies.kit.scoring import ablation, score_rows
from interp.testing.tiny import tiny_model
from steering.prefill import check_prefix, leaves_prompt_prefix, prompt_prefixes
from tests.conftest import PREFIX_PROMPTS as PROMPTS
from tests.conftest import chat_case


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_scoring_with_the_reused_prefix_equals_recomputing_every_column(family):
    m = tiny_model(family)
    _, encs = prepare(m, PROMPTS)
    (b,) = batches(m, encs, len(encs))
    kv, start = untouched_prefix(m, b)
    assert kv is not None and 0 < start < b.input_ids.shape[1]
    assert start == int(b.post_mask.float().argmax(1).min())          # the first post-instruction column
    torch.manual_seed(0)
    dirs = torch.nn.functional.normalize(torch.randn(5, m.d_model), dim=-1)
    reused = score_rows(m, encs, dirs, "ablate", max_rows=7, positions="post_instruction")
    full = score_rows(m, encs, dirs, "ablate", max_rows=7, positions="post_instruction", reuse_prefix=False)
    torch.testing.assert_close(reused, full, atol=1e-5, rtol=0)


def _session(m, prompts, reuse, bs=3):
    return steering.GenerationSession(m, prompts, interp.Runtime(batch_size=bs, progress=False), first_logits=True,
                                      reuse=reuse)


@pytest.mark.parametrize("model", ["llama", "organism"])
def test_generation_with_the_reused_prefix_equals_a_full_prompt_pass(model):
    m, prompts = chat_case(model)
    _, encs = prepare(m, prompts)
    reused, full = _session(m, prompts, True), _session(m, prompts, False)
    prefix = reused.prefixes()
    assert len(prefix) == 2 and all(kv is not None and start > 0 for kv, start in prefix)
    torch.manual_seed(1)
    r = torch.nn.functional.normalize(torch.randn(m.d_model), dim=0)
    cases = [(), (ablation(r, "post_instruction"),),
             (steering.AddVector(4 * r, layers=1, scope="generated"),),
             (steering.AblateSubspace(torch.linalg.qr(torch.randn(m.d_model, 2)).Q.T,
                                      sites=("resid_pre", "attn_out", "mlp_out"), positions="post_instruction"),)]
    for ivs in cases:
        assert leaves_prompt_prefix(m, ivs)
        want, got = full.generate(*ivs, max_new_tokens=8), reused.generate(*ivs, max_new_tokens=8)
        assert got.token_ids == want.token_ids and got.texts == want.texts
        torch.testing.assert_close(got.first_logits, want.first_logits, atol=1e-4, rtol=0)
    assert reused.plain_passes == 1 and full.plain_passes == 0     # the prefix computed once for every condition
    # the prompt pass computes only the columns from the first post-instruction token on
    seen: list[int] = []
    handle = m.hf.register_forward_pre_hook(lambda mod, args, kw: seen.append(kw["input_ids"].shape[1]),
                                            with_kwargs=True)
    try:
        reused.generate(*cases[1], max_new_tokens=8)
    finally:
        handle.remove()
    widths = [b.input_ids.shape[1] for b in batches(m, encs, 3)]
    assert [w for w in seen if w > 1] == [widths[0] - prefix[0][1], widths[1] - prefix[1][1]]
    # the edit acts: the post-instruction ablation changes the first logits (so the check above compares
    # edited runs, not two plain ones)
    plain = reused.generate(max_new_tokens=8)
    assert (plain.first_logits - reused.generate(*cases[1], max_new_tokens=8).first_logits).abs().max() > 1e-3


def test_a_prefix_is_used_only_where_it_is_right():
    m = tiny_model("llama")
    r = torch.nn.functional.normalize(torch.ones(m.d_model), dim=0)
    every = ablation(r, "all")
    assert not leaves_prompt_prefix(m, (every,))
    assert not leaves_prompt_prefix(m, (ablation(r, "post_instruction"), steering.AddVector(r, layers=0)))
    reused = _session(m, PROMPTS, True)
    assert reused.generate(every, max_new_tokens=8).token_ids == _session(m, PROMPTS, False).generate(
        every, max_new_tokens=8).token_ids
    assert reused.plain_passes == 0                    # an every-token edit computes every column itself
    # the guard under the session: a prefix for other edits or other batches is refused
    _, encs = prepare(m, PROMPTS)
    prefix = prompt_prefixes(m, encs, 3)
    with pytest.raises(ValueError, match="positions='post_instruction'"):
        check_prefix(m, encs, 3, (every,), "hf", prefix)
    with pytest.raises(ValueError, match="prompt_prefixes"):                     # built for another batch size
        check_prefix(m, encs, 5, (), "hf", prefix)
    with pytest.raises(ValueError, match="prompt_prefixes"):
        check_prefix(m, encs[:3], 3, (), "hf", prefix)


@pytest.mark.parametrize("positions", ["all", "post_instruction"])
def test_teacher_forced_kl_and_ce_equal_full_passes_with_plain_hooks(positions):
    """``harmless_kl_ce`` unembeds the response columns only and, under a post-instruction edit, reuses the plain
    pass's earlier columns: against full passes with plain hooks at every writer (the oracle), batch by batch."""
    from interp.evals.logits import cross_entropy, kl_div
    from interp.hooking import hooks
    from interp.studies.refusal.estimate import writer_sites
    from interp.studies.refusal.evaluation import harmless_kl_ce

    m = tiny_model("llama", n_layers=3)
    prompts, responses = PROMPTS, ["yes it is", "a word", "sure thing here", "no", "a house of bricks and wood"]
    torch.manual_seed(3)
    r, u = torch.nn.functional.normalize(torch.randn(2, m.d_model), dim=-1)
    got = harmless_kl_ce(m, prompts, responses, (ablation(r, positions),), batch_size=2,
                         controls={"random ablation": (ablation(u, positions),)})
    _, encs = prepare(m, prompts, responses=responses)
    want: dict[str, list] = {"base": [], "r": [], "u": [], "kl_r": [], "kl_u": []}
    for b in batches(m, encs, 2):
        where = b.attention_mask.bool() if positions == "all" else b.post_mask | b.response_mask
        base = forward(m, b, logits="all")
        first = b.response_mask.float().argmax(1) - 1
        rows = torch.arange(len(first))
        want["base"].append(cross_entropy(base, b.input_ids, b.response_mask))
        for name, d in (("r", r), ("u", u)):
            w = where.to(m.dtype)[..., None]
            fns = [(s.name, lambda x, ctx, d=d, w=w: x - (x @ d)[..., None] * d * w) for s in writer_sites(m)]
            with hooks(m, fns):
                lg = forward(m, b, logits="all")
            want[name].append(cross_entropy(lg, b.input_ids, b.response_mask))
            want[f"kl_{name}"].append(kl_div(base[rows, first], lg[rows, first]))
    mean = {k: sum(s for s, _ in v) / sum(n for _, n in v) for k, v in want.items() if not k.startswith("kl")}
    assert got["ce_baseline"] == pytest.approx(mean["base"], abs=1e-5)
    assert got["ce_edited"] == pytest.approx(mean["r"], abs=1e-5)
    assert got["ce_edited (random ablation)"] == pytest.approx(mean["u"], abs=1e-5)
    assert got["kl_first_response_token"] == pytest.approx(float(torch.cat(want["kl_r"]).mean()), abs=1e-6)
    assert got["kl_first_response_token (random ablation)"] == pytest.approx(float(torch.cat(want["kl_u"]).mean()),
                                                                            abs=1e-6)
    assert got["kl_first_response_token"] > 1e-4
