"""Tokens the model sees: the tokenizer's own BOS exactly once, means over real (non-special) tokens, and the
public logits / token log-prob functions."""

from __future__ import annotations

import warnings

import pytest
import torch
from tokenizers import processors

import interp
import interp.bundle
from interp.capturing import capture
from interp.forward import batch_of, last_logits, prepare
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


def test_prompt_mean_leaves_out_special_tokens(tiny_models):
    """The means skip BOS and template tokens by default (the attention sink dominated them); opt back in."""
    m = tiny_models("llama")
    P = ["the man said to the boy", "help"]
    allp = capture(m, P, sites="resid_post.1", positions="all", runtime=interp.Runtime(progress=False))
    mean = capture(m, P, sites="resid_post.1", positions="prompt_mean",
                   runtime=interp.Runtime(progress=False))
    with_sp = capture(m, P, sites="resid_post.1",
                      positions=interp.Positions("prompt_mean", skip_special=False),
                      runtime=interp.Runtime(progress=False))
    for i, p in enumerate(P):
        e = prepare(m, [p])[1][0]
        x = allp.tensor[i, 0, -len(e.ids):]
        words = torch.tensor([not s for s in e.special])
        torch.testing.assert_close(mean.tensor[i, 0], x[words].mean(0), atol=1e-5, rtol=0)
        torch.testing.assert_close(with_sp.tensor[i, 0], x.mean(0), atol=1e-5, rtol=0)
    assert mean.positions == "prompt_mean" and with_sp.positions == "prompt_mean+special"


def test_logits_and_token_logprobs_match_hf(tiny_models, tmp_path):
    m = tiny_models("llama")
    P, R = ["the man said to the boy", "help"], ["the old house", "what is it"]
    last = interp.logits(m, P)
    every = interp.logits(m, P, positions="all")
    scored = interp.token_logprobs(m, P, R)
    for i, p in enumerate(P):
        ids = torch.tensor([prepare(m, [p])[1][0].ids])
        full = torch.tensor([prepare(m, [p], responses=[R[i]])[1][0].ids])
        with torch.no_grad():
            hf, hf_full = m.hf(ids).logits[0], m.hf(full).logits[0]
        torch.testing.assert_close(last[i], hf[-1], atol=1e-5, rtol=0)
        torch.testing.assert_close(every[i], hf, atol=1e-5, rtol=0)
        s = scored[i]
        k = len(R[i].split())
        assert s.tokens == R[i].split() and s.positions == list(range(full.shape[1] - k, full.shape[1]))
        want = hf_full.log_softmax(-1)[torch.tensor(s.positions) - 1, full[0, -k:]]
        torch.testing.assert_close(s.logprobs, want, atol=1e-5, rtol=0)
        fr = s.to_frame()
        assert fr.token[0] == R[i].split()[0] and s.total == pytest.approx(float(want.sum()), abs=1e-4)
        assert fr.logprob.tolist() == pytest.approx(s.logprobs.tolist()) and fr.position.tolist() == s.positions
        su = s.summary()        # a Result: headline numbers, a figure, and a bundle that loads back equal
        assert su["n_tokens"] == k and su["total"] == pytest.approx(s.total) and su["mean"] == pytest.approx(s.total / k)
        j = int(s.logprobs.argmin())
        assert (su["lowest_token"], su["lowest_position"]) == (s.tokens[j], s.positions[j])
        bars = s.plot().data[0]
        assert list(bars.y) == pytest.approx(s.logprobs.tolist()) and list(bars.x) == [f"{p} {t}" for p, t in
                                                                                       zip(s.positions, s.tokens)]
        back = interp.bundle.load(s.save(tmp_path / f"lp{i}"))
        assert type(back) is type(s) and back.tokens == s.tokens and back.positions == s.positions
        assert torch.equal(back.logprobs, s.logprobs) and torch.equal(back.token_ids, s.token_ids)


def test_last_logits_names_interp_logits_for_wrong_input(tiny_models):
    m = tiny_models("llama")
    batch = batch_of(m, ["the man said"])
    torch.testing.assert_close(last_logits(m, batch)[0], interp.logits(m, ["the man said"])[0], atol=1e-6, rtol=0)
    with pytest.raises(TypeError, match=r"interp\.logits\(model, prompts\)") as e:
        last_logits(m, ["the man said"])
    assert len(str(e.value)) < 300  # the type only, not the model printed in full
    with pytest.raises(TypeError, match="interp Model") as e:
        last_logits(batch, m)
    assert len(str(e.value)) < 300


@pytest.mark.slow
def test_smollm2_prompt_mean_is_not_the_attention_sink():
    """SmolLM2 layer 15: with the special tokens the mean's norm was ~5x a real token's; now the same scale."""
    try:
        m = interp.load_model("smollm2-135m-instruct")
    except (FileNotFoundError, ImportError) as e:
        pytest.skip(f"SmolLM2-135M-Instruct is not installed ({e})")
    P = ["How do I bake bread?", "Tell me about the moon.", "What is two plus two?", "Name a colour."]
    mean = capture(m, P, sites="resid_post.15", positions="prompt_mean",
                   runtime=interp.Runtime(progress=False)).tensor[:, 0].norm(dim=-1)
    last = capture(m, P, sites="resid_post.15", positions="last",
                   runtime=interp.Runtime(progress=False)).tensor[:, 0].norm(dim=-1)
    sink = capture(m, P, sites="resid_post.15", positions=interp.Positions("prompt_mean", skip_special=False),
                   runtime=interp.Runtime(progress=False)).tensor[:, 0].norm(dim=-1)
    assert (mean < 1.5 * last).all() and (sink > 3 * last).all()
