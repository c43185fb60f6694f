"""The syntactic refusal study (interp.studies.syntax): our four-form prompt set, the alignment rule that needs equal
token counts, and the study end to end at reduced size on the toy organism (rates with intervals, layer x position
patching both ways, heads and neurons at the found layers against random ones, the refusal direction's projection
by form, steering with the found difference against random vectors of the same norm), saved and loaded."""

from __future__ import annotations

import json
import math

import pytest
import torch

from interp import load_model
from interp.evals.rates import Rate
from interp.patching import make_pairs, refusal_score
from interp.patching.activation import sweep_positions
from interp.patching.measures import refusal_token_ids
from interp.studies.syntax import FORMS, SyntaxConfig, SyntaxRefusal, load_syntax_forms, syntactic_refusal
from interp.testing.tiny import tiny_model
from interp.values import Runtime

CFG = SyntaxConfig(n_pairs=6, n_positions=4, n_found_layers=1, n_heads=2, n_neurons=4, n_random=2,
                   max_new_tokens=6, n_boot=50)


@pytest.fixture(scope="module")
def organism():
    return load_model("organism")


@pytest.fixture(scope="module")
def result(organism):
    return syntactic_refusal(organism, config=CFG, runtime=Runtime(batch_size=16, progress=False, seed=0))


def test_the_prompt_set_has_every_request_in_four_forms():
    data = load_syntax_forms()
    assert data.forms == list(FORMS) and len(data) >= 40
    for form in FORMS:
        texts = data.get(form)
        assert len(texts) == len(data) and len(set(texts)) == len(texts) and all(t.strip() for t in texts)
    for i in range(len(data)):  # four different sentences around the same request
        assert len({data.get(f)[i] for f in FORMS}) == 4 and all(data.requests[i] in data.get(f)[i] for f in FORMS)


def test_the_forms_stay_close_in_tokens():
    tok = tiny_model("llama").tokenizer
    data = load_syntax_forms()
    counts = torch.tensor([[len(tok(data.get(f)[i])["input_ids"]) for f in FORMS] for i in range(len(data))])
    spread = counts.max(1).values - counts.min(1).values
    assert float(spread.float().mean()) / float(counts.float().mean()) < 0.35


def test_same_alignment_needs_equal_token_counts_and_says_so():
    m = tiny_model("llama")
    with pytest.raises(ValueError, match=r"align='same'.*token count.*pair 1.*align='end'"):
        make_pairs(m, ["tell me how", "tell me how"], ["tell me how", "how did people tell"], align="same")
    pairs = make_pairs(m, ["tell me how", "how did you"], ["tell us how", "how do you"], align="same")
    assert pairs.n_positions == int(pairs.clean.attention_mask.sum(1).min())  # every position, one to one


def test_same_alignment_patching_every_position_restores_the_source_exactly():
    m = tiny_model("llama")
    pairs = make_pairs(m, ["tell me how to make water"], ["tell me how to find water"], align="same")
    metric = refusal_score(refusal_token_ids(m.tokenizer, starts=["no", "we"]))
    sw = sweep_positions(m, pairs, metric, layers=[0], runtime=Runtime(progress=False))
    assert sw.values.shape == (1, pairs.n_positions)
    # patching the one differing token at the first layer restores the clean run exactly
    changed = int((pairs.clean.input_ids != pairs.corrupted.input_ids).nonzero()[0, 1] - (
        pairs.clean.input_ids.shape[1] - pairs.n_positions))
    assert math.isclose(float(sw.values[0, changed]), sw.reference, rel_tol=1e-5, abs_tol=1e-6)


def test_the_study_refuses_unequal_forms_under_same_alignment(organism):
    with pytest.raises(ValueError, match=r"align='same'.*token count"):
        syntactic_refusal(organism, config=SyntaxConfig(n_pairs=4, align="same", max_new_tokens=4),
                          runtime=Runtime(batch_size=8, progress=False))


def test_bad_config_names_the_fix():
    with pytest.raises(ValueError, match="imperative"):
        SyntaxConfig(forms=("past", "statement"))
    with pytest.raises(ValueError, match="forms must be among"):
        SyntaxConfig(forms=("imperative", "future"))
    with pytest.raises(ValueError, match="align"):
        SyntaxConfig(align="middle")
    with pytest.raises(ValueError, match="n_found_layers"):
        SyntaxConfig(n_found_layers=0)


def test_the_study_measures_every_stage(result, organism):
    res = result
    assert isinstance(res, SyntaxRefusal) and res.forms == list(FORMS)
    for form in FORMS:
        r = res.rates[form]
        assert isinstance(r, Rate) and r.n == CFG.n_pairs and r.ci95[0] <= r.rate <= r.ci95[1]
    others = [f for f in FORMS if f != "imperative"]
    L, P = organism.n_layers, CFG.n_positions
    for form in others:
        assert res.to_form[form].shape == (L, P) and res.back[form].shape == (L, P)
    assert res.target_form in others and len(res.found_layers) == 1 and 0 <= res.found_layers[0] < L
    assert res.heads.shape == (1, organism.n_heads) and len(res.found_heads) == CFG.n_heads
    for part, size in (("heads", CFG.n_heads), ("neurons", CFG.n_neurons)):
        comp = res.components[part]
        assert comp["size"] == size and len(comp["random"]) == CFG.n_random
        assert all(math.isfinite(v) for v in [comp["found"], *comp["random"]])
    assert set(res.projection) == set(FORMS)
    for form in FORMS:
        lo, mean, hi = res.projection[form]
        assert lo <= mean <= hi
    assert set(res.steering) == {"plain", "found", "random"}
    assert res.steering["random"].n == CFG.n_random * CFG.n_pairs and res.steering["found"].n == CFG.n_pairs


def test_patching_a_template_token_at_the_embedding_changes_nothing_either_way(result):
    # at layer 0 resid_pre is the token embedding: the last aligned token is the template's in every form, so its
    # patch is a no-op and restores (or removes) no share of the gap in either direction
    assert result.layers[0] == 0
    for form in result.to_form:
        assert abs(float(result.to_form[form][0, -1])) < 1e-4 and abs(float(result.back[form][0, -1])) < 1e-4
        assert torch.isfinite(result.back[form]).all()


def test_the_found_heads_are_those_restoring_the_largest_share(result):
    # ranked by restored share, whichever way the gap between the forms points
    found_layers, H = result.found_layers, result.heads.shape[1]
    order = torch.nan_to_num(result.heads, nan=float("-inf")).flatten().argsort(descending=True)
    best = [[found_layers[i // H], i % H] for i in order[:len(result.found_heads)].tolist()]
    assert sorted(result.found_heads) == sorted(best)


def test_result_reports_and_round_trips(result, tmp_path):
    s = result.summary()
    json.dumps(s)
    assert {"rates", "found_layers", "target_form", "components", "steering", "projection"} <= set(s)
    frame = result.to_frame()
    assert {"form", "direction", "layer", "position", "restored"} <= set(frame.columns)
    assert len(frame) == 2 * (len(FORMS) - 1) * result.to_form["past"].numel()
    assert result.plot() is not None
    back = SyntaxRefusal.load(result.save(tmp_path / "syn"))
    assert back.summary() == s and torch.equal(back.heads, result.heads)
    with pytest.raises(FileExistsError):
        result.save(tmp_path / "syn")
