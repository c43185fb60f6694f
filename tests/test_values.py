"""The value types (interp.Prompts, interp.Runtime): validation, defaults, and encoding once per model."""

from __future__ import annotations

import pytest

import interp
from interp.forward import prepare
from interp.values import Prompts, Runtime


def test_prompts_validate_and_encode_once(tiny_models):
    m = tiny_models("llama")
    p = Prompts(["hello there", "how are you"], labels=[0, 1])
    assert p.texts == ("hello there", "how are you") and p.chat is True and len(p) == 2 and list(p) == list(p.texts)
    texts, encs = p.encode(m)
    want_texts, want_encs = prepare(m, list(p.texts))
    assert texts == want_texts and [e.ids for e in encs] == [e.ids for e in want_encs]
    assert p.encode(m)[1] is encs                       # kept: encoded once per tokenizer
    raw = Prompts.of(["hello there"], chat=False)
    assert raw.chat is False and Prompts.of(raw) is raw and Prompts.of(raw, chat=True).chat is True
    assert prepare(m, ["hello there"], chat=False)[0] == raw.encode(m)[0]


def test_prompts_bad_input():
    with pytest.raises(TypeError, match="wrap it in a list"):
        Prompts("one prompt")
    with pytest.raises(ValueError, match="1 labels for 2 prompts"):
        Prompts(["a", "b"], labels=[1])
    with pytest.raises(TypeError, match="chat must be True or False"):
        Prompts(["a"], chat=None)
    with pytest.raises(TypeError, match="must be strings"):
        Prompts([1, 2])


def test_runtime_defaults_and_overrides():
    r = Runtime()
    assert (r.batch_size, r.seed, r.progress) == (16, 0, True)
    assert Runtime.of(None, batch_size=4).batch_size == 4 and Runtime.of(r, progress=None) is r
    with pytest.raises(ValueError, match="positive int"):
        Runtime(batch_size=0)
    assert interp.Prompts is Prompts and interp.Runtime is Runtime
