"""The refusal circuit study on the toy organism: graphs of refused prompts with the refusal direction as target,
features ranked by summed influence, the promoting ones ablated against layer-matched random features."""

from __future__ import annotations

import json

import pytest
import torch

from interp.models import load_model
from interp.patching import ReplacementModel
from interp.studies.circuits import CircuitConfig, refusal_circuit
from interp.studies.kit.config import DataConfig
from interp.studies.kit.prompt_sets import load_refusal_data
from interp.studies.kit.stages import find_candidates
from sae.train_config import TrainConfig
from sae.transcoder_train import train_transcoder


@pytest.fixture(scope="module")
def setup():
    m = load_model("organism")
    data = load_refusal_data("organism", DataConfig(n_train=64, n_val=8, n_test=16))
    train = data.harmful["train"].instructions + data.harmless["train"].instructions
    tcs = train_transcoder(m, train, cfg=TrainConfig(arch="topk", d_sae=128, k=16, total_tokens=25_600,
                                                       batch_size=256, lr=3e-3, progress=False),
                           sinks="exclude").transcoders
    r = find_candidates(m, data, layers=[2]).raw[0, -1]
    return ReplacementModel(m, tcs), data, r


@pytest.fixture(scope="module")
def study(setup):
    rm, data, r = setup
    return refusal_circuit(rm, data.harmful["val"].instructions[:4], r, 2, data.harmful["test"].instructions,
                           config=CircuitConfig(n_features=10, n_random=2, max_new_tokens=8))


def test_features_are_ranked_by_influence_summed_over_the_graphs(study):
    rows = study.features
    assert [x["influence"] for x in rows] == sorted((x["influence"] for x in rows), reverse=True)
    la, f = rows[0]["layer"], rows[0]["feature"]
    by_hand = sum(float(g.node_influence[i]) for g in study.graphs for i, x in enumerate(g.features.tolist())
                  if (x[0], x[2]) == (la, f))
    assert rows[0]["influence"] == pytest.approx(by_hand, rel=1e-9)
    assert all(x["layer"] < 2 for x in rows)           # only earlier layers write into resid_pre.2
    chosen = [x for x in rows if x["chosen"]]
    assert len(chosen) == 10 and all(x["direct"] > 0 for x in chosen)
    assert chosen == [x for x in rows if x["direct"] > 0][:10]


def test_ablation_is_tested_against_layer_matched_random_features(study, setup):
    rates = {r["condition"]: r for r in study.rates}
    top = rates["top 10 features ablated"]["features"]
    for i in range(2):
        rand = rates[f"random features ablated (draw {i})"]["features"]
        assert not set(rand) & set(top)
        assert sorted(x.split("f")[0] for x in rand) == sorted(x.split("f")[0] for x in top)
    assert rates["no ablation"]["rate"] >= 0.9
    assert 0.0 <= study.test["fisher_p_random_refuses_more"] <= 1.0
    assert study.plot().data and "top refusal features" in study.page(0)
    s = study.summary()
    json.dumps(s, allow_nan=True)   # JSON-ready
    assert s["rates"]["no ablation"] == {k: rates["no ablation"][k] for k in ("rate", "k", "n")} | {
        "ci95": list(rates["no ablation"]["ci95"])}
    assert s["fisher_p_random_refuses_more"] == study.test["fisher_p_random_refuses_more"]
    assert s["top"] == top and s["n_graphs"] == 4 and len(s["rates"]) == 4


def test_rank_by_direct_chooses_the_largest_direct_writers(setup):
    rm, data, r = setup
    st = refusal_circuit(rm, data.harmful["val"].instructions[:2], r, 2, data.harmful["test"].instructions[:4],
                         config=CircuitConfig(n_features=5, n_random=1, max_new_tokens=4, rank_by="direct"))
    chosen = [x for x in st.features if x["chosen"]]
    assert sorted(x["direct"] for x in chosen) == sorted(x["direct"] for x in st.features)[-5:]
    with pytest.raises(ValueError, match="rank_by"):
        refusal_circuit(rm, ["x"], r, 2, ["y"], config=CircuitConfig(rank_by="magic"))


def test_post_instruction_ranks_only_the_nodes_at_the_post_instruction_tokens(setup):
    rm, data, r = setup
    prompts = data.harmful["val"].instructions[:2]
    st = refusal_circuit(rm, prompts, r, 2, data.harmful["test"].instructions[:4],
                         config=CircuitConfig(n_features=3, n_random=1, max_new_tokens=4, positions="post_instruction"))
    post = [set(rm.batch(p).post_mask[0].nonzero().flatten().tolist()) for p in prompts]
    assert all(0 < len(x) < g.n_positions for x, g in zip(post, st.graphs))    # a strict subset of the prompt
    by_hand: dict[tuple[int, int], float] = {}
    for g, keep in zip(st.graphs, post):
        for i, (la, pos, f) in enumerate(g.features.tolist()):
            if pos in keep and la < 2:
                by_hand[la, f] = by_hand.get((la, f), 0.0) + float(g.node_influence[i])
    assert {(x["layer"], x["feature"]): x["influence"] for x in st.features} == pytest.approx(by_hand, rel=1e-9)
    everywhere = {(x["layer"], x["feature"]) for x in refusal_circuit(rm, prompts, r, 2, ["y"],
        config=CircuitConfig(n_features=3, n_random=0, max_new_tokens=1)).features}
    assert set(by_hand) < everywhere                      # fewer features than at every position
    rand = next(x for x in st.rates if x["condition"].startswith("random"))["features"]
    assert {tuple(int(v) for v in x[1:].split("f")) for x in rand} <= set(by_hand)
    assert st.meta["positions"] == "post_instruction"
    with pytest.raises(ValueError, match="post_instruction"):
        refusal_circuit(rm, ["x"], r, 2, ["y"], config=CircuitConfig(positions="last"))


def test_bad_input(setup):
    rm, data, r = setup
    with pytest.raises(ValueError, match="d_model"):
        refusal_circuit(rm, ["x"], torch.zeros(7), 2, ["y"])
    with pytest.raises(ValueError, match="layer 0"):
        refusal_circuit(rm, ["x"], r, 0, ["y"])
    with pytest.raises(ValueError, match="at least one"):
        refusal_circuit(rm, [], r, 2, ["y"])
