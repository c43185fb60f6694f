"""Figures for steering strength: residual norms by layer, and behaviour vs alpha against its controls
(plain arrays in, plotly figures out; this module knows no steering type), and behaviour vs alpha beside its KL / CE cost."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots


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


def _curves(fig: go.Figure, x: list[float], steered: torch.Tensor, random: torch.Tensor | None, row: int,
            name: str, first: bool) -> None:
    """The steered curve (green) and each random control (dotted) in subplot ``row``."""
    if random is not None:
        for j, r in enumerate(random.float().reshape(-1, len(x)).tolist()):
            fig.add_trace(go.Scatter(x=x, y=r, mode="lines+markers", name="random direction (same strength)",
                                     legendgroup="random", showlegend=first and j == 0,
                                     line=dict(color="#bcbd22", dash="dot")), row=row, col=1)
    fig.add_trace(go.Scatter(x=x, y=steered.float().tolist(), mode="lines+markers", name=name,
                             legendgroup=name, line=dict(color="#2ca02c", width=3)), row=row, col=1)


def alpha_cost_curve(sweep: Any, title: str = "Behaviour and cost vs steering strength") -> go.Figure:
    """Behaviour vs alpha (top), KL(steered || unsteered) below, and CE on reference texts (when measured) at the
    bottom, of a :class:`steering.AlphaSweep` with its costs; random same-strength controls dotted, the unsteered
    value dashed."""
    if getattr(sweep, "kl", None) is None:
        raise ValueError("this sweep has no costs; run alpha_sweep with config=steering.SweepConfig(cost=True)")
    alphas, steered, random, baseline, metric = sweep.alphas, sweep.steered, sweep.random, sweep.baseline, sweep.metric
    kl, random_kl, ce, random_ce, baseline_ce = sweep.kl, sweep.random_kl, sweep.ce, sweep.random_ce, sweep.baseline_ce
    n = 3 if ce is not None else 2
    fig = make_subplots(rows=n, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[metric, "KL(steered || unsteered), nats", "CE on reference texts"][:n])
    x = [float(a) for a in alphas]
    _curves(fig, x, steered, random, 1, "steered", True)
    fig.add_hline(y=float(baseline), line_dash="dash", line_color="gray", row=1, col=1)
    _curves(fig, x, kl, random_kl, 2, "steered KL", False)
    if ce is not None:
        _curves(fig, x, ce, random_ce, 3, "steered CE", False)
        if baseline_ce is not None:
            fig.add_hline(y=float(baseline_ce), line_dash="dash", line_color="gray", row=3, col=1)
    fig.update_xaxes(title_text="alpha", row=n, col=1)
    fig.update_layout(title=title, height=260 * n)
    return fig


