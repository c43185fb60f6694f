"""`.plot()` and `.to_frame()` of the patching results (sweeps, attribution, heads, neurons, masks, transplant),
checked against the results' own numbers, with integer layer/position/head/neuron columns that sort numerically."""

from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest
import torch

import interp
from interp.patching import (
    attribute,
    greedy_transplant,
    learn_mask,
    logit_diff,
    make_pairs,
    sweep_layers,
    sweep_positions,
)
from interp.patching.attribution import compare_attribution
from interp.patching.heads import head_outputs
from interp.patching.masks import MaskConfig
from interp.patching.neurons import intersect_neurons, neuron_ablation_effect, neuron_contrast
from interp.patching.transplants import SearchConfig
from interp.testing.tiny import tiny_model

CLEAN = ["the man is big", "a man can go home", "you are here now"]
CORRUPT = ["the boy is small", "a boy can see home", "we are there now"]


@pytest.fixture(scope="module")
def setup():
    m = tiny_model("llama", n_layers=11, hidden_size=32, intermediate_size=48)
    tok = m.tokenizer
    met = logit_diff(tok.convert_tokens_to_ids("the"), tok.convert_tokens_to_ids("a"))
    return m, make_pairs(m, CLEAN, CORRUPT), met


def test_sweep_frame_is_long_and_sorts_layers_numerically(setup):
    m, pairs, met = setup
    sw = sweep_positions(m, pairs, met, runtime=interp.Runtime(progress=False))
    frame = sw.to_frame()
    assert len(frame) == sw.values.numel() == m.n_layers * pairs.n_positions
    assert {"layer", "position", "value", "delta", "normalized"} <= set(frame.columns)
    assert frame["layer"].dtype.kind == "i" and frame["position"].dtype.kind == "i"
    assert frame.sort_values("layer")["layer"].unique().tolist() == list(range(11))   # 10 after 2
    cell = frame[(frame["layer"] == 10) & (frame["position"] == frame["position"].max())]["value"].item()
    assert cell == pytest.approx(float(sw.values[10, -1]))
    assert sw.to_frame(wide=True).shape == tuple(sw.values.shape)
    by_site = sweep_layers(m, pairs, met, layers=[2, 10], runtime=interp.Runtime(progress=False)).to_frame()
    assert by_site["site"].tolist()[:3] == ["resid_pre", "attn_out", "mlp_out"]
    assert by_site["site_index"].tolist()[:3] == [0, 1, 2] and by_site["layer"].tolist() == [2] * 3 + [10] * 3


def test_attribution_and_check_frames(setup):
    m, pairs, met = setup
    att = attribute(m, pairs, met, sites=("resid_pre", "attn_z"), layers=[0, 10], runtime=interp.Runtime(progress=False))
    frame = att.to_frame()
    assert len(frame) == sum(sw.values.numel() for sw in att.sweeps.values())
    heads = frame[frame["kind"] == "attn_z"]
    assert str(heads["head"].dtype) == "Int64" and heads["value"].tolist() == pytest.approx(
        att["attn_z"].values.flatten().tolist())
    fig = att.plot("attn_z")
    assert isinstance(fig, go.Figure) and fig.data[0].z is not None
    chk = compare_attribution(m, pairs, met, sites=("resid_pre",), layers=[0, 10], runtime=interp.Runtime(progress=False))
    cf = chk.to_frame()
    assert list(cf.columns) == ["kind", "cell", "exact", "estimate", "error"]
    assert len(cf) == chk.exact["resid_pre"].numel()
    assert cf["exact"].tolist() == pytest.approx(chk.exact["resid_pre"].tolist())
    assert list(chk.plot().data[0].y) == pytest.approx(chk.estimate["resid_pre"].tolist())


def test_head_outputs_frame_and_plot(setup):
    m, _, _ = setup
    ho = head_outputs(m, interp.Prompts(CLEAN, chat=False), layers=[1, 10])
    frame = ho.to_frame()
    n_real = int(ho.mask.sum())
    assert list(frame.columns) == ["prompt", "layer", "position", "head", "norm", "share"]
    assert len(frame) == n_real * 2 * m.n_heads and set(frame["layer"]) == {1, 10}
    row = frame[(frame["prompt"] == 0) & (frame["layer"] == 10) & (frame["head"] == 2)].iloc[-1]
    assert row["norm"] == pytest.approx(float(ho.per_head[0, 1, int(row["position"]), 2].norm()), rel=1e-5)
    assert frame.groupby(["prompt", "layer", "position"])["share"].sum().tolist() == pytest.approx([1.0] * (n_real * 2))
    z = torch.tensor(ho.plot().data[0].z)
    want = frame.groupby(["layer", "head"])["norm"].mean().to_numpy().reshape(2, m.n_heads)
    assert z.numpy() == pytest.approx(want, rel=1e-5)


def test_neuron_contrast_effect_overlap(setup):
    m, _, met = setup
    con = neuron_contrast(m, CLEAN, CORRUPT, layers=[2, 10])
    cf = con.to_frame()
    assert len(cf) == 2 * m.d_mlp and cf["effect"].tolist() == pytest.approx(con.effect.flatten().tolist())
    assert cf.sort_values(["layer", "neuron"])["layer"].tolist() == [2] * m.d_mlp + [10] * m.d_mlp
    chosen = sorted(con.select(3))
    eff = neuron_ablation_effect(m, CLEAN, met, chosen, n_control=4, runtime=interp.Runtime(progress=False))
    ef = eff.to_frame()
    assert list(ef.columns) == ["layer", "neuron", "value", "delta", "control"] and len(ef) == 3 + 4
    assert ef["control"].sum() == 4 and not set(eff.control_neurons) & set(chosen)
    assert ef.loc[~ef["control"], "delta"].tolist() == pytest.approx(eff.delta.tolist())
    fig = eff.plot()
    assert list(fig.data[0].y) == pytest.approx(eff.delta.tolist())
    assert list(fig.data[1].y) == pytest.approx(eff.control_delta.tolist())
    alone = neuron_ablation_effect(m, CLEAN, met, chosen, runtime=interp.Runtime(progress=False))
    # the controls widen the batched sweep, so the chosen neurons' values may differ by float32 rounding (3e-8 seen)
    torch.testing.assert_close(alone.values, eff.values, rtol=0, atol=1e-6)
    assert alone.control_values is None and len(alone.plot().data) == 1
    ov = intersect_neurons({"a": chosen, "b": chosen[:2] + [(10, 0)]})
    of = ov.to_frame()
    assert list(of.columns) == ["condition", "layer", "neuron", "common", "unique"]
    assert len(of) == sum(len(s) for s in ov.sets.values()) and of["common"].sum() == 2 * len(ov.common)
    s = ov.summary()
    sa, sb = set(chosen), set(chosen[:2] + [(10, 0)])
    assert s["sizes"] == {"a": len(sa), "b": len(sb)} and s["n_common"] == len(sa & sb)
    assert s["jaccard"] == {"a/b": pytest.approx(len(sa & sb) / len(sa | sb))}
    assert s["n_unique"] == {"a": len(sa - sb), "b": len(sb - sa)}
    cs = con.summary()
    assert cs["n_neurons"] == 2 * m.d_mlp and cs["max_abs_effect"] == pytest.approx(float(con.effect.abs().max()))
    assert cs["top"][0] == list(con.top(1)[0]) and len(cs["top"]) == 5
    json.dumps([s, cs])


def test_mask_result_frame():
    m = tiny_model("llama", n_layers=3)
    res = learn_mask(m, CLEAN, lambda logits: logits[:, 5].mean(), config=MaskConfig(steps=5),
                     runtime=interp.Runtime(progress=False))
    frame = res.to_frame()
    assert list(frame.columns) == ["layer", "head", "score", "rank", "selected"]
    assert len(frame) == res.scores.numel()
    assert frame["score"].tolist() == pytest.approx(res.scores.flatten().tolist())
    assert len(res.history_frame()) == 5
    top = res.ranking(4)
    assert list(res.plot(k=4).data[0].y) == pytest.approx([s for _, _, s in top])
    s = res.summary()
    assert s["top"] == [list(t) for t in res.ranking(5)] and s["n_selected"] == len(res.selected())
    assert s["n_components"] == res.scores.numel() and s["n_steps"] == 5
    assert (s["baseline"], s["selected_metric"]) == (res.baseline, res.selected_metric)
    json.dumps(s)


def test_transplant_search_frame():
    tgt, src = tiny_model("llama", seed=0, n_layers=4), tiny_model("llama", seed=1, n_layers=4)
    ids = torch.randint(5, 200, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = src.hf(input_ids=ids).logits

    def score(model):
        with torch.no_grad():
            return -float((model.hf(input_ids=ids).logits - ref).pow(2).mean())

    res = greedy_transplant(tgt, src, score, parts=["block", "final_norm"], config=SearchConfig(max_steps=2),
                            runtime=interp.Runtime(progress=False))
    frame = res.to_frame()
    assert list(frame.columns) == ["step", "part", "first_layer", "last_layer", "layers", "score", "gain", "tried"]
    assert len(frame) == len(res.trajectory) == 2
    assert frame["score"].tolist() == [t["score"] for t in res.trajectory]
    assert list(res.plot().data[0].y) == [res.baseline] + frame["score"].tolist()
    s = res.summary()
    assert s["best"] == max([res.baseline] + frame["score"].tolist()) and s["gain"] == s["best"] - res.baseline
    assert len(s["chosen"]) == len(res.chosen) and s["n_steps"] == 2 and s["evaluations"] == res.evaluations
    assert s["chosen"] == [f"{p} {','.join(map(str, la))}".strip() for la, p in res.chosen]
    assert all(c.split()[0] in ("block", "final_norm") and c == c.strip() for c in s["chosen"])
    json.dumps(s)
