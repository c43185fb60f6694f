"""Constrained (log-prob) verdicts of the explanation scorers: the local client's option log-probs against a direct
forward of a real tiny chat model, batching, bad options, the scorers in ``verdicts="logprob"`` mode, AUROC from
the margins and the non-LM reference explanation. (The HTTP path is in test_sae_explain_http.py.)"""

from __future__ import annotations

import math

import pytest
import torch

from sae.contexts import Context
from sae.explain import ExplainConfig, LatentExamples, LocalChatClient, score, verdict_metrics
from sae.explain.explainer import reference_explanation, reference_tokens
from sae.explain.prompts import scorer_messages
from sae.explain.scorers import lexical_score


@pytest.fixture(scope="module")
def local():
    import steering
    from interp.testing.tiny import tiny_model

    torch.manual_seed(0)
    return LocalChatClient(tiny_model("llama", max_position_embeddings=2048), steering.generate, max_new_tokens=4)


def _convs() -> list[list[dict[str, str]]]:
    """Scorer prompts of different lengths (so batches are left-padded)."""
    texts = ["the heavy rain fell all night", "a dry day", "we stayed in because of the rain and the cold wind",
             "please pass me the salt", "1 0 1"]
    return [scorer_messages("detection", "words about the weather", [t], few_shot=False) for t in texts]


def _direct(client: LocalChatClient, conv, options, cue: str) -> torch.Tensor:
    """The same quantity without our forward stack: the tokenizer on the templated text, one unpadded HF forward,
    log-softmax of the last position."""
    tok, hf = client.model.tokenizer, client.model.hf
    ids = tok.encode(client.prompt_text(conv) + cue, add_special_tokens=False)
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor([ids])).logits[0, -1].float()
    opt = [tok.encode(o, add_special_tokens=False)[0] for o in options]
    return logits.log_softmax(-1)[opt]


def test_option_logprobs_equal_a_direct_forward(local):
    convs = _convs()
    got = local.option_logprobs(convs, ("1", "0"), cue="[", batch_size=8)
    want = torch.stack([_direct(local, c, ("1", "0"), "[") for c in convs])
    assert got.shape == (5, 2) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert (got < 0).all() and not torch.allclose(got[0], got[1])  # real log-probs, prompt-dependent
    three = local.option_logprobs(convs[:2], ("1", "0", "a"), cue="")  # any number of single-token options
    torch.testing.assert_close(three, torch.stack([_direct(local, c, ("1", "0", "a"), "") for c in convs[:2]]),
                               atol=1e-5, rtol=1e-5)


def test_batching_does_not_change_option_logprobs(local):
    convs = _convs()
    ref = local.option_logprobs(convs, cue="[", batch_size=1)
    for bs in (2, 3, 8):
        torch.testing.assert_close(local.option_logprobs(convs, cue="[", batch_size=bs), ref, atol=1e-5, rtol=1e-5)
    # order is the caller's: a permuted list gives permuted rows
    torch.testing.assert_close(local.option_logprobs(convs[::-1], cue="[", batch_size=2), ref.flip(0),
                               atol=1e-5, rtol=1e-5)
    assert local.option_logprobs([], cue="[").shape == (0, 2)


def test_reusing_the_shared_prefix_does_not_change_option_logprobs(local):
    from interp.forward import prepare
    from sae.explain.client import shared_prefix

    convs = _convs() + [_convs()[0]]  # a repeated prompt: two rows of one length share a batch after the prefix
    texts = [local.prompt_text(c) + "[" for c in convs]
    _, encs = prepare(local.model, texts, chat=False)
    kv, start = shared_prefix(local.model, encs)
    whole = texts[0][:texts[0].index("Example 0:")]  # the system prompt and the explanation are shared
    assert kv is not None and len(local.model.tokenizer.encode(whole, add_special_tokens=False)) <= start
    assert start < min(len(e.ids) for e in encs) and len({tuple(e.ids[:start + 1]) for e in encs}) > 1
    ref = local.option_logprobs(convs, cue="[", reuse_prefix=False)
    for bs in (1, 2, 8):
        torch.testing.assert_close(local.option_logprobs(convs, cue="[", batch_size=bs), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(local.option_logprobs(convs[:1], cue="["), ref[:1], atol=1e-5, rtol=1e-5)
    other = scorer_messages("detection", "colours", ["a red door"], few_shot=False)  # shares only the system prompt
    torch.testing.assert_close(local.option_logprobs([convs[1], other], cue="["),
                               torch.cat([ref[1:2], local.option_logprobs([other], cue="[")]), atol=1e-5, rtol=1e-5)


def test_bad_options_are_refused_with_the_fix(local):
    convs = _convs()[:1]
    with pytest.raises(ValueError, match=r"'\[1\]' is 3 tokens.*exactly one token"):
        local.option_logprobs(convs, ("[1]", "0"))
    with pytest.raises(ValueError, match=r"map to the same token.*distinct tokens"):
        local.option_logprobs(convs, ("1", " 1"))  # this tokenizer drops the space: one token for both
    with pytest.raises(ValueError, match="unknown token"):
        local.option_logprobs(convs, ("yes", "0"))
    with pytest.raises(ValueError, match="two or more"):
        local.option_logprobs(convs, ("1",))
    with pytest.raises(ValueError, match="two or more"):
        local.option_logprobs(convs, "10")
    with pytest.raises(ValueError, match=r"'1' does not follow the prompt as its own token.*end the cue where"):
        local.option_logprobs(convs, ("1", "0"), cue="[1")  # this tokenizer reads '[11' as unknown tokens


def _ctx(words, acts, prompt=0):
    peak = max(range(len(acts)), key=lambda i: acts[i])
    return Context(prompt=prompt, position=peak, tokens=words, acts=acts, peak=peak, max_act=max(acts))


def _examples(n: int = 3) -> LatentExamples:
    act = [_ctx(["the", " heavy", " rain", f" {i}"], [0.0, 0.0, 2.0 + i, 0.0], i) for i in range(n)]
    quiet = [_ctx(["a", " dry", f" day{i}"], [0.0, 0.0, 0.0], 100 + i) for i in range(n)]
    top = [_ctx(["so", " much", " rain"], [0.0, 0.0, 3.0], 50), _ctx(["cold", " wind"], [0.0, 2.5], 51),
           _ctx(["more", " rain"], [0.0, 1.0], 52)]
    return LatentExamples(7, top, quiet[:1], act, quiet, n)


def test_logprob_scorer_reads_the_margins_and_answers_every_example(local):
    ex, cfg = _examples(3), ExplainConfig(n_shown=1, verdicts="logprob")
    for kind in ("detection", "fuzzing"):
        v = score(kind, local, "words about the weather", ex, cfg)
        assert v.mode == "logprob" and len(v.margins) == len(v.labels) == 6 and None not in v.preds
        convs = [scorer_messages(kind, "words about the weather", [t], few_shot=True) for t in v.texts]
        direct = torch.stack([_direct(local, c, ("1", "0"), "[") for c in convs])
        margin = (direct[:, 0] - direct[:, 1]).tolist()
        assert v.margins == pytest.approx(margin, abs=2e-5)
        assert v.preds == [int(m > 0) for m in margin]
        assert v.answers[0].startswith("log p('1') ")
        m = v.metrics()
        assert m["answered"].k == 6 and 0.0 <= m["auroc"] <= 1.0 and len(m["auroc_ci95"]) == 2
    text = score("detection", local, "weather", ex, ExplainConfig(n_shown=1))  # free-form: no margins
    assert text.mode == "text" and text.margins == [] and "auroc" not in text.metrics()


def test_logprob_mode_needs_one_example_per_prompt_and_a_capable_client():
    with pytest.raises(ValueError, match="n_shown=1"):
        ExplainConfig(verdicts="logprob", n_shown=3)
    with pytest.raises(ValueError, match="verdicts must be one of"):
        ExplainConfig(verdicts="probs")

    class TextOnly:
        name = "text-only"

        def complete(self, messages):
            return "[1]"

    with pytest.raises(ValueError, match="text-only has none: score with verdicts='text'"):
        score("detection", TextOnly(), "x", _examples(), ExplainConfig(n_shown=1, verdicts="logprob"))


def test_auroc_of_margins_is_the_mann_whitney_count():
    labels = [1, 1, 1, 0, 0, 0, 1, 0]
    margins = [2.0, 0.5, -1.0, 0.0, -2.0, 0.5, None, math.inf]
    preds = [1, 1, 0, 0, 0, 1, None, 1]
    m = verdict_metrics(labels, preds, margins=margins, n_boot=500)
    pos = [s for y, s in zip(labels, margins) if y == 1 and s is not None]
    neg = [s for y, s in zip(labels, margins) if y == 0 and s is not None]
    pairs = [(1.0 if p > q else 0.5 if p == q else 0.0) for p in pos for q in neg]
    assert m["auroc"] == pytest.approx(sum(pairs) / len(pairs))
    lo, hi = m["auroc_ci95"]
    assert 0.0 <= lo <= m["auroc"] <= hi <= 1.0
    assert verdict_metrics([1, 0], [1, 0], margins=[1.0, -1.0])["auroc"] == 1.0
    assert verdict_metrics([1, 0], [0, 1], margins=[-1.0, 1.0])["auroc"] == 0.0
    assert math.isnan(verdict_metrics([1, 1], [1, 1], margins=[1.0, 2.0])["auroc"])  # one class only
    with pytest.raises(ValueError, match="margins"):
        verdict_metrics([1, 0], [1, 0], margins=[1.0])


def test_reference_explanation_names_the_top_contexts_peak_tokens():
    ex = _examples()
    assert reference_explanation(ex) == "the tokens 'rain', 'wind'"
    assert reference_explanation(ex, k=1) == "the tokens 'rain'"
    ex.explain = []
    with pytest.raises(ValueError, match="no top contexts"):
        reference_explanation(ex)


def test_reference_counts_a_split_character_peak_as_the_token_that_completes_it():
    """A peak on the first bytes of a character (an empty piece) names the token a reader sees marked, never
    ``''``; a whitespace token is named by its repr."""
    ex = _examples()
    ex.explain = [_ctx(["x", "", "如", " y"], [0.0, 3.0, 1.0, 0.0], 60), _ctx(["", "如"], [2.0, 0.5], 61),
                  _ctx(["a", "\n"], [0.0, 1.0], 62)]
    assert reference_tokens(ex) == ["如", "\n"]
    assert reference_explanation(ex) == "the tokens '如', '\\n'"


def test_lexical_baseline_counts_the_words_on_the_scorers_examples():
    """The no-model baseline sees the examples ``score`` shows, in the same order, and counts the named tokens
    (detection) or the share of marked tokens that are named (fuzzing), by hand here."""
    ex, cfg = _examples(3), ExplainConfig(n_shown=1, verdicts="logprob")
    for kind in ("detection", "fuzzing"):
        v = lexical_score(kind, ["Rain "], ex, cfg)
        shown = score(kind, _Scripted(), "words about the weather", ex, ExplainConfig(n_shown=1))
        assert v.mode == "lexical" and v.texts == shown.texts and v.labels == shown.labels
        for y, m, text in zip(v.labels, v.margins, v.texts):
            if kind == "detection":
                assert m == text.count(" rain")                  # ' rain' stripped, case-folded: one per context
            else:
                assert m == (1.0 if "<< rain>>" in text else 0.0)   # the only activating token is the marked one
            assert (m > 0) == (y == 1)                           # here the word separates the classes exactly
        assert v.metrics(n_boot=20)["auroc"] == 1.0
        off = lexical_score(kind, ["salt"], ex, cfg, explanation_of=3)
        assert off.explanation_of == 3 and set(off.margins) == {0.0}
    with pytest.raises(ValueError, match="at least one word"):
        lexical_score("detection", [], ex, cfg)


class _Scripted:
    """A chat client that always answers ``[1]`` (only the examples shown matter here)."""

    name = "scripted"

    def complete(self, messages):
        return "[1]"


def test_paired_auroc_difference_resamples_both_conditions_together():
    from sae.explain import Verdicts
    from sae.explain.scorers import auroc_difference

    labels, texts = [1, 1, 1, 0, 0, 0], list("abcdef")
    good = Verdicts("detection", "x", 1, labels, [1, 1, 1, 0, 0, 0], texts, [], "logprob", [3.0, 2.0, 1.0, -1.0, -2.0, 0.5])
    flat = Verdicts("detection", "y", 2, labels, [1] * 6, texts, [], "logprob", [0.1, -0.2, 0.3, 0.2, -0.1, 0.0])
    d, (lo, hi) = auroc_difference([good], [flat], n_boot=500)
    want = verdict_metrics(labels, good.preds, margins=good.margins)["auroc"] - \
        verdict_metrics(labels, flat.preds, margins=flat.margins)["auroc"]
    assert d == pytest.approx(want) and lo <= d <= hi
    assert auroc_difference([good], [good], n_boot=200) == (0.0, [0.0, 0.0])  # paired: identical -> exactly 0
    other = Verdicts("detection", "y", 2, labels, [1] * 6, list("abcdeg"), [], "logprob", [0.0] * 6)
    with pytest.raises(ValueError, match="different examples"):
        auroc_difference([good], [other])


def test_logprob_results_save_load_and_summarise_with_their_mode(tmp_path):
    from sae.explain import Explanation, LatentExplanations, Verdicts

    labels, texts = [1, 1, 0, 0], list("abcd")

    def v(of, margins):
        return Verdicts("detection", f"expl {of}", of, labels, [int(m > 0) for m in margins], texts, [], "logprob",
                        margins)

    own, ctl = [v(1, [2.0, 1.0, -1.0, 0.5]), v(2, [1.0, -math.inf, 0.0, -2.0])], [v(2, [0.1] * 4), v(1, [0.0] * 4)]
    res = LatentExplanations([1, 2], [Explanation(k, f"expl {k}", True, "", "x") for k in (1, 2)], [2, 1],
                             own, own, ctl, ctl, explainer="x", scorer="y")
    s = res.summary()
    assert s["detection/explanation"]["mode"] == "logprob" and s["fuzzing/shuffled"]["auroc"] == 0.5
    assert s["detection/explanation"]["auroc"] == pytest.approx(
        verdict_metrics(labels * 2, [q for x in own for q in x.preds], margins=own[0].margins + own[1].margins)["auroc"])
    frame = res.to_frame()
    assert {"auroc", "auroc_low", "auroc_high", "mode"} <= set(frame.columns) and set(frame["mode"]) == {"logprob"}
    back = LatentExplanations.load(res.save(tmp_path / "res"))
    assert back.detection[1].margins == own[1].margins and back.detection[1].mode == "logprob"
    assert str(back.summary()) == str(s)


def test_options_outside_an_endpoints_top_logprobs_leave_the_example_unanswered():
    """Bookkeeping on known log-probs (a scripted client, not a model): both options unknown -> unanswered; one
    unknown -> the other wins with an infinite margin."""
    from sae.explain.scorers import logprob_verdicts

    class Known:
        name = "known"

        def __init__(self, rows):
            self.rows = rows

        def option_logprobs(self, conversations, options, cue):
            assert tuple(options) == ("1", "0") and cue == "["
            return torch.tensor(self.rows[:len(conversations)])

    inf = math.inf
    preds, margins, answers = logprob_verdicts(Known([[-1.0, -2.0], [-inf, -0.5], [-inf, -inf]]), [[]] * 3)
    assert preds == [1, 0, None] and margins == [1.0, -inf, None] and answers[2].startswith("log p('1') -inf")
    m = verdict_metrics([1, 0, 1], preds, margins=margins)
    assert m["answered"].k == 2 and m["auroc"] == 1.0
    with pytest.raises(ValueError, match="shape"):
        logprob_verdicts(Known([[-1.0, -2.0, -3.0]]), [[]])
