"""Plotly figures for logit and tuned lenses: a site x position grid of top tokens, target probability by layer,
and KL to the final distribution by layer (one trace per lens)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
import torch


def lens_grid(text: Sequence[Sequence[str]], probs: torch.Tensor, positions: Sequence[str], sites: Sequence[str],
              title: str) -> go.Figure:
    """Heatmap ``[sites, positions]`` of top-1 probabilities with the top token written in each cell."""
    fig = go.Figure(go.Heatmap(
        z=probs.tolist(), x=list(positions), y=list(sites), text=[list(r) for r in text], texttemplate="%{text}",
        colorscale="Blues", zmin=0.0, zmax=1.0, colorbar={"title": "probability"},
        hovertemplate="%{y}<br>position %{x}<br>top %{text} p=%{z:.3f}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="position: input token", yaxis_title="site",
                      yaxis={"autorange": "reversed"}, template="plotly_white")
    return fig


def lens_targets(probs: torch.Tensor, targets: Sequence[str], layers: Sequence[int], sites: Sequence[str],
                 title: str) -> go.Figure:
    """One line per target: its probability ``probs [m, S]`` at each site, by layer."""
    fig = go.Figure()
    for t, name in enumerate(targets):
        fig.add_trace(go.Scatter(x=list(layers), y=probs[t].tolist(), mode="lines+markers", name=repr(name),
                                 text=list(sites), hovertemplate="%{text}<br>p=%{y:.4f}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title="probability", yaxis={"range": [0, 1]},
                      template="plotly_white")
    return fig


def lens_kl(kl: torch.Tensor | dict[str, torch.Tensor], layers: Sequence[int], sites: Sequence[str],
            title: str) -> go.Figure:
    """Mean KL(final || lens) by layer: one trace, or one per lens when ``kl`` is ``{name: [S]}``."""
    series: dict[str, Any] = kl if isinstance(kl, dict) else {"lens": kl}
    fig = go.Figure()
    for name, v in series.items():
        fig.add_trace(go.Scatter(x=list(layers), y=[float(x) for x in v], mode="lines+markers", name=name,
                                 text=list(sites), hovertemplate="%{text}<br>KL %{y:.4f}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title="KL(final || lens), nats", template="plotly_white")
    return fig


__all__ = ["lens_grid", "lens_kl", "lens_targets"]
