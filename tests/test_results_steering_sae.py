"""`.plot()` and `.to_frame()` of the steering and SAE results: the figures hold the results' own numbers, the
frames have the documented columns, one row per entry, and integer columns that sort numerically."""

from __future__ import annotations

import contextlib

import plotly.graph_objects as go
import pytest
import torch

import interp
import steering
from interp.data import load_prompts
from interp.evals.judge import is_refusal
from interp.testing.tiny import tiny_model
from sae.analysis import aligned_latents, diff_latents, separating_latents
from sae.model import SAE, SAEConfig
from sae.quality import ce_loss_recovered, evaluate
from sae.trainer import TrainConfig, train_sae


def _ys(fig: go.Figure) -> list[list[float]]:
    return [list(t.y) for t in fig.data if getattr(t, "y", None) is not None]


@pytest.fixture(scope="module")
def organism():
    return interp.load_model("organism")


def test_generations_plot_and_frame_on_the_organism(organism):
    harmful = [r["instruction"] for r in load_prompts("organism_harmful_test")][:3]
    harmless = [r["instruction"] for r in load_prompts("organism_harmless_test")][:3]
    gens = steering.generate(organism, harmful + harmless, max_new_tokens=12, runtime=interp.Runtime(progress=False))
    groups = ["harmful"] * 3 + ["harmless"] * 3
    frame = gens.to_frame(groups)
    assert list(frame.columns) == ["prompt_index", "group", "prompt", "response", "n_tokens", "refusal"]
    assert len(frame) == len(gens) == 6
    assert frame["refusal"].tolist() == [is_refusal(t) for t in gens.texts]
    assert frame["n_tokens"].tolist() == [len(ids) for ids in gens.token_ids]
    fig = gens.plot(groups)
    assert isinstance(fig, go.Figure)
    boxes = [t for t in fig.data if t.type == "box"]
    assert [list(b.y) for b in boxes] == [frame["n_tokens"][:3].tolist(), frame["n_tokens"][3:].tolist()]
    share = [t for t in fig.data if t.type == "bar"][0]
    want = frame.groupby("group", sort=False)["refusal"].mean().tolist()
    assert list(share.x) == ["harmful", "harmless"] and list(share.y) == pytest.approx(want)
    assert want[0] > want[1]                           # the aligned organism refuses the harmful ones
    plain = gens.plot(judge=None)
    assert [t.type for t in plain.data] == ["box"] and "refusal" not in gens.to_frame(judge=None)
    with pytest.raises(ValueError, match="one label per prompt"):
        gens.plot(["a", "b"])


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_bake_result_plot_and_frame(family):
    m = tiny_model(family)
    v = torch.randn(m.d_model, generator=torch.Generator().manual_seed(1))
    with pytest.warns(UserWarning) if family == "gemma2" else contextlib.nullcontext():
        res = steering.bake(m, v, allow_inexact=True, measure=True)
    frame = res.to_frame()
    assert list(frame.columns) == ["writer", "layer", "parameter", "removed"]
    assert len(frame) == len(res.edited) and frame["parameter"].tolist() == res.edited
    assert frame["removed"].between(0, 1).all() and frame["removed"].gt(0).all()
    layers = frame.loc[frame["writer"] == "attn", "layer"].tolist()
    assert layers == list(range(m.n_layers))
    # the removed fraction is what the edit took: compare the original and the baked weight of layer 0's mlp
    name = frame.loc[(frame["writer"] == "mlp") & (frame["layer"] == 0), "parameter"].item()
    w0 = dict(m.hf.named_parameters())[name + ".weight"].detach().double()
    w1 = dict(res.model.hf.named_parameters())[name + ".weight"].detach().double()
    got = frame.loc[frame["parameter"] == name, "removed"].item()
    assert got == pytest.approx(float((w0 - w1).norm() / w0.norm()), rel=1e-6)
    fig = res.plot()
    assert isinstance(fig, go.Figure)
    attn = next(t for t in fig.data if t.name == "attn")
    assert list(attn.y) == pytest.approx(frame.loc[frame["writer"] == "attn", "removed"].tolist())
    err = next(t for t in fig.data if t.name == "logit error")
    assert list(err.y) == pytest.approx([res.max_logit_error, res.rel_logit_error])


def test_latent_ranking_separation_and_diff(sae):
    g = torch.Generator().manual_seed(0)
    r = aligned_latents(sae, sae.W_dec[13].detach(), top=12)
    frame = r.to_frame()
    assert list(frame.columns) == ["rank", "latent", "score"] and len(frame) == len(r) == 12
    assert frame["latent"].tolist() == r.indices.tolist() and frame.loc[0, "latent"] == 13
    fig = r.plot()
    assert isinstance(fig, go.Figure) and _ys(fig)[0] == pytest.approx(r.scores.tolist())
    a, b = torch.randn(40, 32, generator=g) + sae.W_dec[7].detach(), torch.randn(30, 32, generator=g)
    sep = separating_latents(sae, a, b, top=5)
    sf = sep.to_frame()
    assert list(sf.columns) == ["latent", "mean_a", "mean_b", "diff", "auroc", "rank"] and len(sf) == sae.d_sae
    assert sf["auroc"].tolist() == pytest.approx(sep.auroc.tolist())
    assert sf.sort_values("rank").dropna()["latent"].tolist() == sep.ranking.indices.tolist()
    assert _ys(sep.plot())[0] == pytest.approx(sep.mean_a[sep.ranking.indices].tolist())
    d = diff_latents(sae, b, b + 0.5 * sae.W_dec[3].detach(), top=4)
    df = d.to_frame()
    assert list(df.columns) == ["latent", "mean_base", "mean_tuned", "delta", "freq_base", "freq_tuned", "rank"]
    assert len(df) == sae.d_sae and df.loc[df["rank"] == 0, "latent"].item() == int(d.ranking.indices[0])
    base, tuned = _ys(d.plot())
    assert base == pytest.approx(d.mean_base[d.ranking.indices].tolist())
    assert tuned == pytest.approx(d.mean_tuned[d.ranking.indices].tolist())


def test_train_result_and_metrics():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 16, generator=g)
    res = train_sae(x, TrainConfig(d_sae=64, k=4, total_tokens=4096 * 3, batch_size=256, log_every=2,
                                   progress=False), arch="topk")
    frame = res.to_frame()
    for col in ("step", "tokens", "loss", "fvu", "l0", "dead"):
        assert col in frame
    assert len(frame) == len(res.history["step"]) > 2 and frame["step"].is_monotonic_increasing
    fig = res.plot()
    assert [t.name for t in fig.data] == ["loss", "FVU", "L0", "dead fraction"]
    assert list(fig.data[1].y) == pytest.approx(res.history["fvu"]) and list(fig.data[0].x) == res.history["step"]
    met = evaluate(res.sae, x[:1000])
    mf = met.to_frame()
    assert list(mf.columns) == ["latent", "frequency", "dead", "dense"] and len(mf) == 64
    assert mf["dead"].mean() == pytest.approx(met.dead_fraction) and mf["dense"].mean() == pytest.approx(
        met.dense_fraction)
    fig = met.plot()
    hist = fig.data[0]
    f = met.frequency
    assert list(hist.x) == pytest.approx(torch.log10(f[f > 0]).tolist())
    assert list(fig.data[1].y) == pytest.approx([met.fvu, met.dead_fraction, met.dense_fraction])
    assert list(fig.data[2].y) == pytest.approx([met.l0])


def test_ce_loss_recovered_frame_and_plot():
    m = tiny_model("llama")
    s = SAE(SAEConfig(m.d_model, 64, arch="relu", site="resid_post.0"), seed=0)
    ce = ce_loss_recovered(m, s, interp.Prompts(["the man is here and there", "a boy can see the water"], chat=False))
    frame = ce.to_frame()
    assert list(frame.columns) == ["condition", "ce", "recovered"] and len(frame) == 4
    assert frame["ce"].tolist() == pytest.approx([ce.clean, ce.sae, ce.zero_ablated, ce.mean_ablated])
    assert _ys(ce.plot())[0] == pytest.approx(frame["ce"].tolist())
