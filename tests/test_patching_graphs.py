"""Replacement model, attribution graphs and the interventions that test them, on tiny seeded models.

Oracles: the plain HF forward (replacement logits), forward differences in the linearised model (every edge), the
graph's own bookkeeping identity (edges into a row sum to its value minus its constant part), and the real
model's forward with the decoder edit (interventions)."""

from __future__ import annotations

import json

import pytest
import torch

import interp
from interp.forward import forward
from interp.patching import GraphConfig, ReplacementModel, attribution_graph
from interp.patching.graph_edits import DecoderEdit, FeatureEdit, intervene
from interp.patching.graph_result import AttributionGraph, normalized_abs
from interp.patching.graph_targets import LogitDiff, Projection, TopLogits
from interp.testing.tiny import tiny_model
from sae.transcoder import Transcoder, TranscoderConfig

IDS = [1, 20, 31, 42, 55, 60, 77]


def _transcoders(model, d_sae: int = 24, skip: tuple[int, ...] = (1,), dtype: str = "float32", seed: int = 0):
    out = []
    for layer in range(model.n_layers):
        tc = Transcoder(TranscoderConfig(d_in=model.d_model, d_sae=d_sae, arch="relu", layer=layer, dtype=dtype,
                                         skip=layer in skip), seed=seed + layer)
        g = torch.Generator().manual_seed(100 + layer)
        with torch.no_grad():  # about half the latents active; predictions of the MLP output's scale
            tc.W_enc.mul_(3.0)
            tc.W_dec.mul_(0.05)
            tc.b_enc.copy_(0.5 * torch.randn(d_sae, generator=g))
            tc.b_dec.copy_(0.1 * torch.randn(model.d_model, generator=g))
            if tc.W_skip is not None:
                tc.W_skip.copy_(0.05 * torch.randn(model.d_model, model.d_model, generator=g))
        out.append(tc)
    return out


def _rm(family: str = "llama", dtype: torch.dtype = torch.float64, **kw) -> ReplacementModel:
    model = tiny_model(family, dtype=dtype)
    return ReplacementModel(model, _transcoders(model, dtype=str(dtype).split(".")[1], **kw))


@pytest.fixture(scope="module")
def llama64():
    return _rm("llama")


@pytest.fixture(scope="module")
def graph64(llama64):
    return attribution_graph(llama64, IDS, runtime=interp.Runtime(batch_size=16, progress=False))


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_replacement_logits_equal_the_real_model(family):
    rm = _rm(family, torch.float32)
    run = rm.run(IDS)
    real = forward(rm.model, run.batch)[0]
    assert (run.logits - real).abs().max() < 1e-5
    assert all(float(e.abs().max()) > 1e-3 for e in run.errors.values())       # the error nodes carry the gap
    assert 0.2 < float(torch.cat([(a > 0).float().flatten() for a in run.acts.values()]).mean()) < 0.8
    linear = rm.linear(run)["logits"][0]                                           # the frozen model, same inputs
    assert (linear - real).abs().max() < 1e-4


def _column_oracle(rm, run, g: AttributionGraph, sources: list[int]) -> torch.Tensor:
    """Forward differences in the linearised model: nudge each source node (one batch row each) and read every
    feature pre-activation and target; the change per unit of the source's value is its column of edges."""
    k, eps = len(sources), 0.5
    acts = {L: run.acts[L][None].repeat(k, 1, 1) for L in run.acts}
    errs = {L: run.errors[L][None].repeat(k, 1, 1) for L in run.errors}
    emb = run.embed[None].repeat(k, 1, 1)
    for b, s in enumerate(sources):
        if s < g.n_features:
            L, p, f = g.features[s].tolist()
            acts[L][b, p, f] *= 1 + eps
        elif s < g.token_offset:
            L, p = divmod(s - g.error_offset, g.n_positions)
            errs[L][b, p] *= 1 + eps
        else:
            emb[b, s - g.token_offset] *= 1 + eps
    sites = sorted(set(g.target_sites))
    base, hit = rm.linear(run, read=sites), rm.linear(run, acts, errs, emb, batch=k, read=sites)

    def rows(st, b):
        feats = [st["mlp_in"][L][b, p] @ rm.transcoders[L].W_enc[:, f] for L, p, f in g.features.tolist()]
        tgts = [(st["sites"][s][b, pos] @ v) for s, pos, v in zip(g.target_sites, g.target_positions, g.target_vectors)]
        return torch.stack(feats + tgts)

    return torch.stack([(rows(hit, b) - rows(base, 0)) / eps for b in range(k)], 1)


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_every_edge_equals_a_forward_difference_in_the_linearised_model(family, llama64, graph64):
    rm = llama64 if family == "llama" else _rm("gemma2")
    g = graph64 if family == "llama" else attribution_graph(rm, IDS, LogitDiff(20, 31))
    run = rm.run(IDS)
    gen = torch.Generator().manual_seed(0)
    feats = torch.randperm(g.n_features, generator=gen)[:6].tolist()
    errors = [g.error_node(0, 3), g.error_node(1, g.n_positions - 1)]
    sources = feats + errors + [g.token_node(0), g.token_node(g.n_positions - 1)]
    rows = torch.cat([torch.arange(g.n_features), torch.arange(g.target_offset, g.n_nodes)])
    oracle = _column_oracle(rm, run, g, sources)
    got = g.adjacency[rows][:, sources]
    assert oracle.abs().max() > 1e-3                                           # the columns are not all zero
    assert (got - oracle).abs().max() < 1e-8


def test_edges_into_each_row_sum_to_its_value_minus_its_constant_part(llama64, graph64):
    g = graph64
    assert g.completeness() < 1e-9
    assert float(g.rest.abs().max()) == 0.0                                     # no budget: every feature a node
    real = forward(llama64.model, llama64.run(IDS).batch)[0, -1].double()
    top = real.topk(g.n_targets).indices                                        # TopLogits: logit - mean logit
    assert torch.allclose(g.values[g.target_offset:], real[top] - real.mean(), atol=1e-5)
    assert float(g.bias[g.target_offset:].abs().max()) > 0                      # b_dec reaches the logits
    small = attribution_graph(llama64, IDS, config=GraphConfig(max_feature_nodes=10))
    assert small.n_features == 10 and small.n_active == g.n_active
    assert float(small.rest.abs().max()) > 0 and small.completeness() < 1e-9
    assert torch.allclose(small.values[small.target_offset:], g.values[g.target_offset:])
    # one ranking round (budget < batch size): the features with the largest direct influence on the targets
    direct = g.target_weights @ normalized_abs(g.adjacency[g.target_offset:].double())[:, :g.n_features]
    assert set(map(tuple, small.features.tolist())) == set(map(tuple, g.features[direct.topk(10).indices].tolist()))



def test_constant_positions_and_explicit_logit_tokens(llama64, graph64):
    """``constant_positions=1`` (circuit-tracer's BOS convention): no feature nodes at position 0, its error nodes
    zero, its MLP outputs in the bias; every other edge as in the full graph. ``TopLogits(tokens=)`` in order."""
    g = graph64
    top = llama64.run(IDS).logits[-1].double().softmax(-1).topk(3).indices.tolist()
    c = attribution_graph(llama64, IDS, TopLogits(tokens=top[::-1]), config=GraphConfig(constant_positions=1))
    assert int(c.features[:, 1].min()) == 1 and c.completeness() < 1e-9
    W = llama64.model.hf.lm_head.weight.double()
    assert torch.allclose(c.target_vectors, W[top[::-1]] - W.mean(0))
    keep = (g.features[:, 1] >= 1).nonzero()[:, 0]
    assert torch.equal(c.features, g.features[keep])
    errs = [c.error_node(L, 0) for L in range(c.n_layers)]
    assert float(c.adjacency[:, errs].abs().max()) == 0.0
    full = attribution_graph(llama64, IDS, TopLogits(tokens=top[::-1]))
    nodes = torch.cat([keep, torch.arange(full.n_features, full.n_nodes)])
    sub = full.adjacency[nodes][:, nodes]
    sub[:, errs] = 0.0
    assert (c.adjacency - sub).abs().max() < 1e-12
    assert float((c.bias - full.bias[nodes]).abs().max()) > 1e-4                 # position 0 moved into the bias
    one = attribution_graph(llama64, IDS, TopLogits(tokens=top[0]))
    assert one.n_targets == 1 and torch.allclose(one.target_vectors[0], W[top[0]] - W.mean(0))
    with pytest.raises(ValueError, match="at least one token"):
        attribution_graph(llama64, IDS, TopLogits(tokens=[]))
    with pytest.raises(ValueError, match="constant_positions"):
        attribution_graph(llama64, IDS, config=GraphConfig(constant_positions=7))


def test_pruning_tables_files_and_figure(graph64, tmp_path):
    g = graph64
    infl = g.node_influence
    assert (infl >= -1e-12).all() and float(infl[g.target_offset:].abs().max()) == 0.0
    assert g.node_mask[g.token_offset:].all()
    feats = g.node_mask[:g.n_features]
    assert 0 < int(feats.sum()) < g.n_features
    full = AttributionGraph.load(g.save(tmp_path / "g")).prune(1.0, 1.0)
    assert torch.equal(full.adjacency, g.adjacency) and full.target_labels == g.target_labels
    assert int(full.node_mask[:g.n_features].sum()) >= int(feats.sum())
    nodes, edges = g.to_frame(), g.to_frame("edges")
    assert len(nodes) == int(g.node_mask.sum()) and set(nodes["kind"]) >= {"feature", "token", "target"}
    assert len(edges) == int((g.edge_mask & (g.adjacency != 0)).sum())
    all_edges = g.to_frame("edges", pruned=False)
    assert len(all_edges) == int((g.adjacency != 0).sum()) > len(edges)
    import interp.bundle

    assert isinstance(interp.bundle.load(tmp_path / "g"), AttributionGraph)
    fig = g.plot()
    assert len(fig.data[0].z) == g.n_layers + 1
    s = g.summary()
    json.dumps(s, allow_nan=True)   # JSON-ready
    assert (s["n_feature_nodes"], s["n_kept"]) == (g.n_features, int(feats.sum()))
    assert s["n_edges_kept"] == int(g.edge_mask.sum()) and s["targets"] == g.target_labels
    top = int(infl[:g.n_features].argmax())
    assert s["top_features"][0] == [*g.features[top].tolist(), pytest.approx(float(infl[top]))]
    err = float(infl[g.error_offset:g.token_offset].sum()) / float(infl[:g.target_offset].sum())
    assert s["error_share"] == pytest.approx(err) and 0 <= s["error_share"] <= 1
    assert s["completeness"] == g.completeness()


def test_direction_and_logit_diff_targets_read_the_residual(llama64):
    v = torch.randn(64, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    g = attribution_graph(llama64, IDS, [Projection(v, "resid_post.0", position=-2), LogitDiff(20, 31)])
    st = {}
    from interp.hooking import hooks

    with hooks(llama64.model, {"resid_post.0": lambda x, ctx: st.__setitem__("x", x.clone())}):
        real = forward(llama64.model, llama64.run(IDS).batch)[0, -1].double()
    assert abs(float(g.values[g.target_offset]) - float(st["x"][0, -2].double() @ v)) < 1e-5
    assert abs(float(g.values[g.target_offset + 1]) - float(real[20] - real[31])) < 1e-5
    layer1 = g.features[:, 0] == 1                                              # layer 1 cannot reach resid_post.0
    assert float(g.adjacency[g.target_offset, :g.n_features][layer1].abs().max()) == 0.0
    assert g.completeness() < 1e-9


def test_interventions_match_the_graph_and_run_in_the_real_model(llama64, graph64):
    g = graph64
    ranked = g.adjacency[g.target_offset, :g.n_features].abs().argsort(descending=True).tolist()
    last = next(i for i in ranked if int(g.features[i, 0]) == 1)
    first = next(i for i in ranked if int(g.features[i, 0]) == 0)
    e_last, e_first = FeatureEdit(*g.features[last].tolist()), FeatureEdit(*g.features[first].tolist(), scale=2.0)
    lin = intervene(llama64, g, [e_last, e_first], "linear")
    assert (lin.delta - lin.predicted).abs().max() < 1e-9 and lin.delta.abs().max() > 1e-4
    # nothing downstream re-encodes; the edited feature itself is re-encoded from an input that HF's float32 norm
    # arithmetic (inside this float64 model) puts ~1e-7 from the frozen one
    frozen = intervene(llama64, g, e_last, "replacement", freeze=True)
    assert (frozen.delta - frozen.predicted).abs().max() < 1e-6
    rep, real = intervene(llama64, g, e_last, "replacement"), intervene(llama64, g, e_last, "real")
    assert (rep.delta - real.delta).abs().max() < 1e-8                          # same write, same downstream model
    assert (rep.delta - rep.predicted).abs().max() < 0.5 * rep.predicted.abs().max() + 1e-6
    both = intervene(llama64, g, [e_first], "real")
    assert torch.isfinite(both.delta).all() and both.delta.abs().max() > 0
    assert list(both.to_frame().columns) == ["target", "before", "after", "delta", "predicted", "mode"]


def test_the_decoder_edit_composes_with_steering_apply(llama64, graph64):
    import steering
    from interp.hooking import count_hooks, hooks

    g, rm = graph64, llama64
    L, p, f = g.features[0].tolist()                                            # a layer-0 feature
    run = rm.run(IDS)
    a, w = run.acts[L][p, f], rm.transcoders[L].W_dec[f]

    def by_hand(x, ctx):                                                         # its input is upstream of the edit
        x = x.clone()
        x[:, p] += (0.5 - a) * w
        return x

    with hooks(rm.model, {f"mlp_module_out.{L}": by_hand}):
        want = forward(rm.model, run.batch)[0]
    with steering.apply(rm.model, DecoderEdit(rm, [FeatureEdit(L, p, f, value=0.5)])):
        got = forward(rm.model, run.batch)[0]
    assert (got - want).abs().max() < 1e-10 and (got - run.logits).abs().max() > 1e-6
    assert count_hooks(rm.model.hf, ours_only=True) == 0


def test_bad_input_gets_a_clear_error(llama64, graph64):
    model = llama64.model
    with pytest.raises(ValueError, match="outside the prompt's 7 tokens"):
        intervene(llama64, graph64, FeatureEdit(0, 99, 0))
    with pytest.raises(ValueError, match="features 0..23"):
        intervene(llama64, graph64, FeatureEdit(0, 1, 24))
    with pytest.raises(ValueError, match="mode must be"):
        intervene(llama64, graph64, FeatureEdit(0, 1, 2), mode="total")
    with pytest.raises(ValueError, match="d_model=64"):
        wide = tiny_model("llama", d_model=32)
        ReplacementModel(model, _transcoders(wide))
    other = _transcoders(model, dtype="float64")
    other[0].cfg.model_id = "some-other-model"
    with pytest.raises(ValueError, match="trained on 'some-other-model'"):
        ReplacementModel(model, other)
    with pytest.raises(ValueError, match=r"no transcoder for layers \[1\]"):
        ReplacementModel(model, _transcoders(model, dtype="float64")[:1])
    with pytest.raises(ValueError, match="max_positions=4"):
        attribution_graph(llama64, IDS, config=GraphConfig(max_positions=4))
    with pytest.raises(ValueError, match="width 64"):
        attribution_graph(llama64, IDS, Projection(torch.ones(32), "resid_post.1"))
    with pytest.raises(ValueError, match="residual stream"):
        attribution_graph(llama64, IDS, Projection(torch.ones(64), "attn_z.1"))
    with pytest.raises(ValueError, match="one token"):
        attribution_graph(llama64, IDS, LogitDiff("the boy", 31))
    with pytest.raises(TypeError, match="TopLogits"):
        attribution_graph(llama64, IDS, "logits")
    with pytest.raises(ValueError, match="prob"):
        attribution_graph(llama64, IDS, TopLogits(prob=0.0))
    gpt2 = tiny_model("gpt2")
    with pytest.raises(ValueError, match="q_proj"):
        ReplacementModel(gpt2, _transcoders(gpt2))


def test_graph_page_starts_at_the_graphs_own_pruning(graph64, tmp_path):
    """The page holds every node and edge of the graph, with the graph's influence and edge scores; drawn in
    headless Chromium at the graph's thresholds it shows what ``viz.graph_page.prune`` keeps."""
    import json
    import re

    from interp.viz.graph_page import prune

    f = graph64.features[0].tolist()
    html = graph64.page(contexts={(f[0], f[2]): ["a <b> context"]}, supernodes={"pair": [tuple(f)]})
    blob = json.loads(re.search(r"id='graph-data'>(.*?)</script>", html, re.S).group(1).replace("<\\/", "</"))
    assert len(blob["nodes"]) == graph64.n_nodes and len(blob["edges"]) == int((graph64.adjacency != 0).sum())
    first = blob["nodes"][0]
    assert first["contexts"] == ["a <b> context"] and first["influence"] == pytest.approx(
        float(graph64.node_influence[0]))
    shown, kept = prune(blob["nodes"], blob["edges"], graph64.node_threshold, graph64.edge_threshold)
    kept_nodes = {f"n{i}" for i in graph64.node_mask.nonzero().flatten().tolist()}
    assert kept_nodes <= shown      # here the page's single pass (no re-pruning) keeps the graph's nodes and more
    from tests.test_viz_graph_page import _drawn

    n, e, _ = _drawn(html, "")
    assert (n, e) == (len(shown), len(kept))
