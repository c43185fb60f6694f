"""The entrainment study on the toy organism and a tiny random Llama: the prompt set, present / absent pairs, the
gain against plain logits, the mask sweep's range check, found vs layer-matched random heads, and the attention
read at the context token against the unpadded pattern."""

from __future__ import annotations

import pytest
import torch

import interp
from interp.look.heads import _patterns
from interp.studies.entrainment import (
    KINDS,
    EntrainmentConfig,
    EntrainmentEffect,
    EntrainmentStudy,
    context_attention,
    entrainment_effect,
    entrainment_study,
    from_rows,
    load_entrainment,
    make_pairs,
)
from interp.studies.entrainment.heads import random_head_sets
from interp.testing.tiny import tiny_model

# (question, answer, counterfactual, random words, irrelevant word): words both tokenizers know
ITEMS = [("the house is", "old", "new", "picture turn water light", "number"),
         ("the day is", "good", "small", "round show play place", "time"),
         ("the way is", "right", "back", "read move look see", "work"),
         ("the people are", "here", "there", "tell take set put", "home"),
         ("the picture is", "little", "two", "write give find build", "water"),
         ("the number is", "one", "first", "make help need know", "light")]


def _set():
    rows = [{"id": f"t{i}", "question": q, "answer": a,
             "random": {"context": f"{r} .", "word": r.split()[-1]},
             "irrelevant": {"context": f"i see a {w} .", "word": w},
             "counterfactual": {"context": f"{q} {c} .", "word": c},
             "factual": {"context": f"{q} {a} .", "word": a}} for i, (q, a, c, r, w) in enumerate(ITEMS)]
    return from_rows(rows)


@pytest.fixture(scope="module")
def organism():
    return interp.load_model("organism")


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama", seed=3)


FAST = EntrainmentConfig(sparsities=(0.003, 0.03), sparsity=0.03, steps=8, max_heads=2, n_draws=2, n_boot=200)


def test_prompt_set_is_ours_and_well_formed():
    data = load_entrainment()
    assert len(data) >= 60 and len(set(data.ids)) == len(data)
    for k in KINDS:
        assert all(" " + w in c or c.startswith(w) for c, w in zip(data.contexts[k], data.words[k]))
    assert all(cf != a for cf, a in zip(data.words["counterfactual"], data.answers))
    assert data.words["factual"] == data.answers
    assert all(q in c for q, c in zip(data.questions, data.contexts["counterfactual"]))


def test_pairs_hold_the_token_only_when_present(organism):
    data = _set()
    for kind in KINDS:
        pairs = make_pairs(organism, data, kind)
        assert len(pairs.items) == len(data)
        for pre, ab, t in zip(pairs.present, pairs.absent, pairs.token.tolist()):
            assert t in organism.tokenizer.encode(pre, add_special_tokens=False)
            assert t not in organism.tokenizer.encode(ab, add_special_tokens=False)


def test_words_unknown_to_the_tokenizer_are_refused(organism):
    rows = [{"id": str(i), "question": "the capital is", "answer": "paris",
             **{k: {"context": "zyxxy qwop .", "word": "qwop"} for k in KINDS}} for i in range(3)]
    with pytest.raises(ValueError, match="use words of its vocabulary"):
        make_pairs(organism, from_rows(rows), "random")
    with pytest.raises(ValueError, match="at least 2 items"):
        load_entrainment(n=1)
    with pytest.raises(ValueError, match="rows"):
        from_rows([{"id": "x", "question": "q"}])


def test_gain_equals_plain_logits(organism):
    data = _set()
    eff = entrainment_effect(organism, data, ("counterfactual", "random"), n_boot=200)
    pairs = make_pairs(organism, data, "counterfactual")
    for texts, got in ((pairs.present, eff.kinds["counterfactual"].present_logit),
                       (pairs.absent, eff.kinds["counterfactual"].absent_logit)):
        ids = [organism.tokenizer(t, return_tensors="pt").input_ids for t in texts]
        with torch.no_grad():
            want = torch.stack([organism.hf(input_ids=i).logits[0, -1, t] for i, t in zip(ids, pairs.token)])
        torch.testing.assert_close(got, want.float(), atol=1e-4, rtol=1e-4)
    s = eff.summary()
    g = s["gains"]["counterfactual"]["logit"]
    assert g["lo"] <= g["mean"] <= g["hi"] and 0 < g["p"] <= 1
    assert s["counterfactual_vs_factual"] is None                   # factual not measured here
    assert len(eff.to_frame()) == 2 * len(data)


def test_sparsity_outside_its_range_is_refused():
    for bad in ((0.0, 0.01), (0.01, 5.0)):
        with pytest.raises(ValueError, match=r"outside its range \[0.0001, 1.0\]"):
            EntrainmentConfig(sparsities=bad)
    with pytest.raises(ValueError, match="outside its range"):
        EntrainmentConfig(sparsity=2.0)
    with pytest.raises(ValueError, match="not one of the sweep"):
        EntrainmentConfig(sparsities=(0.01, 0.03), sparsity=0.02)
    with pytest.raises(ValueError, match="mask_kind='factual'"):
        EntrainmentConfig(mask_kind="factual")
    with pytest.raises(ValueError, match="unknown context kind"):
        EntrainmentConfig(kinds=("random", "nonsense"))


def test_random_heads_match_layers_and_avoid_found(tiny):
    heads = [[0, 1], [1, 2], [1, 3]]
    for d in random_head_sets(tiny, heads, 3, seed=0):
        assert sorted(la for la, _ in d) == [0, 1, 1]
        assert not {tuple(u) for u in heads} & set(d)


def test_attention_is_the_unpadded_pattern_at_the_context_token(tiny):
    pairs = make_pairs(tiny, _set(), "counterfactual")
    att = context_attention(tiny, pairs, [[0, 1], [1, 2]])
    for r, (text, t) in enumerate(zip(pairs.present, pairs.token.tolist())):
        ids = tiny.tokenizer(text, return_tensors="pt").input_ids
        p = _patterns(tiny, ids)[0]                                          # [L, H, T, T]
        key = ids[0].tolist().index(t)
        torch.testing.assert_close(att.weights[r], torch.stack([p[0, 1, -1, key], p[1, 2, -1, key]]), atol=1e-5,
                                   rtol=1e-5)
        if r == 0:   # the found heads' full patterns on the example prompt, labelled with its tokens
            assert att.example == text and att.tokens == tiny.tokenizer.convert_ids_to_tokens(ids[0].tolist())
            torch.testing.assert_close(att.patterns, torch.stack([p[0, 1], p[1, 2]]), atol=1e-5, rtol=1e-5)
    assert set(att.summary()) >= {"found", "random", "mean_found", "mean_random"}
    fig = att.plot(kind="pattern")
    assert [a.text for a in fig.layout.annotations] == ["L0H1", "L1H2"] and len(fig.data) == 2
    with pytest.raises(ValueError, match="'bars' or 'pattern'"):
        att.plot(kind="heatmap")


def test_study_end_to_end_and_round_trip(organism, tmp_path):
    st = entrainment_study(organism, _set(), FAST)
    s = st.summary()
    assert s["sweep"]["chosen"] == 0.03 and [x["sparsity"] for x in s["sweep"]["sweep"]] == [0.003, 0.03]
    assert 1 <= len(st.sweep.heads) <= 2
    ab = st.ablation
    # nothing zeroed reproduces the effect stage; zeroing the found heads changes the gain
    torch.testing.assert_close(ab.gain_clean, st.effect.kinds["counterfactual"].logit_gain)
    assert not torch.allclose(ab.gain_found, ab.gain_clean)
    assert ab.gain_random.shape == (2, len(ab.gain_clean)) and ab.correct_random.shape == (2, 6)
    for d in ab.random_heads:
        assert sorted(la for la, _ in d) == sorted(la for la, _ in ab.heads)
    a = s["ablation"]["drop_found_minus_random"]
    assert a["lo"] <= a["mean"] <= a["hi"]
    assert "counterfactual_entrains_more" in s["effect"]["counterfactual_vs_factual"]
    for stage in ("effect", "sweep", "ablation", "attention", "pattern"):
        assert st.plot(stage) is not None
    assert len(st.plot("pattern").data) == len(st.sweep.heads)
    assert st.pattern_figure(organism) is not None
    st.save(tmp_path / "st")
    back = EntrainmentStudy.load(tmp_path / "st")
    assert back.summary() == s
    torch.testing.assert_close(back.attention.patterns, st.attention.patterns)   # the pattern figure from a bundle
    assert isinstance(interp.bundle.load(tmp_path / "st").effect, EntrainmentEffect)
    with pytest.raises(FileExistsError):
        st.save(tmp_path / "st")


def test_mean_interval_reads_the_bootstrap():
    from interp.evals.bootstrap import mean_interval

    flat = mean_interval(torch.full((10,), 2.0), n_boot=100)
    assert flat == {"mean": 2.0, "lo": 2.0, "hi": 2.0, "p": 0.01}              # p floored at 1 / n_boot
    neg = mean_interval(-torch.arange(1.0, 11.0), n_boot=500, seed=1)
    assert neg["hi"] < 0 and neg["p"] == 1.0 and neg["lo"] <= neg["mean"] <= neg["hi"]
