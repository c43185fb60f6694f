"""Tokens the model sees: the tokenizer's own BOS exactly once, means over real (non-special) tokens, and the
public logits / token log-prob functions."""

from __future__ import annotations

import warnings

import pytest
import torch
from tokenizers import processors

import interp
from interp.forward import prepare
from interp.testing.tiny import tiny_model

FAMILIES = ["llama", "gpt2", "gemma3_text", "qwen2"]


def _adds_bos(m):
    """Make the tiny tokenizer prepend <bos> (id 1) itself, as Llama's and Gemma's tokenizers do."""
    m.tokenizer._tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A",
                                                                          special_tokens=[("<bos>", 1)])
    return m


@pytest.mark.parametrize("family", FAMILIES)
def test_plain_prompt_starts_with_the_tokenizers_bos(family):
    """No chat template: the plain fallback (and raw text) start with BOS, as the tokenizer says (item 3)."""
    m = _adds_bos(tiny_model(family))
    m.tokenizer.chat_template = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = prepare(m, ["the man said"])[1][0]
    raw = prepare(m, ["the man said"], chat=False)[1][0]
    assert plain.ids[0] == 1 and plain.ids[1] != 1
    assert raw.ids == [1] + m.tokenizer("the man said", add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("family", FAMILIES)
def test_chat_template_bos_is_never_doubled(family):
    """The template writes {{ bos_token }} and the tokenizer adds one too: exactly one BOS, post tokens intact."""
    m = _adds_bos(tiny_model(family))
    e = prepare(m, ["the man said"])[1][0]
    assert e.ids[0] == 1 and e.ids.count(1) == 1
    assert m.tokenizer.convert_ids_to_tokens(e.ids[e.post_start:]) == ["<|end|>", "<|assistant|>"]


def test_tokenizer_without_bos_gets_none():
    """A tokenizer that adds nothing (GPT-2's, the tiny one) gets nothing added."""
    m = tiny_model("gpt2")
    e = prepare(m, ["the man said"], chat=False)[1][0]
    assert e.ids == m.tokenizer("the man said", add_special_tokens=False)["input_ids"]


def _gemma():
    try:
        return interp.load_model("gemma3-270m")
    except (FileNotFoundError, ImportError) as e:
        pytest.skip(f"Gemma 3 270M is not installed ({e})")


@pytest.mark.slow
def test_gemma3_plain_prompt_has_bos_and_answers_paris():
    m = _gemma()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        e = prepare(m, ["What is the capital of France?"])[1][0]
    assert e.ids[0] == m.tokenizer.bos_token_id == 2 and e.ids[1] != 2
    ids = torch.tensor([e.ids])
    with torch.no_grad():
        out = m.hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    assert "Paris" in m.tokenizer.decode(out[0, ids.shape[1]:])
