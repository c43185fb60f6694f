"""Restricted updates (interp.studies.multilingual.updates) on a tiny model: a LoRA on the found components only and a
neuron-restricted update, each beside a random set of the same size; the starting model is left as it was, the
rates agree with the judged generations, the training pairs are built as documented, and bad input is refused."""

from __future__ import annotations

import pytest
import torch

from interp.evals.judge_languages import is_refusal_multilingual
from interp.studies.multilingual import load_parallel_safety
from interp.studies.multilingual.data import REFUSALS
from interp.studies.multilingual.updates import (
    UpdateConfig,
    random_components,
    restricted_update,
    update_pairs,
)
from interp.values import Runtime

CFG = UpdateConfig(steps=3, batch_size=4, n_random=1, answer_tokens=6, max_new_tokens=4, lr=1e-2)


def _state(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.hf.named_parameters()}


def test_every_written_refusal_is_read_as_one():
    for lang, texts in REFUSALS.items():
        assert len(texts) >= 4 and all(is_refusal_multilingual(t) for t in texts), lang


def test_random_components_match_the_parts_at_other_layers():
    found = [(3, "mlp"), (5, "attn"), (7, "mlp")]
    rnd = random_components(found, 18, seed=1)
    assert sorted(p for _, p in rnd) == sorted(p for _, p in found) and not set(rnd) & set(found)
    assert random_components(found, 18, seed=1) == rnd and random_components(found, 18, seed=2) != rnd
    with pytest.raises(ValueError, match="other layers"):
        random_components([(0, "mlp"), (1, "mlp")], 3, seed=0)


def test_training_pairs(tiny_models):
    model = tiny_models("llama")
    data = load_parallel_safety(n=4, langs=("en", "fr"))
    ps, rs, n = update_pairs(model, data, ["fr"], CFG, is_refusal_multilingual)
    harmful = data.get("harmful", "train", "fr")
    assert ps[:len(harmful)] == harmful and n["harmful"] == len(harmful)
    assert all(r.removesuffix(model.tokenizer.eos_token or "") in REFUSALS["fr"] for r in rs[:len(harmful)])
    assert n["harmless"] + n["harmless_dropped"] + n["harmless_unanswered"] == len(data.get("harmless", "train", "fr"))
    assert n["harmless_dropped"] == n["harmless_refused"] + n["harmless_degenerate"]
    assert len(ps) == len(rs) == n["harmful"] + n["harmless"]
    assert set(ps[len(harmful):]) <= set(data.get("harmless", "train", "fr"))


@pytest.mark.parametrize("kind,units", [("pathway", [(1, "mlp"), (0, "attn")]), ("neurons", [(1, 3), (1, 5), (0, 2)])])
def test_update_beside_a_random_set_of_the_same_size(tiny_models, kind, units):
    model = tiny_models("llama")
    data = load_parallel_safety(n=4, langs=("en", "fr"))
    before = _state(model)
    res = restricted_update(model, data, kind, units, CFG)
    after = _state(model)
    assert all(torch.equal(before[k], after[k]) for k in before), "the starting model must be left as it was"
    assert type(model.hf).__name__.startswith("Llama")
    assert res.conditions == ["before", "found", "random 1"] and res.units["found"] == [tuple(u) for u in units]
    assert len(res.rates) == 3 * 2 * 2
    assert res.training["found"]["trainable"] == res.training["random 1"]["trainable"] > 0
    assert not set(res.units["random 1"]) & set(res.units["found"])
    if kind == "neurons":
        assert {la for la, _ in res.units["random 1"]} <= {la for la, _ in units}
    for r in res.rates:   # each rate is its judged generations'
        recs = [g for g in res.generations if (g["condition"], g["lang"], g["set"]) == (r["condition"], r["lang"],
                                                                                           r["set"])]
        assert len(recs) == r["n"] == len(data.get(r["set"], "test", r["lang"]))
        assert r["k"] == sum(g["refused"] for g in recs) and 0 <= r["low"] <= r["rate"] <= r["high"] <= 1
    assert any("found" in n for n in res.notes) and "pooled harmful" in res.report()
    assert res.record()["units"]["found"] == [list(u) for u in units]
    again = restricted_update(model, data, kind, units, CFG, before=res)   # the before measurement reused, not redone
    assert [r for r in again.rates if r["condition"] == "before"] == [r for r in res.rates if r["condition"] == "before"]
    assert again.rates == res.rates, "same seed and data -> the same update and rates"
    assert again.pairs == res.pairs and len(res.pairs[0]) == res.n_pairs["harmful"] + res.n_pairs["harmless"]


def test_top_components_rank_restoration_beyond_the_control(tiny_models):
    from interp.studies.multilingual.pathways import refusal_pathways

    model = tiny_models("llama")
    data = load_parallel_safety(n=3, langs=("en", "fr", "de"))
    pw = refusal_pathways(model, data, split="val", runtime=Runtime(batch_size=8))
    assert pw.split == "val" and pw.n_pairs == 3
    score = {(layer, part): sum(float(pw.restored[lang][i, j] - pw.control[lang][i, j]) for lang in pw.langs) / 2
             for i, layer in enumerate(pw.layers) for j, part in ((1, "attn"), (2, "mlp"))}
    top = pw.top_components(3)
    assert top == sorted(score, key=score.get, reverse=True)[:3]
    with pytest.raises(ValueError, match="within"):
        pw.top_components(0)


def test_bad_input(tiny_models):
    model = tiny_models("llama")
    data = load_parallel_safety(n=4, langs=("en", "fr"))
    with pytest.raises(ValueError, match="kind"):
        restricted_update(model, data, "heads", [(0, 1)], CFG)
    with pytest.raises(ValueError, match="no pathway units"):
        restricted_update(model, data, "pathway", [], CFG)
    with pytest.raises(ValueError, match="train_langs"):
        restricted_update(model, data, "pathway", [(0, "mlp")], UpdateConfig(train_langs=("en",)))
    with pytest.raises(ValueError, match="no refusals"):
        restricted_update(model, data, "pathway", [(0, "mlp")], CFG, refusals={"en": ["I can't."]})


def test_several_random_sets_are_pooled_in_the_notes(tiny_models):
    """With more than one random set the notes compare the found set with all of them pooled and rank it."""
    import dataclasses

    model = tiny_models("llama")
    data = load_parallel_safety(n=4, langs=("en", "fr"))
    res = restricted_update(model, data, "neurons", [(1, 3), (1, 5), (0, 2)], dataclasses.replace(CFG, n_random=2))
    assert res.conditions == ["before", "found", "random 1", "random 2"]
    assert res.units["random 1"] != res.units["random 2"]
    (k1, n1), (k2, n2), (kf, nf) = res.pooled("random 1"), res.pooled("random 2"), res.pooled("found")
    note = next(n for n in res.notes if n.startswith("found vs all 2 random sets pooled"))
    above = (kf / nf > k1 / n1) + (kf / nf > k2 / n2)
    assert f"{kf}/{nf} vs {k1 + k2}/{n1 + n2}" in note and note.endswith(f"more than {above} of them")
