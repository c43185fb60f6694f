"""The token state is a typed field of the hook context: ``ctx.tokens`` is recorded once per forward pass under any
``interp.hooks`` block (not only under ``steering.apply``), and steering's declarations live in it."""

from __future__ import annotations

import pytest
import torch

import steering
from interp.forward import batches, forward, prepare
from interp.hooking import count_hooks, hooks
from interp.tokens import TokenState, TokenTracker
from sae.edits import LatentAblation, LatentSteering, TranscoderAblation
from sae.model import SAE, SAEConfig
from sae.transcoder import Transcoder, TranscoderConfig

from .conftest import chat_case


def _sink_edits(m) -> list:
    """Tiny SAE / transcoder edits with ``skip_sink=True`` on ``m``."""
    d = m.d_model
    sae = SAE(SAEConfig(d, 4 * d, arch="relu", site="resid_post.1"), seed=3)
    tc = Transcoder(TranscoderConfig(d_in=d, d_sae=2 * d, arch="relu", layer=0), seed=1)
    return [LatentSteering(sae, [5, 9], alpha=[3.0, -2.0], sinks="exclude"),
            LatentAblation(sae, list(range(2 * d)), sinks="exclude"),
            TranscoderAblation({0: tc}, [(0, f) for f in range(d)], sinks="exclude")]


@pytest.mark.parametrize("name", ["llama", "organism"])
def test_skip_sink_under_plain_hooks_equals_steering_apply(name):
    """Regression: ``skip_sink=True`` needed steering.apply's private token state and failed under plain hooks. Now
    its logits (a left-padded prompt pass) and greedy generations equal those under steering.apply exactly."""
    m, prompts = chat_case(name)
    _, encs = prepare(m, prompts)
    (b,) = batches(m, encs, len(encs))
    assert (b.attention_mask == 0).any()  # left padded: each row's sink is at a different column
    base = forward(m, b)
    gen = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    for edit in _sink_edits(m):
        with steering.apply(m, edit):
            want = forward(m, b)
            want_gen = m.hf.generate(**b.model_inputs, **gen)
        with hooks(m, edit.hook_fns(m)):
            got = forward(m, b)
            got_gen = m.hf.generate(**b.model_inputs, **gen)
        assert (got - want).abs().max().item() == 0.0
        assert torch.equal(got_gen.sequences, want_gen.sequences)
        assert all(torch.equal(g, w) for g, w in zip(got_gen.scores, want_gen.scores))
        assert (got - base).abs().max() > 1e-4  # the edit does something
        edit.sinks = "keep"
        assert (forward(m, b, edit.hook_fns(m)) - got).abs().max() > 1e-6  # and leaving the sink alone matters
        edit.sinks = "exclude"


def test_every_pass_under_plain_hooks_has_its_token_state():
    """During HF generate under bare hooks: the prompt pass and each cached pass are recorded once (every hook of a
    pass sees one state), with each row's real prompt span."""
    m, prompts = chat_case("llama")
    _, encs = prepare(m, prompts)
    (b,) = batches(m, encs, len(encs))
    seen: list[tuple[str, TokenState]] = []
    fns = [(f"resid_post.{i}", lambda x, ctx: seen.append((ctx.site.name, ctx.tokens))) for i in range(m.n_layers)]
    n0 = count_hooks(m.hf)
    with torch.no_grad(), hooks(m, fns):
        m.hf.generate(**b.model_inputs, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert count_hooks(m.hf) == n0
    states = [st for _, st in seen]
    assert len(states) == 3 * m.n_layers and all(isinstance(st, TokenState) for st in states)
    per_pass = [states[i:i + m.n_layers] for i in range(0, len(states), m.n_layers)]
    assert all(all(st is p[0] for st in p) for p in per_pass)  # once per pass, not per hook
    T = b.input_ids.shape[1]
    first, *later = [p[0] for p in per_pass]
    assert (first.past, first.seq, first.all_prompt) == (0, T, True)
    assert [(st.past, st.seq, st.all_generated) for st in later] == [(T, 1, True), (T + 1, 1, True)]
    want_start = b.attention_mask.bool().long().argmax(1)
    assert torch.equal(first.prompt.start, want_start) and (first.prompt.end == T).all()
    assert all(st.prompt is first.prompt for st in later)
    assert torch.equal(first.mask("prompt", (0,)),
                       torch.nn.functional.one_hot(want_start, T).bool())


def test_steering_declarations_are_typed_fields_not_data_keys():
    """``set_batch`` (post-instruction mask) and ``keep_rows`` (finished rows dropped) write into the typed state that
    hooks read as ``ctx.tokens``; ``ctx.data`` holds only what user hooks put there, shared by them."""
    m, prompts = chat_case("llama")
    _, encs = prepare(m, prompts)
    (b,) = batches(m, encs, len(encs))
    seen: list[TokenState] = []

    class Spy:
        def hook_fns(self, model):
            def put(x, ctx):
                ctx.data["mine"] = x.shape[0]

            def read(x, ctx):
                assert ctx.data["mine"] == x.shape[0]
                seen.append(ctx.tokens)
            return {"resid_pre.0": put, "resid_post.0": read}

    with torch.no_grad(), steering.apply(m, Spy()) as h:
        assert isinstance(h.tokens, TokenTracker) and h.state is None
        h.set_batch(b)
        m.hf(**b.model_inputs)
        assert torch.equal(seen[-1].prompt.post_mask, b.post_mask.bool()) and seen[-1].kept is None
        assert h.state is seen[-1]
        h.keep_rows(torch.tensor([1, 3]))
        assert h.tokens.kept.total == len(prompts) and h.tokens.kept.index.tolist() == [1, 3]
        assert torch.equal(h.tokens.prompt.post_mask, b.post_mask[[1, 3]].bool())
        assert set(h.data) == {"mine"}
        h.set_batch(b)
        assert h.tokens.kept is None and h.tokens.prompt is None


def test_a_pass_without_token_ids_or_a_hand_called_hook():
    """A pass from ``inputs_embeds`` is recorded too; a hook context with no recorded pass has ``tokens`` None, and
    ``skip_sink`` then says what it needs."""
    m, prompts = chat_case("llama")
    enc = m.tokenizer(prompts[:2], return_tensors="pt", padding=True)
    seen: list = []
    with torch.no_grad(), hooks(m, {"resid_post.0": lambda x, ctx: seen.append(ctx.tokens)}):
        m.hf(inputs_embeds=m.hf.get_input_embeddings()(enc["input_ids"]), attention_mask=enc["attention_mask"])
    assert seen[0].batch == 2 and seen[0].seq == enc["input_ids"].shape[1] and seen[0].past == 0
    from interp.hooking import HookContext
    from interp.sites import parse_site

    edit = _sink_edits(m)[0]
    (site, fn), = edit.hook_fns(m).items()
    ctx = HookContext(parse_site(site, m.n_layers), m)
    assert ctx.tokens is None
    with pytest.raises(ValueError, match="interp.hooks"):
        fn(torch.zeros(1, 3, m.d_model), ctx)
