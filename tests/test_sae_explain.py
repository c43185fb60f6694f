"""Explanations of SAE latents with detection / fuzzing scores (sae.explain): the prompts against delphi's format
elements, the scorers' arithmetic, the shuffled-explanation control, and the whole run on the toy organism with a
real local chat model (a tiny random Llama through steering.generate), resumed after a failure."""

from __future__ import annotations

import math
import re

import pytest
import torch

from interp.evals.rates import wilson
from sae.contexts import Context
from sae.explain import (
    ChatClientError,
    ExplainConfig,
    LatentExamples,
    score,
    shuffled_assignment,
    verdict_metrics,
)
from sae.explain.prompts import (
    explainer_messages,
    mark,
    parse_explanation,
    parse_verdicts,
    plain,
    scorer_messages,
)

SITE = "blocks.1.hook_resid_post"


def _ctx(words: list[str], acts: list[float], prompt: int = 0) -> Context:
    peak = max(range(len(acts)), key=lambda i: acts[i])
    return Context(prompt=prompt, position=peak, tokens=words, acts=acts, peak=peak, max_act=max(acts))


def _examples(n_active: int = 4, n_quiet: int = 4) -> LatentExamples:
    """Hand-made contexts: the 'feature' is the word ' rain' (active there), the quiet ones never mention it."""
    act = [_ctx(["the", " heavy", " rain", f" {i}"], [0.0, 0.0, 2.0 + i, 0.0], i) for i in range(n_active)]
    quiet = [_ctx(["a", " dry", f" day{i}"], [0.0, 0.0, 0.0], 100 + i) for i in range(n_quiet)]
    return LatentExamples(7, act[:1], quiet[:1], act, quiet, n_active)


# --- prompts: delphi's format elements ---------------------------------------------------------------------------

def test_mark_wraps_runs_of_active_tokens_once():
    assert mark(["a", " b", " c", " d"], [False, True, True, False]) == "a<< b c>> d"
    assert mark(["a", " b", "\n"], [True, False, True]) == "<<a>> b<<\\n>>"
    # the first bytes of a split character (empty pieces) pass their mark to the token that completes it
    assert mark(["x", "", "如", " y"], [False, True, False, False]) == "x<<如>> y"
    assert mark(["", "如", "", "何"], [False, True, False, False]) == "<<如>>何"
    with pytest.raises(ValueError, match="marks"):
        mark(["a"], [True, False])


def test_explainer_prompt_marks_tokens_by_activation_and_counts_examples():
    active = [_ctx(["x", " y", " z"], [0.1, 3.0, 1.0]), _ctx(["p", " q"], [2.0, 0.0])]
    quiet = [_ctx(["m", " n"], [0.0, 0.0])]
    msgs = explainer_messages(active, quiet, threshold=0.3)
    user = msgs[-1]["content"]
    assert msgs[0]["role"] == "system" and "[EXPLANATION]:" in msgs[0]["content"] and msgs[-1]["role"] == "user"
    assert "Example 1: x<< y z>>\n" in user  # 0.1 < 0.3 * 3.0 is not marked; 1.0 is
    assert "Example 2: <<p>> q\n" in user
    assert user.count("<<") == 2 and user.count(">>") == 2
    assert len(re.findall(r"^Example \d+:", user, re.M)) == 3 and "Example 1: m n\n" in user  # quiet: unmarked
    bare = explainer_messages(active, quiet, threshold=0.3, few_shot=False)
    assert [m["role"] for m in bare] == ["system", "user"] and bare[-1] == msgs[-1]
    with pytest.raises(ValueError, match="never fired"):
        explainer_messages([], quiet)


def test_explainer_can_list_the_marked_tokens_with_their_activation():
    """delphi's option: under each active example, its marked tokens on a 0-9 scale of the largest activation
    shown (3.0 here); the first bytes of a split character give their mark and activation to the character."""
    active = [_ctx(["x", " y", " z"], [0.1, 3.0, 1.0]), _ctx(["p", "", "如", " q"], [0.0, 2.0, 0.5, 0.0])]
    msgs = explainer_messages(active, [], threshold=0.3, few_shot=True, show_activations=True)
    user = msgs[-1]["content"]
    assert "Example 1: x<< y z>>\nMarked tokens: 'y' (9), 'z' (3)\n" in user
    assert "Example 2: p<<如>> q\nMarked tokens: '如' (6)\n" in user
    assert "0 (weak) to 9" in msgs[0]["content"] and "Marked tokens: 'ly' (9)" in msgs[1]["content"]
    plain_msgs = explainer_messages(active, [], threshold=0.3)
    assert "Marked tokens" not in plain_msgs[-1]["content"] + plain_msgs[0]["content"] + plain_msgs[1]["content"]


def test_scorer_prompts_number_from_zero_and_mark_only_for_fuzzing():
    texts = ["the rain", "a dry day", "more rain"]
    det = scorer_messages("detection", "weather words", texts)[-1]["content"]
    assert det.startswith("Feature explanation: weather words\n\nTest examples:\n\n")
    assert [int(n) for n in re.findall(r"^Example (\d+):", det, re.M)] == [0, 1, 2]
    fuzz = scorer_messages("fuzzing", "weather words", ["the <<rain>>"])
    assert "<<rain>>" in fuzz[-1]["content"] and "<<" in fuzz[0]["content"]
    assert [m["role"] for m in fuzz] == ["system", "user", "assistant", "user"]


def test_parsers_follow_delphi_rules():
    assert parse_explanation("thinking...\n[EXPLANATION]: the word rain\n") == ("the word rain", True)
    assert parse_explanation("no tag here\nlast line") == ("last line", False)
    assert parse_verdicts("sure: [1, 0, 1] and [0]", 3) == [1, 0, 1]
    assert parse_verdicts("[1, 0]", 3) is None and parse_verdicts("[1, 2, 0]", 3) is None
    assert parse_verdicts("1 0 1", 3) is None and parse_verdicts("[true, false]", 2) == [1, 0]
    assert parse_verdicts(" 1\nbecause", 1) == [1] and parse_verdicts("0", 1) == [0]  # one example: bare digit
    assert parse_verdicts("10 of them", 1) is None and parse_verdicts("1.5", 1) is None


# --- the scorers' arithmetic on a scripted client ------------------------------------------------------------------

class ScriptedClient:
    """A chat client whose answers the test controls. This is not a mock of the model under study (the SAE's
    model is not involved): the scorer's bookkeeping and arithmetic are what is tested, on known answers.
    ``rule(example_text) -> 0/1`` per example shown, or ``raw`` answers returned verbatim."""

    name = "scripted"

    def __init__(self, rule=None, raw=None):
        self.rule, self.raw, self.calls = rule, raw, []

    def complete(self, messages):
        self.calls.append(messages)
        if self.raw is not None:
            return self.raw
        shown = re.findall(r"^Example \d+: (.*)$", messages[-1]["content"], re.M)
        return str([int(self.rule(t)) for t in shown])


def test_detection_scores_a_perfect_an_inverted_and_a_yes_sayer():
    ex, cfg = _examples(4, 4), ExplainConfig(n_shown=3)
    perfect = score("detection", ScriptedClient(lambda t: "rain" in t), "rain", ex, cfg)
    assert sorted(perfect.labels) == [0] * 4 + [1] * 4 and len(perfect.answers) == 3  # 8 examples, 3 per prompt
    m = perfect.metrics()
    assert m["accuracy"].k == 8 and m["balanced_accuracy"] == 1.0 and m["f1"] == 1.0
    assert m["accuracy"].ci95 == pytest.approx(wilson(8, 8), abs=1e-4)
    inverted = score("detection", ScriptedClient(lambda t: "rain" not in t), "rain", ex, cfg).metrics()
    assert inverted["accuracy"].k == 0 and inverted["balanced_accuracy"] == 0.0 and inverted["f1"] == 0.0
    yes = score("detection", ScriptedClient(lambda t: True), "rain", ex, cfg).metrics()
    assert yes["recall"].rate == 1.0 and yes["specificity"].rate == 0.0 and yes["balanced_accuracy"] == 0.5
    assert yes["f1"] == pytest.approx(2 * 4 / (2 * 4 + 4))  # tp=4, fp=4, fn=0
    lo, hi = yes["balanced_accuracy_ci95"]
    assert lo <= 0.5 <= hi


def test_fuzzing_marks_active_tokens_or_borrowed_positions():
    ex, cfg = _examples(3, 3), ExplainConfig(n_shown=6)
    client = ScriptedClient(lambda t: "<< rain" in t)
    v = score("fuzzing", client, "rain", ex, cfg)
    for label, text in zip(v.labels, v.texts):
        assert text.count("<<") == 1  # one marked run in each, correct or not
        assert ("<< rain" in text) == (label == 1)
        if label == 0:
            assert "<< day" in text  # the activating contexts' marked position (2) borrowed
    assert v.metrics()["accuracy"].k == 6


def test_unparsed_answers_are_unanswered_not_wrong():
    ex, cfg = _examples(2, 2), ExplainConfig(n_shown=2)
    v = score("detection", ScriptedClient(raw="I think the first one"), "rain", ex, cfg)
    m = v.metrics()
    assert v.preds == [None] * 4 and m["answered"].k == 0 and m["accuracy"].n == 0 and math.isnan(m["f1"])
    m = verdict_metrics([1, 1, 0, 0], [1, None, 0, 1])
    assert (m["accuracy"].k, m["accuracy"].n, m["answered"].k) == (2, 3, 3)
    assert m["balanced_accuracy"] == pytest.approx((1.0 + 0.5) / 2)


def test_scorer_needs_both_kinds_of_contexts():
    ex = _examples(2, 2)
    ex.test_random = []
    with pytest.raises(ValueError, match="non-activating"):
        score("detection", ScriptedClient(lambda t: 1), "x", ex, ExplainConfig())
    with pytest.raises(ValueError, match="scorer must be"):
        score("intruder", ScriptedClient(lambda t: 1), "x", _examples(), ExplainConfig())


def test_shuffled_control_is_a_seeded_derangement():
    latents = [3, 9, 11, 40, 41]
    a = shuffled_assignment(latents, seed=0)
    assert sorted(a) == sorted(latents) and sorted(a.values()) == sorted(latents)
    assert all(k != v for k, v in a.items())
    assert a == shuffled_assignment(latents, seed=0) and any(shuffled_assignment(latents, s) != a for s in range(1, 5))
    with pytest.raises(ValueError, match="at least 2"):
        shuffled_assignment([3], seed=0)


def test_control_uses_the_same_examples_in_the_same_order():
    ex, cfg = _examples(4, 4), ExplainConfig(n_shown=4)
    own = score("fuzzing", ScriptedClient(lambda t: 1), "rain", ex, cfg)
    other = score("fuzzing", ScriptedClient(lambda t: 1), "numbers", ex, cfg, explanation_of=12)
    assert own.texts == other.texts and own.labels == other.labels and other.explanation_of == 12
    assert own.explanation_of == 7


# --- the whole run on the toy organism, with a real local chat model ------------------------------------------------

def test_local_client_batches_as_it_answers_one_by_one():
    """The organism as a chat model: answers in one padded batch equal the answers one at a time (greedy)."""
    import interp
    import steering
    from sae.explain import LocalChatClient

    client = LocalChatClient(interp.load_model("organism"), steering.generate, max_new_tokens=8)
    convs = [[{"role": "user", "content": t}] for t in ("hello", "write a poem about rain", "how do i make a bomb")]
    assert client.complete_many(convs) == [client.complete(c) for c in convs]
    assert client.prompt_text(convs[0]).startswith("<|bos|><|user|> hello")


def test_pieces_give_a_split_character_to_the_token_that_completes_it():
    """A byte-level BPE (trained here on a few words, so CJK characters span several tokens): the pieces join to
    the decoded text and carry no replacement characters."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    from sae.contexts import pieces

    bt = ByteLevelBPETokenizer()
    bt.train_from_iterator(["hello world café", "le café est bon", "如何 制作"], vocab_size=270, min_frequency=1,
                           show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bt._tokenizer)
    ids = tok("如何制作 café", add_special_tokens=False)["input_ids"]
    p = pieces(tok, ids)
    assert len(ids) > 5 and len(p) == len(ids)
    assert "".join(p) == tok.decode(ids) == "如何制作 café" and "\ufffd" not in "".join(p)
    assert p == ["", "", "如", "", "何", "", "", "制", "", "作", " café"]  # each character on its last byte's token


def test_windows_are_widened_to_whole_characters():
    """A window whose edge falls inside a character split over several tokens grows to take all of it, so no
    context starts or ends with a replacement character; the peak still indexes the same token."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    from sae.contexts import pieces, whole_characters, window_context

    bt = ByteLevelBPETokenizer()
    bt.train_from_iterator(["hello world", "le café est bon"], vocab_size=262, min_frequency=1, show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bt._tokenizer)
    ids = torch.tensor(tok("ab如何制作cd", add_special_tokens=False)["input_ids"])
    T = len(ids)
    assert T >= 14                                                 # each CJK character is 3 byte tokens
    cut_lo, cut_hi = 3, 7                                          # both edges inside a character
    assert tok.decode(ids[cut_lo:cut_hi].tolist()).startswith("\ufffd")
    lo, hi = whole_characters(tok, ids.tolist(), cut_lo, cut_hi)
    assert lo <= cut_lo and hi >= cut_hi and "\ufffd" not in tok.decode(ids[lo:hi].tolist())
    acts = torch.zeros(T)
    acts[5] = 2.0
    c = window_context(tok, ids, acts, 0, 5, (5 - cut_lo, cut_hi - 6))
    assert "\ufffd" not in "".join(c.tokens) and c.tokens == pieces(tok, ids[lo:hi].tolist())
    assert c.acts[c.peak] == 2.0 and c.position == 5 and c.peak == 5 - lo
    assert whole_characters(None, ids.tolist(), cut_lo, cut_hi) == (cut_lo, cut_hi)


def test_held_out_contexts_random_quantiles_or_top():
    """The scorers' activating contexts under each ``test_from``, on activations whose ranking is known: prompt
    i < 30 peaks at 40 - i, so the rank of an activating context is its prompt."""
    import random as _random

    from sae.explain.examples import _split_latent

    per = []
    for i in range(40):
        acts = torch.zeros(20, 1)
        if i < 30:
            acts[5 + i % 10, 0] = 40.0 - i
        per.append({"ids": torch.arange(20), "acts": acts})
    picks = {}
    for mode in ("random", "quantiles", "top"):
        cfg = ExplainConfig(n_explain=4, n_explain_random=2, n_test=3, n_test_random=3, test_from=mode)
        ex = _split_latent(7, 0, per, cfg, None, _random.Random("0:7"))
        assert [c.prompt for c in ex.explain] == [0, 1, 2, 3] and ex.n_active_prompts == 30
        picks[mode] = [c.prompt for c in ex.test]
        assert [c.max_act for c in ex.test] == sorted((c.max_act for c in ex.test), reverse=True)
        assert all(max(c.acts) == 0 for c in ex.explain_random + ex.test_random)
    assert picks["top"] == [4, 5, 6]
    # 26 held-out activating contexts (ranks 4..29) cut into 3 bins of equal count: 4..11, 12..20, 21..29
    lo = [4, 12, 21]
    hi = [11, 20, 29]
    assert all(a <= p <= b for p, a, b in zip(picks["quantiles"], lo, hi)), picks["quantiles"]
    assert all(4 <= p <= 29 for p in picks["random"]) and len(set(picks["random"])) == 3
    with pytest.raises(ValueError, match="test_from must be one of"):
        ExplainConfig(test_from="bottom")


@pytest.fixture(scope="module")
def organism_run():
    import interp
    import steering
    from interp.capturing import capture
    from interp.data import load_prompts
    from interp.testing.tiny import tiny_model
    from sae.explain import LocalChatClient
    from sae.trainer import train_sae

    model = interp.load_model("organism")
    prompts = [r["instruction"] for s in ("harmful_train", "harmless_train") for r in load_prompts(f"organism_{s}")]
    acts = capture(model, prompts, sites=[SITE], positions="all", runtime=interp.Runtime(progress=False))
    x = acts.flat_tokens(SITE)
    sae = train_sae(x, arch="topk", d_sae=64, k=4, total_tokens=30_000, batch_size=256, lr=3e-3, site=SITE,
                    progress=False).sae
    from sae.analysis import encode_tokens

    freq = (encode_tokens(sae, x) > 0).float().mean(0)
    latents = freq.argsort(descending=True)[6:9].tolist()  # common enough to have held-out contexts
    client_model = tiny_model("llama", max_position_embeddings=2048)  # a random chat model with a long context
    client = LocalChatClient(client_model, steering.generate, max_new_tokens=12)
    cfg = ExplainConfig(n_explain=4, n_explain_random=2, n_test=3, n_test_random=3, n_shown=3)
    return {"model": model, "sae": sae, "latents": latents, "prompts": prompts[:100], "client": client, "cfg": cfg}


def test_examples_split_top_contexts_from_held_out_ones(organism_run):
    from sae.explain import latent_examples

    r = organism_run
    ex = latent_examples(r["model"], r["sae"], r["latents"], r["prompts"], r["cfg"])
    for latent in r["latents"]:
        e = ex[latent]
        assert len(e.explain) == 4 and len(e.test) == 3 and len(e.test_random) == 3 and len(e.explain_random) == 2
        peaks = [c.max_act for c in e.explain]
        assert peaks == sorted(peaks, reverse=True) and min(peaks) >= max(c.max_act for c in e.test) > 0
        used = [c.prompt for c in e.explain + e.test]
        assert len(set(used)) == len(used)  # one context per prompt, held-out prompts differ
        assert all(max(c.acts) == 0 for c in e.explain_random + e.test_random)
        assert len({c.prompt for c in e.explain_random + e.test_random}) == 5
        assert all(plain(c).strip() for c in e.test)
    again = latent_examples(r["model"], r["sae"], r["latents"], r["prompts"], r["cfg"])
    assert [c.prompt for c in again[r["latents"][0]].test] == [c.prompt for c in ex[r["latents"][0]].test]


def test_run_through_the_local_client_saves_and_loads(organism_run, tmp_path):
    from sae.explain import LatentExplanations, explain_latents

    r = organism_run
    res = explain_latents(r["model"], r["sae"], r["latents"], r["prompts"], r["client"], cfg=r["cfg"])
    assert res.latents == r["latents"] and res.explainer == "local:tiny-llama" and res.model_id == "organism"
    assert all(e.text and e.explainer == "local:tiny-llama" for e in res.explanations)
    for i, latent in enumerate(res.latents):
        assert res.control_of[i] != latent
        for kind in ("detection", "fuzzing"):
            own, ctl = res.verdicts(kind)[i], res.verdicts(kind, "shuffled")[i]
            assert own.explanation == res.explanation_of(latent)
            assert ctl.explanation == res.explanation_of(res.control_of[i]) and ctl.explanation_of == res.control_of[i]
            assert own.texts == ctl.texts and sorted(own.labels) == [0, 0, 0, 1, 1, 1]
    frame = res.to_frame()
    assert len(frame) == 3 * 2 * 2 and set(frame.condition) == {"explanation", "shuffled"}
    s = res.summary()
    assert {"detection/explanation", "detection/shuffled", "fuzzing/explanation", "fuzzing/shuffled"} <= set(s)
    assert res.plot() is not None
    back = LatentExplanations.load(res.save(tmp_path / "res"))
    assert back.summary() == s or str(back.summary()) == str(s)  # NaN != NaN: compare the text
    assert back.fuzzing_control[1].texts == res.fuzzing_control[1].texts


class Flaky:
    """The real local client, failing (as an endpoint that went away would) once ``fail_at`` calls were made."""

    def __init__(self, inner, fail_at=None):
        self.inner, self.fail_at, self.calls, self.name = inner, fail_at, 0, inner.name

    def complete(self, messages):
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise ChatClientError("http://127.0.0.1:9/v1/chat/completions went away")
        self.calls += 1
        return self.inner.complete(messages)


def test_resume_after_a_failure_skips_done_work_and_matches_one_run(organism_run, tmp_path):
    from sae.explain import explain_latents

    r = organism_run
    args = (r["model"], r["sae"], r["latents"], r["prompts"])
    whole = Flaky(r["client"])
    ref = explain_latents(*args, whole, cfg=r["cfg"])
    total = whole.calls  # 3 explanations + 3 latents x 2 scorers x 2 conditions x 2 prompts
    assert total == 3 + 3 * 2 * 2 * 2
    first = Flaky(r["client"], fail_at=10)  # mid-way through a scorer's file: its one finished call is redone
    with pytest.raises(ChatClientError, match="went away"):
        explain_latents(*args, first, cfg=r["cfg"], folder=tmp_path / "run")
    written = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert "manifest.json" in written and len([n for n in written if n.startswith("explanation_")]) == 3
    second = Flaky(r["client"])
    res = explain_latents(*args, second, cfg=r["cfg"], folder=tmp_path / "run")
    assert first.calls == 10 and second.calls == total - 9
    assert [e.text for e in res.explanations] == [e.text for e in ref.explanations]
    assert [v.preds for v in res.detection_control] == [v.preds for v in ref.detection_control]
    third = Flaky(r["client"], fail_at=0)  # everything is on disk: no call at all
    assert explain_latents(*args, third, cfg=r["cfg"], folder=tmp_path / "run").summary()["n_latents"] == 3


def test_a_folder_of_another_sae_or_config_is_refused(organism_run, tmp_path):
    import copy

    from sae.explain import explain_latents

    r = organism_run
    args = (r["model"], r["sae"], r["latents"], r["prompts"])
    explain_latents(*args, r["client"], cfg=r["cfg"], folder=tmp_path / "run")
    other = copy.deepcopy(r["sae"])
    with torch.no_grad():
        other.W_enc.mul_(1.01)
    with pytest.raises(ValueError, match=r"another run \(its examples, sae differ.*another folder"):
        explain_latents(r["model"], other, r["latents"], r["prompts"], r["client"], cfg=r["cfg"], folder=tmp_path / "run")
    with pytest.raises(ValueError, match="its config, examples differ"):
        explain_latents(*args, r["client"], cfg=ExplainConfig(n_explain=3, n_test=3, n_test_random=3, n_shown=3),
                        folder=tmp_path / "run")
    # a folder whose contexts were drawn or rendered otherwise (older code, same SAE and config) is refused too
    from interp.io import read_json, write_json

    held = read_json(tmp_path / "run" / "manifest.json")
    write_json(tmp_path / "run" / "manifest.json", {**held, "examples": "0" * 16})
    with pytest.raises(ValueError, match=r"its examples differ"):
        explain_latents(*args, r["client"], cfg=r["cfg"], folder=tmp_path / "run")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("my file")
    with pytest.raises(ValueError, match="not an explanation run folder"):
        explain_latents(*args, r["client"], cfg=r["cfg"], folder=tmp_path / "mine")
