"""Refusal by writer: the direction ablated from attention, MLP (routed / shared experts), embedding, or all writers.

Identities on tiny dense and mixture-of-experts models (projection is linear per writer, so the groups together
are DirectionalAblation, and routed + shared experts are the MLP); the stage in the refusal job on the organism.
"""

from __future__ import annotations

import json

import pytest
import torch

import steering
from interp.forward import prepare
from interp.hooking import hooks
from interp.studies.kit.config import DataConfig, GenerationConfig
from interp.studies.kit.scoring import prompt_logits
from interp.studies.refusal import RefusalConfig, RefusalTokens, load_refusal_data, run_refusal
from interp.studies.refusal.evaluation import TestPrompts as Prompts  # not a test class
from interp.studies.refusal.writers import Writers, identity_checks, writer_attribution, writer_groups
from interp.testing.tiny import tiny_model
from interp.values import Runtime

PROMPTS = ["the man said to the boy", "what is the good word", "help", "where is the old house by the water now ?"]
DENSE = ["attention", "MLP", "embedding", "all writers"]
GROUPS = {"llama": DENSE, "gpt2": DENSE, "gemma2": DENSE,
          "mixtral": ["attention", "MLP", "routed experts", "embedding", "all writers"],
          "qwen2_moe": ["attention", "MLP", "routed experts", "shared expert", "embedding", "all writers"]}


def _unit(m, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(m.d_model, generator=g), dim=0)


def _logits(m, encs, groups, names, r):
    return prompt_logits(m, encs, *[iv for g in names for iv in groups[g][1](r)])


@pytest.mark.parametrize("family", sorted(GROUPS))
def test_writer_groups_add_up_to_directional_ablation(tiny_models, family):
    """attention + MLP + embedding (each ablated alone, applied together) == DirectionalAblation in logits; for a
    mixture of experts, routed + shared experts == the MLP group; each group alone changes the logits."""
    m = tiny_models(family)
    _, encs = prepare(m, PROMPTS)
    r = _unit(m)
    groups, notes = writer_groups(m)
    assert list(groups) == GROUPS[family] and not notes
    full = prompt_logits(m, encs, steering.DirectionalAblation(r))
    torch.testing.assert_close(_logits(m, encs, groups, ["attention", "MLP", "embedding"], r), full, atol=1e-5, rtol=0)
    torch.testing.assert_close(_logits(m, encs, groups, ["all writers"], r), full, atol=0, rtol=0)
    base = prompt_logits(m, encs)
    for g in groups:
        assert (_logits(m, encs, groups, [g], r) - base).abs().max() > 1e-3, g
    if m.spec.is_moe:
        parts = [g for g in ("routed experts", "shared expert") if g in groups]
        mlp = _logits(m, encs, groups, ["MLP"], r)
        torch.testing.assert_close(_logits(m, encs, groups, parts, r), mlp, atol=1e-5, rtol=0)
    if family == "qwen2_moe":  # the shared expert matters: routed alone is not the MLP group
        assert (_logits(m, encs, groups, ["routed experts"], r) - mlp).abs().max() > 1e-3


def test_routed_part_is_the_block_output_minus_the_gated_shared_expert(tiny_models):
    """After ablating r from the routed experts only, the MoE block's output minus its gated shared expert has no r
    component, and the shared expert's output is untouched."""
    m = tiny_models("qwen2_moe")
    r = _unit(m, 1)
    ids = torch.tensor([prepare(m, [PROMPTS[3]])[1][0].ids])
    seen: dict[str, torch.Tensor] = {}

    def keep(name):
        return lambda x, ctx: seen.__setitem__(name, x.clone())

    gate = m.module("mlp.shared_expert_gate", 1)
    with steering.apply(m, steering.Ablate(r, sites="experts_out", layers=1)), \
            hooks(m, {"mlp_out.1": keep("mlp"), "shared_expert_out.1": keep("shared"), "resid_mid.1": keep("mid")}):
        with torch.no_grad():
            m.hf(ids)
    normed = m.module("post_attention_layernorm", 1)(seen["mid"])
    routed = seen["mlp"] - torch.sigmoid(gate(normed)) * seen["shared"]
    assert (routed @ r).abs().max() < 1e-5
    assert (seen["shared"] @ r).abs().max() > 1e-3


@pytest.mark.parametrize("family,writer,kind", [("qwen2_moe", "experts", "experts_out"),
                                               ("qwen2_moe", "shared_expert", "shared_expert_out"),
                                               ("mixtral", "experts", "experts_out")])
def test_moe_site_ablation_equals_baked_weights(tiny_models, family, writer, kind):
    """An independent route: r projected out of the routed experts' (or the shared expert's) down-projection
    weights by steering.bake gives the logits of the hook ablation at the new site."""
    m = tiny_models(family)
    _, encs = prepare(m, PROMPTS)
    r = _unit(m, 2)
    baked = steering.bake(m, r, writers=(writer,))
    torch.testing.assert_close(prompt_logits(baked.model, encs), prompt_logits(m, encs, steering.Ablate(r, sites=kind)),
                               atol=1e-5, rtol=0)


def test_moe_with_a_dense_layer(tmp_path):
    """A MoE model whose layer 1 is a dense MLP: routed / shared cover layer 0, a note says so, the identities hold
    (the dense layer's MLP added to routed + shared); writer_attribution runs end to end."""
    m = tiny_model("qwen2_moe", mlp_only_layers=[1])  # the spec is checked on block 0: keep it MoE
    groups, notes = writer_groups(m)
    assert "layer 0" in groups["routed experts"][0] and any("layer 1" in n and "dense" in n for n in notes)
    data = load_refusal_data("organism", DataConfig(n_train=8, n_val=4, n_test=4))
    test = Prompts(m, data)
    checks = identity_checks(m, test, _unit(m))
    assert len(checks) == 2 and max(checks.values()) < 1e-5, checks
    w = writer_attribution(m, test, _unit(m), RefusalTokens([5], ["x"], 1.0, 0.0),
                           config=RefusalConfig(generation=GenerationConfig(max_new_tokens=2)),
                           runtime=Runtime(batch_size=64, seed=3))
    assert w.groups == GROUPS["qwen2_moe"] and len(w.rows) == 1 + 2 * len(w.groups)
    assert all(r["n"] == 4 and r["ci95"][0] <= r["rate"] <= r["ci95"][1] for r in w.rows)
    assert "seed 3" in w.control and "no positional embedding" in w.embedding
    assert len(w.plot().data) == 2


@pytest.mark.parametrize("family", ["qwen2_moe", "llama"])
def test_stacked_conditions_equal_generating_each_alone(family):
    """The writer rows with the conditions generated 4 to a batch (steering.generate_each, as the job runs them)
    equal those generated one condition at a time, also through the routed experts' site (flattened tokens)."""
    m = tiny_model(family, **({"mlp_only_layers": [1]} if family == "qwen2_moe" else {}))
    data = load_refusal_data("organism", DataConfig(n_train=8, n_val=4, n_test=6))
    toks = RefusalTokens([5], ["x"], 1.0, 0.0)
    three = RefusalConfig(generation=GenerationConfig(max_new_tokens=3))
    one, stacked = (writer_attribution(m, Prompts(m, data, stack=k), _unit(m), toks, config=three,
                                       runtime=Runtime(batch_size=4)) for k in (1, 4))
    plain = [{k: v for k, v in row.items() if k != "score"} for row in one.rows]
    assert [{k: v for k, v in row.items() if k != "score"} for row in stacked.rows] == plain
    assert [row["score"] for row in stacked.rows] == pytest.approx([row["score"] for row in one.rows], abs=1e-4)


def test_bad_input():
    m = tiny_model("llama")
    test = Prompts(m, load_refusal_data("organism", DataConfig(n_train=8, n_val=4, n_test=4)))
    toks = RefusalTokens([5], ["x"], 1.0, 0.0)
    with pytest.raises(ValueError, match="unit vector"):
        writer_attribution(m, test, 3 * _unit(m), toks)
    with pytest.raises(ValueError, match="width 64"):
        writer_attribution(m, test, _unit(m)[:10], toks)
    with pytest.raises(ValueError, match="never refused"):
        writer_attribution(m, test, _unit(m), RefusalTokens([], [], 0.0, 0.0))
    gpt2 = tiny_model("gpt2")
    from interp.studies.refusal.writers import embedding_note

    assert "transformer.wpe" in embedding_note(gpt2)
    from interp.viz.refusal import writer_bars

    with pytest.raises(ValueError, match="one rate"):
        writer_bars(["a", "b"], ([0.1], [0.0], [0.2]), ([0.1], None, None))


@pytest.fixture(scope="module")
def organism_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("writers") / "run"
    return run_refusal(RefusalConfig.from_flat(model="organism", n_test=32, subspace_rank=1), out)


def test_organism_refusal_by_writer(organism_run):
    """The organism (direction at layer 2): ablating r from all writers cuts refusal, every orthogonal control
    leaves it; the groups' identity holds on the organism; the table reaches metrics.json, the report, the cache."""
    res = organism_run
    assert res.found and res.selection.layer == 2
    w: Writers = res.writers
    base = w.row("baseline")
    assert base["n"] == 32 and base["rate"] >= 0.9
    assert w.row("all writers")["rate"] < base["rate"] - 0.3
    assert w.row("all writers")["score"] < base["score"] - 3
    for g in w.groups:
        assert abs(w.row(g, "orthogonal control")["rate"] - base["rate"]) <= 0.1, g
    assert max(w.checks.values()) < 1e-4, w.checks
    m = json.loads((res.out / "metrics.json").read_text())
    assert m["writers"]["rows"] == w.rows
    html = (res.out / "report.html").read_text()
    assert "Refusal by writer" in html and "resid_pre of layer 0" in html and "orthogonal control" in html
    again = run_refusal(RefusalConfig.from_flat(model="organism", n_test=32, subspace_rank=1), res.out)
    assert "writers" not in again.computed and again.writers.rows == w.rows
