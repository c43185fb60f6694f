"""Refusal retention across languages (interp.studies.multilingual): the geometry against hand computations on
activations built with a known structure, the capture against a plain HF forward, the study end to end on a tiny
model (rates, controls, report, judge swap), the multilingual judge, and bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch

import interp
from interp.evals.judge_languages import is_refusal_multilingual
from interp.prompts import read_parallel
from interp.studies.multilingual import (
    RetentionConfig,
    load_parallel_safety,
    refusal_retention,
    retention_page,
    write_retention,
)
from interp.studies.multilingual.data import DEFAULT_FILE
from interp.studies.multilingual.geometry import capture_last, geometry
from interp.values import Runtime


def _acts(n: int = 40, L: int = 3, d: int = 16, seed: int = 0) -> tuple[dict, torch.Tensor]:
    """Harmful = noise + r, harmless = noise, in English; French keeps half of r, German none, and each language
    adds its own offset (what centring removes)."""
    g = torch.Generator().manual_seed(seed)
    r = torch.zeros(L, d, dtype=torch.float64)
    r[:, 0] = 8.0
    keep = {"en": 1.0, "fr": 0.5, "de": 0.0}
    acts: dict = {}
    for kind in ("harmful", "harmless"):
        acts[kind] = {}
        for split in ("train", "val", "test"):
            base = torch.randn(n, L, d, generator=g, dtype=torch.float64)
            acts[kind][split] = {}
            for i, (lang, k) in enumerate(keep.items()):
                offset = torch.zeros(d, dtype=torch.float64)
                offset[1 + i] = 3.0
                noise = 0.1 * torch.randn(n, L, d, generator=g, dtype=torch.float64)
                acts[kind][split][lang] = base + noise + offset + (k * r if kind == "harmful" else 0)
    return acts, r


def test_projection_ratio_and_auroc_equal_a_direct_computation():
    acts, _ = _acts()
    geo = geometry(acts, [0, 1, 2], "en", n_boot=50, runtime=Runtime(seed=0))
    tr, te = acts["harmful"]["train"], acts["harmless"]["train"]
    for layer in range(3):
        r = tr["en"][:, layer].mean(0) - te["en"][:, layer].mean(0)
        r = r / r.norm()
        gap = {lang: float((acts["harmful"]["test"][lang][:, layer] @ r).mean()
                           - (acts["harmless"]["test"][lang][:, layer] @ r).mean()) for lang in ("en", "fr", "de")}
        for lang in gap:
            assert float(geo.ratio[lang][layer]) == pytest.approx(gap[lang] / gap["en"], abs=1e-12)
        assert torch.allclose(geo.direction[layer].double(), r, atol=1e-6)
    assert torch.allclose(geo.ratio["en"], torch.ones(3, dtype=torch.float64))
    assert (geo.ratio["fr"] - 0.5).abs().max() < 0.1 and geo.ratio["de"].abs().max() < 0.1
    for lang in ("fr", "de"):  # the bootstrap interval covers the estimate and random directions sit near zero
        lo, hi = geo.ratio_ci[lang]
        assert bool(((lo <= geo.ratio[lang]) & (geo.ratio[lang] <= hi)).all())
    assert geo.random_ratio["fr"].max() < 0.3
    assert bool((geo.transfer_auroc["en"] == 1).all()) and float(geo.transfer_auroc["fr"].min()) > 0.99
    assert float(geo.transfer_auroc["de"].max()) < 0.8


def test_own_direction_cosines_and_drift():
    acts, _ = _acts()
    geo = geometry(acts, [0, 1, 2], "en", n_boot=50, runtime=Runtime(seed=0))
    assert torch.allclose(geo.own_cosine["en"], torch.ones(3, dtype=torch.float64))
    assert float(geo.own_cosine["fr"].min()) > 0.9   # French holds the same direction, half as long
    assert float(geo.own_cosine["de"].abs().max()) < 0.6  # German holds none of it: noise only
    assert float(geo.split_half_cosine.min()) > 0.9
    assert geo.random_cosine == pytest.approx(math.sqrt(2 / (math.pi * 16)))
    # centring removes each language's offset: a prompt is nearest its own translation; the language that keeps
    # half of the refusal component drifts less than the one that keeps none
    for lang in ("fr", "de"):
        assert bool((geo.drift_matched[lang] > 0.5).all()) and bool((geo.drift_mismatched[lang].abs() < 0.2).all())
    assert bool((geo.drift_matched["fr"] > geo.drift_matched["de"]).all())


def test_capture_last_equals_plain_hf_hidden_states(tiny_models):
    model = tiny_models("llama")
    data = load_parallel_safety(n=3, langs=("en", "fr"))
    acts = capture_last(model, data, [0, 1], kinds=("harmful",), splits=("test",))
    from interp.chat import format_prompts

    for lang in ("en", "fr"):
        texts = format_prompts(model, data.get("harmful", "test", lang))
        for i, text in enumerate(texts):
            ids = model.tokenizer(text, add_special_tokens=False, return_tensors="pt")
            if ids.input_ids[0, 0] != model.tokenizer.bos_token_id:
                ids = model.tokenizer(text, return_tensors="pt")
            with torch.no_grad():
                hs = model.hf(**ids, output_hidden_states=True).hidden_states
            for j, layer in enumerate((0, 1)):
                assert torch.allclose(acts["harmful"]["test"][lang][i, j].float(), hs[layer][0, -1], atol=1e-5)


def test_study_end_to_end_on_a_tiny_model(tiny_models, tmp_path):
    model = tiny_models("llama")
    data = load_parallel_safety(n=4, langs=("en", "fr", "zh"))
    res = refusal_retention(model, data, RetentionConfig(max_new_tokens=4, n_boot=20))
    assert len(res.rates) == 3 * 4 and {r["condition"] for r in res.rates} == {"baseline", "ablation", "random ablation"}
    assert all(0 <= r["low"] <= r["rate"] <= r["high"] <= 1 and r["n"] == 4 for r in res.rates)
    assert len(res.generations) == 3 * 4 * 4
    assert res.layer in res.geometry.layers and res.layer_choice["rule"].startswith("max Cohen")
    # a random tiny model refuses nothing: every language is reported as a null
    assert len(res.notes) == 3 and all("null" in n for n in res.notes)
    frame = res.to_frame()
    assert len(frame) == 3 * (model.n_layers - 1) and frame.projection_ratio.notna().all()
    assert "transfer" in res.report() and "LEACE" in res.report() and res.language.rank == 2
    path = write_retention(res, tmp_path / "ret")
    rec = json.loads((tmp_path / "ret" / "retention.json").read_text())
    assert rec["layer"] == res.layer and len(rec["rates"]) == 12 and "<h1>" in path.read_text()
    with pytest.raises(FileExistsError, match="overwrite"):
        write_retention(res, tmp_path / "ret")
    always = refusal_retention(model, data, RetentionConfig(max_new_tokens=2, n_boot=5, layer=1),
                               judge=lambda text: True)
    assert all(r["rate"] == 1 for r in always.rates) and always.layer == 1 and always.transfer() == {
        "en": 1.0, "fr": 1.0, "zh": 1.0}
    assert "Refusal retention" in retention_page(always)


def test_parallel_set_aligned_by_id_and_splits_disjoint():
    data = load_parallel_safety()
    sizes = data.sizes()
    assert sizes["harmful/test"] >= 25 and sizes["harmless/test"] >= 25 and sizes["harmful/train"] >= 70
    by = read_parallel(DEFAULT_FILE, kind="harmful", split="test")
    assert set(by) == {"en", "fr", "de", "es", "zh"} and len({len(v) for v in by.values()}) == 1
    tr = set(data.get("harmful", "train", "en"))
    assert not tr & set(data.get("harmful", "test", "en")) and not tr & set(data.get("harmful", "val", "en"))


def test_multilingual_judge():
    refusals = ["Je ne peux pas vous aider avec cela.", "Désolé, mais je ne peux pas fournir ces informations.",
                "Ich kann dir dabei nicht helfen.", "Es tut mir leid, aber ich kann das nicht tun.",
                "No puedo ayudarte con eso.", "Lo siento, pero no puedo ayudar con eso.", "我不能帮助你做这件事。",
                "抱歉，我无法提供这些信息。", "I'm sorry, but I can't help with that.", "**Je refuse** de répondre."]
    answers = ["Voici une recette simple : mélangez la farine.", "Je ne peux pas m'empêcher de rire.",
               "Ich kann es kaum erwarten, loszulegen!", "No puedo esperar a verte.", "当然，这是一个简单的食谱。",
               "Désolé pour le retard. Voici la réponse : 42.", "Lo siento por la confusión. La respuesta es sí.",
               "Leider regnet es heute; nimm einen Schirm mit.", "Sure. Note: I cannot guarantee the yield.",
               "Pour faire du pain, je ne peux pas assez insister sur le temps de repos."]
    assert all(is_refusal_multilingual(t) for t in refusals)
    assert not any(is_refusal_multilingual(t) for t in answers)
    with pytest.raises(TypeError, match="str"):
        is_refusal_multilingual(["list"])


def test_bad_input(tiny_models):
    model = tiny_models("llama")
    data = load_parallel_safety(n=2, langs=("en", "fr"))
    with pytest.raises(ValueError, match="ablate_positions"):
        refusal_retention(model, data, RetentionConfig(ablate_positions="every"))
    with pytest.raises(ValueError, match="add it to layers"):
        refusal_retention(model, data, RetentionConfig(layers=(0,), layer=1))
    with pytest.raises(ValueError, match="choose another layer"):
        refusal_retention(model, data, RetentionConfig(layers=(0, 1), layer=0))
    with pytest.raises(ValueError, match="compare a source language"):
        load_parallel_safety(langs=("en",))
    with pytest.raises(ValueError, match="languages present"):
        load_parallel_safety(langs=("en", "xx"))
    with pytest.raises(ValueError, match="n must be"):
        load_parallel_safety(n=1)
    with pytest.raises(KeyError, match="languages"):
        data.get("harmful", "test", "de")


def test_language_geometry_identity_overlap_and_erasure():
    from interp.studies.multilingual.geometry import geometry as geo_fn
    from interp.studies.multilingual.language import language_geometry

    acts, _ = _acts()
    lg = language_geometry(acts, [0, 1, 2], "en", n_boot=20, runtime=Runtime(seed=0))
    assert lg.rank == 2 and lg.chance == pytest.approx(1 / 3) and lg.random_overlap == pytest.approx(2 / 16)
    assert float(lg.identity_accuracy.min()) > 0.8          # each language's offset names it (chance 1/3)
    # the overlap is the squared norm of the unit refusal direction's projection on the language subspace
    h, s = acts["harmful"]["train"], acts["harmless"]["train"]
    for layer in range(3):
        r = h["en"][:, layer].mean(0) - s["en"][:, layer].mean(0)
        r = r / r.norm()
        mu = {lang: torch.cat([h[lang][:, layer], s[lang][:, layer]]).mean(0) for lang in ("en", "fr", "de")}
        Q = torch.linalg.qr(torch.stack([mu["fr"] - mu["en"], mu["de"] - mu["en"]]).T).Q
        assert float(lg.overlap[layer]) == pytest.approx(float((Q.T @ r).pow(2).sum()), abs=1e-9)
    before = geo_fn(acts, [0, 1, 2], "en", n_boot=5)
    for lang in ("en", "fr", "de"):
        assert torch.allclose(lg.ratio["before"][lang], before.ratio[lang])
    # erasing language: the French harmful/harmless signal stays (it lies on the refusal axis, not the language
    # offsets), and a random rank-2 erasure barely moves it
    assert (lg.ratio["leace"]["fr"] - lg.ratio["before"]["fr"]).abs().max() < 0.15
    assert (lg.ratio["random"]["fr"] - lg.ratio["before"]["fr"]).abs().max() < 0.15
    assert len(lg.to_frame()) == 9
    s = lg.summary()
    json.dumps(s, allow_nan=True)   # JSON-ready
    assert s["identity_accuracy"] == float(lg.identity_accuracy.max()) and s["rank"] == 2
    assert s["ratio_mean"]["leace"]["fr"] == pytest.approx(float(lg.ratio["leace"]["fr"].mean()))
    with pytest.raises(ValueError, match="source language"):
        language_geometry(acts, [0, 1, 2], "es")


def test_safety_neurons_on_a_tiny_model_match_zeroed_weights(tiny_models):
    import copy

    from interp.forward import batch_of, last_logits
    from interp.patching.measures import call_metric, refusal_score
    from interp.studies.multilingual.neurons import refusal_ids, safety_neurons

    model = tiny_models("llama")
    data = load_parallel_safety(n=4, langs=("en", "fr"))
    res = safety_neurons(model, data, k=3, n_candidates=6, n_random=3)
    assert all(len(s) == 3 for s in res.sets.values()) and res.chance_pairwise == pytest.approx(9 / (2 * model.d_mlp))
    assert {k for k, _ in res.effects} >= {"en", "fr"} and len(res.random[("en", "fr")]) == 3
    # oracle: ablating the French set equals zeroing those columns of each down projection
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for layer, i in res.sets["fr"]:
            twin.blocks[layer].mlp.down_proj.weight[:, i] = 0
    batch = batch_of(twin, data.get("harmful", "test", "en"))
    metric = refusal_score(refusal_ids(model))
    with torch.no_grad():
        direct = float(call_metric(metric, last_logits(twin, batch))) - res.baseline["en"]
    assert res.effects[("fr", "en")] == pytest.approx(direct, abs=1e-5)
    assert len(res.to_frame()) == len(res.effects)
    assert res.summary()["effects"]["fr on en"]["delta"] == pytest.approx(direct, abs=1e-5)
    with pytest.raises(ValueError, match="n_candidates"):
        safety_neurons(model, data, k=5, n_candidates=2)


def test_pathways_patch_the_post_instruction_tokens(tiny_models):
    from interp.studies.multilingual.pathways import SITES, post_instruction_tokens, refusal_pathways

    model = tiny_models("llama")
    data = load_parallel_safety(n=3, langs=("en", "fr"))
    k = post_instruction_tokens(model)
    assert k >= 1
    res = refusal_pathways(model, data, runtime=Runtime(batch_size=8))
    assert res.restored["fr"].shape == (model.n_layers, len(SITES)) and res.n_pairs == 3 and res.n_positions == k
    assert len(res.to_frame()) == model.n_layers * len(SITES)
    gap = res.source_score["fr"] - res.target_score["fr"]
    assert abs(gap) > 1e-6 and torch.isfinite(res.restored["fr"]).all()
    # layer 0's input at the post-instruction tokens is their embedding, the same template tokens in both
    # languages: patching it changes nothing (an exact zero), while later layers carry the prompt's content
    assert float(res.restored["fr"][0, 0].abs()) < 1e-6 and float(res.control["fr"][0, 0].abs()) < 1e-6
    assert float(res.restored["fr"][1:].abs().max()) > 1e-4
    # pairs are patched one at a time (for the intervals): the shares equal one batched sweep of all pairs
    from interp.patching.measures import refusal_score as score
    from interp.studies.multilingual.neurons import refusal_ids
    from interp.studies.multilingual.pathways import _patched

    src, tgt = data.get("harmful", "test", "en"), data.get("harmful", "test", "fr")
    vals, s, t = _patched(model, src, tgt, score(refusal_ids(model)), k, list(range(model.n_layers)), 64)
    torch.testing.assert_close(res.restored["fr"], (vals - t) / (s - t), atol=1e-4, rtol=1e-4)
    ci = res.intervals["fr"]
    assert res.n_boot == 1000 and set(ci) == {"restored", "control", "excess"}
    row = res.to_frame().iloc[4]   # layer 1, attn_out
    assert row["restored_lo"] <= row["restored"] + 1e-6 and row["restored"] <= row["restored_hi"] + 1e-6
    assert row["excess"] == pytest.approx(row["restored"] - row["control"])
    assert not refusal_pathways(model, data, n_boot=0, runtime=Runtime(batch_size=8)).intervals
    s = res.summary()
    json.dumps(s, allow_nan=True)   # JSON-ready
    assert s["gap"]["fr"] == pytest.approx(gap) and len(s["top_components"]) == 3 and s["n_pairs"] == 3


def test_sae_features_by_language_on_a_tiny_model(tiny_models):
    from interp.evals.judge_languages import detect_language
    from interp.studies.multilingual.features import features_by_language

    model = tiny_models("llama")
    data = load_parallel_safety(n=4, langs=("en", "fr"), kinds=("harmful", "harmless"))
    res = features_by_language(model, data, layer=1, top=4, max_new_tokens=3)
    assert res.d_sae == 4 * model.d_model and all(len(v) == 4 for v in res.features.values())
    assert 0 <= res.sae_quality["fvu"] < 1.5 and res.sae_quality["tokens"] > 50
    assert res.shared[("en", "fr")] == len(set(res.features["en"]) & set(res.features["fr"]))
    assert res.chance_shared == pytest.approx(16 / res.d_sae)
    assert [r["condition"] for r in res.rows] == ["baseline", "ablate own features", "ablate random features"] * 2
    assert all(0 <= r["low"] <= r["rate"] <= r["high"] <= 1 for r in res.rows)
    assert [detect_language(t) for t in ("The cat is on the mat and it is fine.", "Le chat est sur la table et "
                                         "il est là pour vous.", "我不能帮助你。", "ok")] == ["en", "fr", "zh", "unknown"]


def test_massive_dimensions_are_left_out_and_degenerate_answers_flagged():
    from interp.evals.judge_languages import is_degenerate
    from interp.studies.multilingual.retention import massive_dims, without

    acts, _ = _acts()
    for kind in acts:
        for split in acts[kind]:
            for lang in acts[kind][split]:
                acts[kind][split][lang][..., 5] += 1e4       # a massive activation on every prompt
    assert massive_dims(acts, 20.0) == [5] and massive_dims(acts, None) == []
    v = without(torch.ones(16), [5])
    assert float(v[5]) == 0 and float(v.norm()) == pytest.approx(1.0)
    assert is_degenerate("thethethethethethethethethethethethethethethethethe") and is_degenerate(" ... ")
    assert is_degenerate("a a a a a a a a a a a a a a a a a a a a a a")
    assert not is_degenerate("I'm sorry, but I can't help with that.") and not is_degenerate(
        "La bombe tuyau est une bombe à gaz qui est utilisée pour fabriquer des")


def test_judged_rates_shares_one_generation_over_its_groups(tiny_models):
    """Groups share one generation call: each group's row counts its own answers, its records keep its labels and
    prompts in order, and the answers are those of one plain call on the concatenated prompts."""
    import steering
    from interp.studies.multilingual.retention import judged_rates

    model = tiny_models("llama")
    a, b = ["one two", "three four five"], ["six", "seven eight", "nine ten eleven twelve"]
    judge = lambda t: len(t) % 2 == 0  # noqa: E731  (any deterministic str -> bool)
    rows, recs = judged_rates(model, [({"g": "a"}, a), ({"g": "b"}, b)], (), judge, 4, Runtime(batch_size=2))
    texts = list(steering.generate(model, a + b, max_new_tokens=4,
                                   runtime=interp.Runtime(batch_size=2, progress=False)).texts)
    assert [r["text"] for r in recs] == texts and [r["prompt"] for r in recs] == a + b
    assert [r["g"] for r in recs] == ["a"] * 2 + ["b"] * 3
    assert [(r["g"], r["n"]) for r in rows] == [("a", 2), ("b", 3)]
    assert [r["k"] for r in rows] == [sum(map(judge, texts[:2])), sum(map(judge, texts[2:]))]
    assert judged_rates(model, [], (), judge, 4, Runtime(batch_size=2)) == ([], [])
