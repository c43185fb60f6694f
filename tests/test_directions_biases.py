"""Cue-induced bias directions (issue 14 item 2): prompt sets, probing with its baselines, LODO, the causal test,
overlap (principal angles against scipy) and checkpoint comparison, on tiny random models from configs."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from interp.studies.directions.biases import BiasConfig, bias_directions, choose_bias_layer
from interp.studies.directions.biases_causal import (
    answer_table,
    bias_causal_test,
    choose_options,
    flip_counts,
)
from interp.studies.directions.biases_compare import compare_checkpoints
from interp.studies.directions.biases_items import BIASES, load_bias_items, make_items
from interp.testing.tiny import tiny_model
from probes.subspace import principal_angles
from probes.validation import ProbeScores

LABELS = ("1", "2", "3", "4")


@pytest.fixture(scope="module")
def model():
    """A tiny Llama with a wide init: its forced-choice answers depend on the prompt, so some cues flip them."""
    return tiny_model("llama", initializer_range=0.2)


@pytest.fixture(scope="module")
def items():
    return make_items(["suggested", "bandwagon"], n_arithmetic=20, n_facts=20, letters=LABELS)


@pytest.fixture(scope="module")
def family(model, items):
    return bias_directions(model, items)


def _chat_ids(model, prompt: str) -> torch.Tensor:
    text = model.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                               add_generation_prompt=True)
    return torch.tensor([model.tokenizer.encode(text, add_special_tokens=False)])


def _hf_answer(model, prompt: str, hooks=()) -> int:
    """Oracle: plain HF forward of one unpadded prompt, argmax of the option labels' logits."""
    ids = [model.tokenizer.convert_tokens_to_ids(x) for x in LABELS]
    handles = [model.hf.model.layers[layer].register_forward_hook(fn) for layer, fn in hooks]
    try:
        with torch.no_grad():
            lg = model.hf(_chat_ids(model, prompt)).logits[0, -1]
    finally:
        for h in handles:
            h.remove()
    return int(lg[ids].argmax())


def test_items_are_deterministic_and_committed():
    committed = load_bias_items()
    assert committed == make_items()                                       # the generator rebuilds the file
    for bias in BIASES:
        its = [i for i in committed if i.bias == bias]
        assert len(its) >= 300 and {i.source for i in its} == {"arithmetic", "facts"}
        for i in its[:50]:
            assert i.cued_option != i.correct and i.correct in i.letters and i.uncued != i.cued
            if i.source == "arithmetic":                                   # the right option is the sum
                a, op, b = i.question.removeprefix("What is ").rstrip("?").split()
                want = {"plus": int(a) + int(b), "minus": int(a) - int(b), "times": int(a) * int(b)}[op]
                assert i.options[i.letters.index(i.correct)] == str(want)
    plain = [i for i in committed if i.bias in ("suggested", "authority")]
    assert len({i.uncued for i in plain}) == len(plain) // 2              # the cue-only biases share uncued prompts
    pos = next(i for i in committed if i.bias == "position")
    assert pos.cued.count(f"Answer: {pos.cued_option}") == 3 and f"Answer: {pos.cued_option}" not in pos.uncued
    with pytest.raises(ValueError, match="unknown bias"):
        make_items(["sycophancy"])
    with pytest.raises(ValueError, match="no items of bias"):
        load_bias_items(biases=["nope"])


def test_principal_angles_match_scipy():
    from scipy.linalg import subspace_angles

    g = torch.Generator().manual_seed(0)
    for ka, kb in ((3, 2), (2, 4), (1, 1), (4, 4)):
        A = torch.randn(ka, 24, generator=g, dtype=torch.float64)
        B = torch.randn(kb, 24, generator=g, dtype=torch.float64)
        B[0] = A[0] + 1e-6 * B[0]                                          # one tiny angle: the sine branch
        ref = np.sort(subspace_angles(A.T.numpy(), B.T.numpy()))
        np.testing.assert_allclose(principal_angles(A, B).numpy(), ref, atol=1e-7)
    batch = torch.randn(3, 2, 24, generator=g, dtype=torch.float64)
    other = torch.randn(3, 2, 24, generator=g, dtype=torch.float64)
    got = principal_angles(batch, other)
    for i in range(3):
        np.testing.assert_allclose(got[i].numpy(), np.sort(subspace_angles(batch[i].T.numpy(), other[i].T.numpy())),
                                   atol=1e-7)
    with pytest.raises(ValueError, match="widths"):
        principal_angles(torch.randn(2, 8), torch.randn(2, 9))


def test_family_scores_and_direction_against_hf(model, items, family):
    assert family.biases == ["suggested", "bandwagon"]
    p = family.probes["suggested"]
    assert p.auroc.shape == (model.n_layers,) and p.lodo.shape == (2, model.n_layers)
    assert p.auroc.min() > 0.9 and p.lexically_separable                    # a cue sentence: the words give it away
    assert abs(float(p.control_auroc.mean()) - 0.5) < 0.25                  # shuffled labels: near chance
    # oracle: block 0 output at the last token from a plain HF forward (the last entry is after the final norm)
    its = [i for i in items if i.bias == "suggested"]
    with torch.no_grad():
        hs = {k: torch.stack([model.hf(_chat_ids(model, getattr(i, k)), output_hidden_states=True).hidden_states[1][0, -1]
                              for i in its]) for k in ("uncued", "cued")}
    ref = hs["cued"].mean(0) - hs["uncued"].mean(0)
    assert torch.nn.functional.cosine_similarity(ref, p.direction.at(0), dim=0) > 0.9999
    df = family.to_frame()
    assert len(df) == 2 * model.n_layers and df["best"].sum() == 2
    for kind in ("auroc", "lodo", "overlap"):
        assert family.plot(kind).data


def test_no_cue_is_a_null_that_does_not_transfer(model, items):
    blank = [dataclasses.replace(i, bias="none", cued=i.uncued) for i in items if i.bias == "suggested"]
    fam = bias_directions(model, blank)
    p = fam.probes["none"]
    assert torch.allclose(p.auroc, torch.full_like(p.auroc, 0.5)) and p.lexical_auroc == pytest.approx(0.5)
    assert p.transfers is False


def test_single_source_lodo_is_refused(model, items):
    one = [i for i in items if i.source == "facts"]
    with pytest.raises(ValueError, match="one source dataset only"):
        bias_directions(model, one)
    fam = bias_directions(model, one, config=BiasConfig(lodo=False))
    assert fam.probes["suggested"].lodo is None and fam.probes["suggested"].transfers is None


def test_layer_choice_never_takes_layer_zero_on_a_tie():
    auc = torch.tensor([[1.0, 1.0, 0.9]] * 2)
    d = torch.tensor([[5.0, 1.0, 0.5]] * 2)                                  # layer 0 would win on Cohen's d
    sc = ProbeScores("logistic", [f"blocks.{i}.hook_resid_post" for i in range(3)], auc, auc, d)
    choice = choose_bias_layer(sc, tol=0.005)
    assert choice.index == 1 and choice.tied == [0, 1] and "never the lowest captured layer" in choice.rule
    alone = ProbeScores("logistic", sc.sites, auc, torch.tensor([[1.0, 0.8, 0.7]] * 2), d)
    assert choose_bias_layer(alone, tol=0.005).index == 0                    # best on its own: layer 0 stands


def test_choose_options_matches_hf(model, items):
    its = items[:12]
    got = choose_options(model, [i.cued for i in its], LABELS)
    assert got.tolist() == [_hf_answer(model, i.cued) for i in its]
    with pytest.raises(ValueError, match="not a single known token"):
        choose_options(model, [its[0].cued], ("A", "B", "C", "D"))


def test_causal_test_against_hooked_hf(model, items, family):
    answers = answer_table(model, items)
    counts = flip_counts(items, answers)
    res = bias_causal_test(model, family, items, "suggested", band=[0, 1], alpha=0.6, answers=answers,
                           config=BiasConfig(n_random=2))
    assert res.n_flipped == counts["suggested"]["to_cued"] > 0
    flipped = [i for i in items if i.id in set(res.flipped_ids)]
    for it in flipped:                                                      # the flip, read from plain HF
        assert _hf_answer(model, it.cued) == LABELS.index(it.cued_option) != _hf_answer(model, it.uncued)
    d = family.direction("suggested")

    def sub(layer):
        v = d.at(layer) / d.at(layer).norm() * res.added_norms[layer]
        return lambda mod, args, out: (out[0] - v, *out[1:]) if isinstance(out, tuple) else out - v

    steered = [_hf_answer(model, it.cued, hooks=[(0, sub(0)), (1, sub(1))]) for it in flipped]
    assert res.recovered == [s == _hf_answer(model, it.uncued) for s, it in zip(steered, flipped, strict=True)]
    assert len(res.random_recovered) == 2 and all(len(r) == res.n_flipped for r in res.random_recovered)
    assert set(res.summary()) >= {"recovery_ci95", "random_ci95", "fisher_p", "null"} and res.plot().data
    zero = bias_causal_test(model, family, items, "suggested", band=[1], alpha=0.0, answers=answers,
                            config=BiasConfig(n_random=1))
    assert not any(zero.recovered) and all(zero.still_cued)                 # no push: nothing recovers
    with pytest.raises(ValueError, match="not captured"):
        bias_causal_test(model, family, items, "suggested", band=[5], answers=answers)
    with pytest.raises(ValueError, match="not in the family"):
        bias_causal_test(model, family, items, "authority", answers=answers)
    # issue 37: one default for chat (True); knobs in config=BiasConfig(...), an old keyword names its new home
    with pytest.raises(TypeError, match=r"n_random= \(moved into config=BiasConfig\(n_random=\.\.\.\)\)"):
        bias_causal_test(model, family, items, "suggested", n_random=2, answers=answers)
    with pytest.raises(TypeError, match=r"chat= \(moved into config=BiasConfig\(chat="):
        answer_table(model, items, chat=False)
    with pytest.raises(TypeError, match=r"chat= \(moved into config=BiasConfig\(chat="):
        bias_directions(model, items, chat=True)
    with pytest.raises(TypeError, match=r"chat= \(moved into prompts=interp.Prompts\(texts, chat="):
        choose_options(model, [items[0].cued], LABELS, chat=False)
    with pytest.raises(ValueError, match="n_random must be >= 1"):
        BiasConfig(n_random=0)


def test_overlap_and_checkpoints(model, items, family):
    ov = family.overlap(layer=1)
    a, b = family.direction("suggested").at(1), family.direction("bandwagon").at(1)
    assert ov.cosine[0, 1] == pytest.approx(float(torch.nn.functional.cosine_similarity(a, b, dim=0)), abs=1e-5)
    assert torch.allclose(ov.cosine.diagonal(), torch.ones(2), atol=1e-5)
    assert ov.angles.shape == (2, 2, 2) and ov.angles[0, 0].abs().max() < 1e-3 and ov.angles[0, 1, 0] > 1
    same = compare_checkpoints(family, family)
    assert torch.allclose(same.cosine, torch.ones_like(same.cosine), atol=1e-5)
    other = tiny_model("llama", seed=1, initializer_range=0.2)
    cmp = compare_checkpoints(family, other, items=items)                  # a family and a model to fit
    assert cmp.cosine.shape == (2, model.n_layers) and cmp.cosine.abs().max() < 0.9   # unrelated weights
    assert len(cmp.to_frame()) == 2 * model.n_layers and cmp.plot().data
    cs = cmp.summary()
    json.dumps(cs, allow_nan=True)   # JSON-ready
    assert cs["cosine_mean"] == {b: pytest.approx(float(cmp.cosine[i].mean())) for i, b in enumerate(cmp.biases)}
    assert cs["same_bias_cross"]["bandwagon"] == pytest.approx(float(cmp.cross[1, 1]))
    assert cs["other_bias_cross_abs"] == pytest.approx(float((cmp.cross[0, 1].abs() + cmp.cross[1, 0].abs()) / 2))
    assert cs["cosine_at_cross_site"] is None or set(cs["cosine_at_cross_site"]) == set(cmp.biases)
    os_ = ov.summary()
    json.dumps(os_, allow_nan=True)   # JSON-ready
    assert os_["cosine"] == {"suggested/bandwagon": pytest.approx(float(ov.cosine[0, 1]))}
    assert os_["smallest_angle_deg"]["suggested/bandwagon"] == pytest.approx(float(ov.angles[0, 1, 0]))
    assert os_["max_abs_cosine"] == pytest.approx(abs(float(ov.cosine[0, 1]))) and os_["chance"] == ov.chance
    top = bias_directions(model, items, layers=[model.n_layers - 1])             # a model beside a one-layer family
    assert compare_checkpoints(top, other, items=items).sites == top.sites
    with pytest.raises(ValueError, match="the families differ"):
        compare_checkpoints(family, dataclasses.replace(family, probes={"suggested": family.probes["suggested"]}))
    with pytest.raises(ValueError, match="pass items"):
        compare_checkpoints(family, other)
