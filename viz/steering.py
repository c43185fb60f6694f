"""Figures for steering strength: residual norms by layer, and behaviour vs alpha against its controls
(plain arrays in, plotly figures out; this module knows no steering type)."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
import torch


def norms_by_layer(layers: Sequence[int], mean: torch.Tensor, std: torch.Tensor, peak: torch.Tensor,
                   title: str = "Residual norm by layer") -> go.Figure:
    """Mean residual norm per layer with a +-1 std band, and the largest token norm (dotted)."""
    x = list(layers)
    m, s = mean.float().tolist(), std.float().tolist()
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x + x[::-1], y=[a + b for a, b in zip(m, s, strict=True)] +
                             [a - b for a, b in zip(m, s, strict=True)][::-1], fill="toself",
                             fillcolor="rgba(31,119,180,0.2)", line=dict(width=0), name="+-1 std", hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=x, y=m, mode="lines+markers", name="mean norm", line=dict(color="#1f77b4")))
    fig.add_trace(go.Scatter(x=x, y=peak.float().tolist(), mode="lines", name="max token norm",
                             line=dict(color="#7f7f7f", dash="dot")))
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title="L2 norm", height=380)
    return fig


def alpha_curve(alphas: Sequence[float], steered: torch.Tensor, random: torch.Tensor, baseline: float,
                metric: str = "metric", title: str = "Behaviour vs steering strength") -> go.Figure:
    """``steered [n_alphas]`` vs alpha, each random control ``random [n_random, n_alphas]`` (same strength,
    random direction) in grey, and the no-intervention baseline as a dashed line."""
    x = [float(a) for a in alphas]
    fig = go.Figure()
    for j, row in enumerate(random.float().reshape(-1, len(x)).tolist()):
        fig.add_trace(go.Scatter(x=x, y=row, mode="lines+markers", name="random direction (same strength)",
                                 legendgroup="random", showlegend=j == 0, line=dict(color="#bcbd22", dash="dot")))
    fig.add_trace(go.Scatter(x=x, y=steered.float().tolist(), mode="lines+markers", name="steered",
                             line=dict(color="#2ca02c", width=3)))
    fig.add_hline(y=float(baseline), line_dash="dash", line_color="gray", annotation_text="no intervention")
    fig.update_layout(title=title, xaxis_title="alpha", yaxis_title=metric, height=400)
    return fig
