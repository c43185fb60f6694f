"""Figures of the refusal-direction analysis (plain tensors and dicts in, plotly figures out)."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots


def candidate_heatmaps(bypass: torch.Tensor, induce: torch.Tensor, kl: torch.Tensor, layers: Sequence[int],
                       pos_labels: Sequence[str], chosen: tuple[int, int] | None) -> go.Figure:
    """Three heatmaps over layer x post-instruction position, the chosen candidate marked."""
    titles = ("bypass: refusal score under ablation (harmful)", "induce: refusal score with addition (harmless)",
              "KL on harmless under ablation")
    fig = make_subplots(rows=1, cols=3, subplot_titles=titles, horizontal_spacing=0.08)
    x = [f"{p} ({i - len(pos_labels)})" for i, p in enumerate(pos_labels)]
    for c, (z, scale) in enumerate(((bypass, "RdBu"), (induce, "RdBu_r"), (kl, "Viridis")), start=1):
        fig.add_trace(go.Heatmap(z=z.tolist(), x=x, y=list(layers), colorscale=scale, showscale=True,
                                 colorbar=dict(x=0.29 + 0.355 * (c - 1), len=0.9), hovertemplate=
                                 "layer %{y}<br>position %{x}<br>%{z:.3f}<extra></extra>"), row=1, col=c)
        if chosen is not None:
            fig.add_trace(go.Scatter(x=[x[chosen[1]]], y=[layers[chosen[0]]], mode="markers",
                                     marker=dict(symbol="x", size=14, color="black", line=dict(width=2)),
                                     name="selected", showlegend=c == 1), row=1, col=c)
    fig.update_yaxes(title_text="layer")
    fig.update_layout(height=420, title="Candidate directions (difference of means at resid_pre)")
    return fig


def projections_by_layer(harmful: torch.Tensor, harmless: torch.Tensor, layers: Sequence[int]) -> go.Figure:
    """Projection of harmful / harmless prompts on the direction at every layer (``[n, n_layers]`` each)."""
    fig = go.Figure()
    for name, proj, color in (("harmful", harmful, "#d62728"), ("harmless", harmless, "#1f77b4")):
        xs = [str(layer) for layer in layers for _ in range(proj.shape[0])]
        fig.add_trace(go.Box(x=xs, y=proj.T.flatten().tolist(), name=name, marker_color=color, boxpoints=False))
    fig.update_layout(boxmode="group", title="Projection on the refusal direction, layer by layer",
                      xaxis_title="layer (resid_pre, last token)", yaxis_title="projection", height=380)
    return fig


def refusal_rates(rates: dict[str, float]) -> go.Figure:
    """Refusal rate under each condition (baselines, interventions, random controls)."""
    names = list(rates)
    colors = ["#7f7f7f" if "baseline" in n else "#bcbd22" if ("random" in n or "orthogonal" in n) else "#2ca02c"
              for n in names]
    fig = go.Figure(go.Bar(x=names, y=[100 * rates[n] for n in names], marker_color=colors,
                           text=[f"{100 * rates[n]:.0f}%" for n in names], textposition="outside"))
    fig.update_layout(title="Refusal rate on test prompts (substring judge over generations)",
                      yaxis=dict(title="refusal rate (%)", range=[0, 110]), height=420)
    return fig


def cosine_heatmap(vectors: torch.Tensor, layers: Sequence[int], title: str) -> go.Figure:
    """Cosine similarity between per-layer candidates ``[n_layers, d]``."""
    u = torch.nn.functional.normalize(vectors.float(), dim=-1)
    cos = (u @ u.T).tolist()
    fig = go.Figure(go.Heatmap(z=cos, x=list(layers), y=list(layers), zmin=-1, zmax=1, colorscale="RdBu_r"))
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title="layer", height=420, width=480)
    return fig


def subspace_curve(ranks: Sequence[int], rates: Sequence[float], scores: Sequence[float], baseline: float) -> go.Figure:
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=list(ranks), y=[100 * r for r in rates], mode="lines+markers",
                             name="harmful refusal rate (%)"), secondary_y=False)
    fig.add_trace(go.Scatter(x=list(ranks), y=list(scores), mode="lines+markers", name="refusal score",
                             line=dict(dash="dot")), secondary_y=True)
    fig.add_hline(y=100 * baseline, line_dash="dash", line_color="gray", annotation_text="baseline rate")
    fig.update_xaxes(title_text="rank of the ablated subspace (refusal direction, then per-category directions)")
    fig.update_yaxes(title_text="refusal rate (%)", secondary_y=False)
    fig.update_yaxes(title_text="refusal score", secondary_y=True)
    fig.update_layout(title="Ablating per-category subspaces of rank 1..k", height=400)
    return fig
