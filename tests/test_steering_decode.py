"""Greedy decoding that drops finished rows (``steering.decode``) against HF ``generate``.

Rows must leave the batch at different steps for the check to mean anything, so each model's end-of-sequence
token is set to a token its greedy continuations emit at different steps (read from an HF run without stops)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import interp
import steering
from interp.forward import batches, prepare
from interp.studies.kit.scoring import ablation
from interp.testing.tiny import tiny_model
from steering.decode import can_drop_rows, row_wise
from tests.conftest import PREFIX_PROMPTS, chat_case


def _ragged_eos(m, prompts, n=10) -> int:
    """A token the plain greedy continuations first emit at several different steps, made the model's EOS."""
    plain = steering.GenerationSession(m, prompts, interp.Runtime(batch_size=len(prompts), progress=False),
                                       drop_finished=False, reuse=False)
    g = plain.generate(max_new_tokens=n, sampling=steering.Sampling(stop_at_eos=False))
    firsts: dict[int, set[int]] = {}
    for ids in g.token_ids:
        seen: set[int] = set()
        for step, t in enumerate(ids):
            if t not in seen:
                firsts.setdefault(t, set()).add(step)
                seen.add(t)
    counts = Counter({t: len(s) for t, s in firsts.items()})
    tok = counts.most_common(1)[0][0]
    m.hf.generation_config.eos_token_id = tok
    return tok


def _conditions(m):
    g = torch.Generator().manual_seed(7)
    r = torch.nn.functional.normalize(torch.randn(m.d_model, generator=g), dim=0)
    return [(), (ablation(r, "post_instruction"),), (steering.AddVector(4 * r, layers=1),),
            (steering.AddVector(3 * r, layers=0, scope="generated"), ablation(r, "all"))]


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen2_moe", "gpt_neox"])
def test_dropping_finished_rows_gives_hf_generate_tokens(family):
    """Plain, post-instruction (with the reused prefix), every-token and generated-scope edits; a sliding-window
    cache (gemma3), routed experts that see flattened tokens (qwen2_moe), rotary on part of the head (gpt_neox)."""
    m, prompts = tiny_model(family), PREFIX_PROMPTS
    before = m.hf.generation_config.eos_token_id
    try:
        _ragged_eos(m, prompts)
        run = interp.Runtime(batch_size=len(prompts), progress=False)
        reused = steering.GenerationSession(m, prompts, run, first_logits=True)   # prefix / states reused, rows dropped
        hf = steering.GenerationSession(m, prompts, run, first_logits=True, drop_finished=False, reuse=False)
        lengths = set()
        for c in _conditions(m):
            got, want = reused.generate(*c, max_new_tokens=10), hf.generate(*c, max_new_tokens=10)
            assert got.token_ids == want.token_ids and got.texts == want.texts
            torch.testing.assert_close(got.first_logits, want.first_logits, atol=1e-5, rtol=0)
            lengths |= {len(t) for t in got.token_ids}
        assert len(lengths) >= 3  # rows finished at different steps, some before the last
        assert min(lengths) < 10
        # the stacked conditions (RowGroups) lose rows unevenly across their blocks
        each = reused.generate_each(_conditions(m), stack=4, max_new_tokens=10)
        alone = [hf.generate(*c, max_new_tokens=10) for c in _conditions(m)]
        assert [g.token_ids for g in each] == [g.token_ids for g in alone]
    finally:
        m.hf.generation_config.eos_token_id = before


def test_hooks_see_only_the_live_rows(monkeypatch):
    """Every generated pass's hooks see exactly the rows that have not finished, with their prompt records (the
    spy below is a bare hook, which acts on every row alike: let it through the row-wise check)."""
    monkeypatch.setattr("steering.decode.row_wise", lambda interventions: True)
    m, prompts = chat_case("llama")
    before = m.hf.generation_config.eos_token_id
    seen: list[tuple[int, tuple]] = []

    class Spy:
        def hook_fns(self, model):
            def fn(x, ctx):
                kept = ctx.tokens.kept
                seen.append((x.shape[0], () if kept is None else tuple(kept.index.tolist())))
                assert ctx.tokens.prompt.start.shape[0] == x.shape[0]
                return x
            return {"blocks.0.hook_resid_pre": fn}
    try:
        _ragged_eos(m, prompts)
        g = steering.generate(m, prompts, Spy(), max_new_tokens=10,
                              runtime=interp.Runtime(batch_size=len(prompts), progress=False))
    finally:
        m.hf.generation_config.eos_token_id = before
    widths = [w for w, _ in seen]
    assert widths[0] == len(prompts) and widths == sorted(widths, reverse=True) and widths[-1] < len(prompts)
    last = seen[-1][1]
    assert len(last) == widths[-1] and all(len(g.token_ids[i]) >= len(g.token_ids[j])
                                           for i in last for j in range(len(prompts)) if j not in last)


def test_only_row_wise_greedy_decoding_drops_rows():
    m = tiny_model("llama")
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    r = torch.ones(m.d_model)
    assert can_drop_rows(m, kw, ()) and can_drop_rows(m, kw, (ablation(r, "all"), steering.RowGroups([(), ()])))
    assert not can_drop_rows(m, {**kw, "do_sample": True}, ())
    assert not can_drop_rows(m, {**kw, "num_beams": 2}, ())
    rows = steering.RowEdits(ablate=torch.nn.functional.normalize(torch.randn(3, m.d_model), dim=-1))
    assert not row_wise((rows,)) and not can_drop_rows(m, kw, (rows,))

    class Hook:  # a bare hook may index rows (a patch from a cached run): not droppable
        def hook_fns(self, model):
            return {}
    assert not row_wise((Hook(),)) and not row_wise((steering.RowGroups([(), ()]), [Hook()]))
    before = m.hf.generation_config.repetition_penalty
    m.hf.generation_config.repetition_penalty = 1.3
    try:
        assert not can_drop_rows(m, kw, ())  # a logits processor: HF generate decodes
    finally:
        m.hf.generation_config.repetition_penalty = before


def test_keep_rows_slices_the_prompt_record_and_a_new_batch_resets_it():
    m, prompts = chat_case("llama")
    _, encs = prepare(m, prompts)
    (b,) = batches(m, encs, len(encs))
    with torch.no_grad(), steering.apply(m, ablation(torch.ones(m.d_model), "post_instruction")) as h:
        with pytest.raises(RuntimeError, match="prompt pass first"):
            h.keep_rows(torch.tensor([0]))
        h.set_batch(b)
        m.hf(**b.model_inputs)
        h.keep_rows(torch.tensor([1, 3]))
        h.keep_rows(torch.tensor([1]))
        rec = h.tokens.prompt
        assert h.tokens.kept.total == len(prompts) and h.tokens.kept.index.tolist() == [3]
        assert torch.equal(rec.post_mask, b.post_mask[3:4].bool())
        h.set_batch(b)
        assert h.tokens.kept is None


def _additions(m):
    g = torch.Generator().manual_seed(3)
    r = torch.nn.functional.normalize(torch.randn(m.d_model, generator=g), dim=0)
    return [(steering.AddVector(5 * r, layers=1),), (steering.AddVector(-4 * r, layers=1, sites="resid_post"),),
            (steering.AddVector(5 * r, layers=1), ablation(r, "all")),   # edits block 0 too: no resume
            (steering.AddVector(3 * r, layers=1, scope="generated"),)]


@pytest.mark.parametrize("family,skip", [("llama", True), ("llama", False), ("qwen2_moe", True),
                                         ("gemma3_text", True), ("gpt_neox", True)])
def test_resuming_the_prompt_pass_from_a_layer_gives_hf_generate_tokens(family, skip, monkeypatch):
    """Additions at one layer reuse the plain pass's blocks below it (skipped, or run with their output replaced
    for families that cannot skip); a condition that edits lower runs in full; sliding-window caches keep no
    states to resume from (gemma3) and still decode right."""
    if not skip:
        monkeypatch.setattr("interp.skip.can_skip", lambda model: False)
    m, prompts = tiny_model(family, n_layers=3), PREFIX_PROMPTS
    before = m.hf.generation_config.eos_token_id
    try:
        _ragged_eos(m, prompts)
        run = interp.Runtime(batch_size=3, progress=False)
        session = steering.GenerationSession(m, prompts, run, first_logits=True)
        hf = steering.GenerationSession(m, prompts, run, first_logits=True, drop_finished=False, reuse=False)
        resumes = session.states({1, 2})
        assert len(resumes) == 2 and (resumes[0][0] is None) == (family == "gemma3_text")
        prompt_passes, block0 = [], m.blocks[0]
        inner = block0.forward

        def spy(x, *args, **kwargs):  # not a hook: a hook inside a skipped block is refused
            prompt_passes.append(x.shape[1] > 1)
            return inner(x, *args, **kwargs)
        block0.forward = spy
        try:
            session.generate(*_additions(m)[0], max_new_tokens=10)
        finally:
            del block0.forward
        # block 0 computed no prompt column where it was skipped (it ran only for the generated tokens)
        assert any(prompt_passes) == (not skip or family == "gemma3_text") and len(prompt_passes) > 2
        for c in _additions(m):
            got, want = session.generate(*c, max_new_tokens=10), hf.generate(*c, max_new_tokens=10)
            assert got.token_ids == want.token_ids
            torch.testing.assert_close(got.first_logits, want.first_logits, atol=1e-5, rtol=0)
        each = session.generate_each(_additions(m), stack=2, max_new_tokens=10)
        assert [g.token_ids for g in each] == [hf.generate(*c, max_new_tokens=10).token_ids for c in _additions(m)]
        assert session.plain_passes == 1   # one plain pass served every condition
    finally:
        m.hf.generation_config.eos_token_id = before


def test_the_resume_layer_is_the_highest_kept_at_or_below_the_lowest_edit(monkeypatch):
    from steering.decode import lowest_edited_layer
    from steering.prefill import prompt_states, resume_layer

    m = tiny_model("llama", n_layers=4)
    _, encs = prepare(m, PREFIX_PROMPTS)
    _, resumes = prompt_states(m, encs, 5, [1, 2])
    r = torch.ones(m.d_model)
    assert lowest_edited_layer(m, ()) == 4 and lowest_edited_layer(m, (steering.AddVector(r, layers=3),)) == 3
    assert lowest_edited_layer(m, (steering.RowGroups([(), (steering.AddVector(r, layers=2),)]),)) == 2
    assert resume_layer(m, (steering.AddVector(r, layers=3),), resumes, encs, 5)[0] == 2
    assert resume_layer(m, (steering.AddVector(r, layers=1),), resumes, encs, 5)[0] == 1
    assert resume_layer(m, (ablation(r, "all"),), resumes, encs, 5) is None   # block 0 edited

    class Hook:
        def hook_fns(self, model):
            return {}
    assert lowest_edited_layer(m, (Hook(),)) is None
    with pytest.raises(ValueError, match="prompt_states"):
        resume_layer(m, (steering.AddVector(r, layers=3),), resumes, encs, 2)  # other batches


def test_reserved_layer_holds_what_a_dynamic_layer_holds():
    """The decoding cache layer that writes each step in place: after prompt and step updates, dropped rows, a
    crop (a direct replacement of its keys) and growth past its room, its keys and values equal HF's
    ``DynamicLayer`` fed the same updates, and each update returns them."""
    from transformers.cache_utils import DynamicLayer

    from steering.decode import ReservedLayer

    g = torch.Generator().manual_seed(0)
    ours, ref = ReservedLayer(room=2), DynamicLayer()

    def step(t: int) -> None:
        k, v = (torch.randn(ours.keys.shape[0] if ours.is_initialized else 5, 2, t, 4, generator=g) for _ in range(2))
        got, want = ours.update(k, v), ref.update(k, v)
        for a, b in zip(got, want):
            assert torch.equal(a, b)

    step(3)                                   # the prompt
    step(1)
    ours.batch_select_indices(torch.tensor([0, 2, 4]))
    ref.batch_select_indices(torch.tensor([0, 2, 4]))
    step(1)
    step(1)                                   # past the room it was given: grows
    ours.crop(-2)
    ref.crop(-2)
    step(1)
    assert torch.equal(ours.keys, ref.keys) and torch.equal(ours.values, ref.values)
    assert ours.get_seq_length() == ref.get_seq_length() == 5
