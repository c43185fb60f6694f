"""The one forward layer's shared rules: the pad id, the position rule, raw module hooks, and that no module
outside ``interp/hooking.py`` attaches raw hooks itself."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from interp.forward import batch_of, batches, encode_ids, pad_id, prepare
from interp.hooking import count_hooks, module_hooks
from interp.positions import columns, plan
from interp.values import Runtime

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["hi", "tell me a long story about a dragon and a knight", "what is two plus two", "ok then"]
POSITIONS = [0, 2, -1, -3]


def test_pad_id_rule(tiny_models):
    assert pad_id(SimpleNamespace(pad_token_id=7, eos_token_id=2)) == 7
    assert pad_id(SimpleNamespace(pad_token_id=None, eos_token_id=2)) == 2       # no pad token: end of sequence
    assert pad_id(SimpleNamespace(pad_token_id=None, eos_token_id=[5, 6])) == 5  # several: the first
    assert pad_id(SimpleNamespace(pad_token_id=None, eos_token_id=None)) == 0
    assert pad_id(None) == 0
    assert [e.ids for e in encode_ids(torch.tensor([[4, 5], [6, 7]]))] == [[4, 5], [6, 7]]  # ids need no tokenizer
    m = tiny_models("llama")
    _, encs = prepare(m, PROMPTS)
    b = batches(m, encs, len(encs))[0]
    assert (b.input_ids[b.attention_mask == 0] == pad_id(m.tokenizer)).all()


def test_columns_count_from_first_real_token_or_end():
    start, end = torch.tensor([0, 3]), torch.tensor([5, 5])  # rows of 5 and 2 real tokens (left padded)
    assert columns([0, -1], start, end).tolist() == [[0, 4], [3, 4]]
    assert columns(1, start, end).tolist() == [[1], [4]]
    assert columns(torch.tensor([[4, 0], [1, -2]]), start, end).tolist() == [[4, 0], [4, 3]]  # per row
    with pytest.raises(ValueError, match=r"position 2 is out of range for a prompt of 2 tokens \(valid -2\.\.1\)"):
        columns([2], start, end)
    with pytest.raises(ValueError, match="position -3 is out of range for clean prompt 1 of 2 tokens"):
        columns([-3], start, end, "clean prompt")
    with pytest.raises(ValueError, match="empty list of positions"):
        columns([], start, end)


def test_capture_steering_and_patching_select_the_same_positions(tiny_models):
    """On one padded batch, explicit positions mean the same columns to capture, steering scope and patching."""
    from interp.capturing import capture
    from interp.patching.runs import make_pairs
    from interp.tokens import TokenTracker

    m = tiny_models("llama")
    batch = batch_of(m, PROMPTS)
    assert (batch.attention_mask == 0).any()  # really padded
    cap_cols = plan(POSITIONS, batch).index                                  # capture
    state = TokenTracker().record((), batch.model_inputs)                   # steering: the prompt pass
    steer_mask = state.mask("prompt", tuple(POSITIONS))
    pairs = make_pairs(m, PROMPTS, PROMPTS, align=[(p, p) for p in POSITIONS])  # patching
    assert torch.equal(pairs.cols["clean"], cap_cols) and torch.equal(pairs.cols["corrupted"], cap_cols)
    want = torch.zeros_like(steer_mask)
    want[torch.arange(len(PROMPTS))[:, None], cap_cols] = True
    assert torch.equal(steer_mask, want)
    # and capture keeps exactly those columns' activations
    acts = capture(m, PROMPTS, sites="resid_post.0", positions=POSITIONS, runtime=Runtime(progress=False))
    full = capture(m, PROMPTS, sites="resid_post.0", positions="all",
                   runtime=Runtime(progress=False, batch_size=len(PROMPTS)))
    torch.testing.assert_close(acts.tensor[:, 0], full.tensor[torch.arange(len(PROMPTS))[:, None], 0, cap_cols])
    # one rule, one message: each of the three reports an out-of-range position the same way
    rule = "positions count from the first real token (>= 0) or from the end (< 0)"
    with pytest.raises(ValueError, match=r"out of range for a prompt of 1 tokens.*" + re.escape(rule)):
        plan([5], batch_of(m, [[3]]))
    with pytest.raises(ValueError, match=r"out of range for a prompt of \d+ tokens.*" + re.escape(rule)):
        state.mask("prompt", (99,))
    with pytest.raises(ValueError, match=r"out of range for clean prompt 0 of \d+ tokens.*" + re.escape(rule)):
        make_pairs(m, PROMPTS, PROMPTS, align=[(99, 0)])


def test_module_hooks_removed_on_exit_and_on_exception(tiny_models):
    m = tiny_models("llama")
    n0 = count_hooks(m.hf)
    block = m.block(0)
    seen = []
    ids = torch.tensor([[3, 4, 5]])
    items = [(block, "pre", lambda mod, args, kwargs: seen.append("pre")),
             (block, "post", lambda mod, args, out: seen.append("post"))]
    with pytest.raises(RuntimeError, match="boom"), module_hooks(items):
        assert count_hooks(m.hf) == n0 + 2
        with torch.no_grad():
            m.hf(input_ids=ids)
        raise RuntimeError("boom")
    assert seen == ["pre", "post"] and count_hooks(m.hf) == n0
    with pytest.raises(ValueError, match="'pre' or 'post'"), module_hooks([items[0], (block, "after", print)]):
        pass
    assert count_hooks(m.hf) == n0  # the hook attached before the bad one is removed too


RAW_HOOKS = {"register_forward_hook", "register_forward_pre_hook"}
SCANNED = ("interp", "probes", "steering", "sae")


def test_raw_hooks_only_in_interp_hooks():
    """Raw ``register_forward_*hook`` calls live only in ``interp/hooking.py`` (elsewhere: ``module_hooks``)."""
    found = []
    for pkg in SCANNED:
        for p in sorted((REPO / pkg).rglob("*.py")):
            if p == REPO / "interp" / "hooking.py":
                continue
            for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Attribute) and node.attr in RAW_HOOKS:
                    found.append(f"{p.relative_to(REPO)}:{node.lineno} {node.attr}")
    assert not found, "raw hooks outside interp/hooking.py (use interp.hooking.module_hooks):\n" + "\n".join(found)


def test_prefix_reuse_equals_the_full_forward(tiny_models):
    """Keys and values of the first columns reused from prefix_cache give the full forward's last logits."""
    import pytest

    from interp.forward import batch_of, last_logits, prefix_cache

    m = tiny_models("llama")
    b = batch_of(m, ["the man said hello there", "what is the good word", "help me"])
    full = last_logits(m, b)
    prefix = prefix_cache(m, b)
    assert prefix is not None and len(prefix) == m.n_layers
    for start in (1, 3, b.input_ids.shape[1] - 1):
        torch.testing.assert_close(last_logits(m, b, prefix=prefix, start=start), full, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="rows"):
        last_logits(m, b, repeat=2, prefix=prefix, start=2)


def test_dense_unembed_feeds_the_head_a_contiguous_input_and_the_same_logits(tiny_models):
    """Under ``logits_to_keep`` HF unembeds a strided view of the hidden states; inside our passes the head reads a
    contiguous copy (one matrix product, not one per row), the logits equal HF's own to float rounding, and the
    hook is gone afterwards, also when the pass raises."""
    from interp.forward import dense_unembed, forward
    from interp.weights import unembed_module

    m = tiny_models("llama")
    b = batch_of(m, ["the man said hello there", "what is the good word", "help me"])
    seen: list[bool] = []
    with module_hooks([(unembed_module(m), "post", lambda mod, args, out: seen.append(args[0].is_contiguous()))]):
        with torch.inference_mode():
            raw = m.hf(**b.model_inputs, use_cache=False, logits_to_keep=2).logits.float()
        ours = forward(m, b, logits=2)
    assert seen == [False, True]   # HF's own pass hands the head a strided view; ours a contiguous one
    torch.testing.assert_close(ours, raw, atol=1e-5, rtol=1e-5)
    n0 = count_hooks(m.hf)
    with pytest.raises(RuntimeError, match="boom"), dense_unembed(m):
        assert count_hooks(m.hf) == n0 + 1
        raise RuntimeError("boom")
    assert count_hooks(m.hf) == n0
