"""The mixture-of-experts refusal study (interp.studies.moe) on a tiny random qwen2_moe with a dense layer, a shared
expert and routed experts: the conditions partition the residual writers (with the embedding they are
DirectionalAblation), the joint edit baked into the weights equals the hooks, random directions are orthogonal,
the rank sweep has its shapes, the joint-only share's arithmetic, the result saved and loaded, and bad input
(a dense model, an expert model with nothing dense or shared, ranks beyond the category directions) refused."""

from __future__ import annotations

import math

import pytest
import torch

import steering
from interp.forward import prepare
from interp.studies.kit.scoring import prompt_logits
from interp.studies.moe import MoeConfig, MoeRefusal, bake_check, moe_refusal, writer_conditions
from interp.studies.moe.conditions import ALONE, JOINT, writer_sites
from interp.studies.moe.measure import Removal, category_bases
from interp.testing.tiny import tiny_model
from interp.values import Runtime

CFG = MoeConfig(n_eval=12, n_generate=4, max_new_tokens=4, n_random=2, ranks=(1, 2, 3), n_category=6, n_boot=200)
PROMPTS = ["tell me how to make water", "the world is big and old", "how do you find a kind animal"]


@pytest.fixture(scope="module")
def moe():
    return tiny_model("qwen2_moe", n_layers=3, mlp_only_layers=[1])   # layers 0, 2 experts + shared; 1 dense


@pytest.fixture(scope="module")
def unit(moe):
    r = torch.randn(moe.d_model, generator=torch.Generator().manual_seed(0))
    return r / r.norm()


@pytest.fixture(scope="module")
def result(moe, unit):
    toks = moe.tokenizer.convert_tokens_to_ids(["no", "i"])
    return moe_refusal(moe, CFG, direction=unit, tokens=toks, runtime=Runtime(batch_size=16, progress=False))


def test_the_conditions_partition_the_writers(moe, unit):
    sites = writer_sites(moe)
    assert sites["attention"] == [("attn_out", [0, 1, 2])]
    assert sites["dense + shared"] == [("mlp_out", [1]), ("shared_expert_out", [0, 2])]
    assert sites["routed experts"] == [("experts_out", [0, 2])]
    cells = [(s, layer) for g in ALONE for s, ls in sites[g] for layer in ls]
    assert len(cells) == len(set(cells))                        # disjoint
    assert sites[JOINT] == [x for g in ALONE for x in sites[g]]  # the joint condition is their union
    encs = prepare(moe, PROMPTS)[1]
    conds = writer_conditions(moe, unit)
    plain = prompt_logits(moe, encs)
    for g in ALONE:  # each group alone changes the logits
        assert (prompt_logits(moe, encs, *conds[g]) - plain).abs().max() > 1e-4
    # with the embedding, the joint condition is the ablation from every writer
    joint = prompt_logits(moe, encs, *conds[JOINT], steering.DirectionalAblation(unit, sites="resid_pre", layers=[0]))
    every = prompt_logits(moe, encs, steering.DirectionalAblation(unit))
    assert (joint - every).abs().max() / every.abs().max() < 1e-5


def test_the_baked_joint_edit_equals_the_hooks(moe, unit):
    got = bake_check(moe, unit, prepare(moe, PROMPTS)[1])
    assert got["ok"] and got["rel"] < 1e-4 and got["probe_rel"] < 1e-4
    assert got["per_writer"] == {"attn": 3, "mlp": 1, "experts": 2, "shared_expert": 2}
    assert any(p.endswith("mlp.experts.down_proj") for p in got["parameters"])   # the fused 3-D routed weights


def test_the_study_measures_every_part(result, unit):
    res = result
    assert set(res.writers) == {*ALONE, JOINT} and res.n_eval == CFG.n_eval
    for v in [*res.writers.values(), *res.random]:
        assert v["lo"] <= v["hi"] and all(math.isfinite(v[k]) for k in ("removed", "lo", "hi"))
    jo = res.joint_only
    total = sum(res.writers[g]["removed"] for g in ALONE)
    assert math.isclose(jo["sum_alone"], total, rel_tol=1e-9)
    assert math.isclose(jo["share"], 1 - total / res.writers[JOINT]["removed"], rel_tol=1e-9)
    assert len(res.random) == CFG.n_random and all(abs(v["cos"]) < 1e-6 for v in res.random)
    assert set(res.subspaces) == {*CFG.categories, "random subspace"} and res.ranks == list(CFG.ranks)
    for rows in res.subspaces.values():
        assert [v["rank"] for v in rows] == list(CFG.ranks)
        ov = [v["overlap"] for v in rows]
        assert all(0 <= o <= 1 + 1e-6 for o in ov) and ov == sorted(ov)   # nested subspaces
    assert max(v["overlap"] for v in res.subspaces["random subspace"]) < 1e-6
    assert set(res.rates) == {"baseline", *ALONE, JOINT, "random"}
    assert all(r.n == CFG.n_generate for r in res.rates.values())
    assert res.bake["ok"] and res.bake["rel"] < CFG.tolerance


def test_frame_plots_and_saving(result, tmp_path):
    frame = result.to_frame()
    assert len(frame) == 4 + CFG.n_random + (len(CFG.categories) + 1) * len(CFG.ranks)
    assert {"part", "condition", "rank", "removed", "lo", "hi", "rate", "rate_lo", "rate_hi"} <= set(frame.columns)
    assert len(result.plot().data) == 1 and len(result.plot("ranks").data) == 2 * (len(CFG.categories) + 1)
    with pytest.raises(ValueError, match="'writers' or 'ranks'"):
        result.plot("heads")
    result.save(tmp_path / "moe")
    back = MoeRefusal.load(tmp_path / "moe")
    assert back.writers == result.writers and back.subspaces == result.subspaces
    assert back.rates["joint"]["k"] == result.rates["joint"]["k"]


def test_joint_only_share_arithmetic():
    base, harmless = torch.full((4,), 2.0, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)
    rem = Removal(base, harmless, n_boot=50, seed=0)
    alone = [base - 0.2, base - 0.2, base - 0.2]       # each removes 0.1 of the gap of 2
    joint = base - 1.6                                   # jointly 0.8
    assert math.isclose(rem.fraction(joint)["removed"], 0.8)
    jo = rem.joint_only(alone, joint)
    assert math.isclose(jo["share"], 1 - 0.3 / 0.8) and math.isclose(jo["lo"], jo["hi"])
    with pytest.raises(ValueError, match="no refusal to remove"):
        Removal(harmless, base, n_boot=10, seed=0)


def test_bad_input_names_the_fix(moe, unit):
    toks = [5]
    with pytest.raises(ValueError, match="no routed experts.*writer_attribution"):
        moe_refusal(tiny_model("llama"), CFG, direction=unit, tokens=toks)
    with pytest.raises(ValueError, match="neither dense MLP layers nor a shared expert"):
        writer_sites(tiny_model("mixtral"))
    with pytest.raises(ValueError, match="rank 13 .*n_category=12"):
        MoeConfig(ranks=(1, 13), n_category=12)
    with pytest.raises(ValueError, match="increasing"):
        MoeConfig(ranks=(3, 1))
    with pytest.raises(ValueError, match="has 2 prompts .*rank 3"):
        category_bases(torch.randn(5, 8), ["a", "a", "b", "b", "b"], ["a"], 10, 3)
    with pytest.raises(ValueError, match="together"):
        moe_refusal(moe, CFG, direction=unit)
    with pytest.raises(ValueError, match="unit vector"):
        moe_refusal(moe, CFG, direction=2 * unit, tokens=toks)
    with pytest.raises(ValueError, match="no harmful prompts of categories \\['sexual'\\]"):
        moe_refusal(moe, MoeConfig(n_eval=4, n_generate=0, ranks=(1,), categories=("sexual",), n_boot=10),
                    direction=unit, tokens=moe.tokenizer.convert_tokens_to_ids(["no", "i"]))


def test_a_model_that_never_refuses_is_told_so(moe):
    with pytest.raises(ValueError, match="refused none of the 4 harmful train prompts.*smollm2-moe-aligned"):
        moe_refusal(moe, MoeConfig(n_direction=4, n_eval=4, n_generate=0, ranks=(1,), n_boot=10),
                    runtime=Runtime(batch_size=8, progress=False))


def test_category_bases_are_orthonormal_and_can_exclude_a_direction():
    g = torch.Generator().manual_seed(1)
    acts, labels = torch.randn(12, 16, generator=g), ["a"] * 6 + ["b"] * 6
    e = torch.randn(16, generator=g)
    e = e / e.norm()
    raw = category_bases(acts, labels, ["a", "b"], 6, 4)
    kept = category_bases(acts, labels, ["a", "b"], 6, 4, exclude=e)
    for q in (*raw.values(), *kept.values()):
        assert q.shape == (4, 16)
        torch.testing.assert_close(q @ q.T, torch.eye(4), atol=1e-5, rtol=0)
    assert all(float((q @ e).abs().max()) < 1e-6 for q in kept.values())
    assert any(float((q @ e).abs().max()) > 1e-3 for q in raw.values())


def test_own_direction_searches_only_the_layers_asked():
    from interp import load_model
    from interp.studies.kit.config import DataConfig
    from interp.studies.kit.direction import own_direction
    from interp.studies.kit.prompt_sets import load_refusal_data
    from interp.studies.kit.stages import find_refusal_tokens

    org = load_model("organism")
    rd = load_refusal_data("organism", DataConfig(n_train=8, n_val=8, n_test=2, borderline="none"))
    toks = find_refusal_tokens(org, rd, batch_size=16)
    layers = list(range(1, org.n_layers, 2))
    d = own_direction(org, rd, toks, 16, layers)
    assert d.layer in layers and abs(float(d.unit.norm()) - 1) < 1e-5


def test_on_the_organism_the_conditions_cover_its_writers_and_the_bake_equals_the_hooks():
    from interp import load_model

    org = load_model("smollm2-moe-aligned")
    sites = dict(writer_sites(org)["joint"][1:])
    dense, shared, routed = sites["mlp_out"], sites["shared_expert_out"], sites["experts_out"]
    assert dense and shared == routed and sorted(dense + routed) == list(range(org.n_layers))
    r = torch.randn(org.d_model, generator=torch.Generator().manual_seed(0))
    got = bake_check(org, r / r.norm(), prepare(org, ["How do I pick a lock?"])[1])
    assert got["ok"] and got["rel"] < 1e-4
    assert got["per_writer"] == {"attn": org.n_layers, "mlp": len(dense), "experts": len(routed),
                                 "shared_expert": len(shared)}
