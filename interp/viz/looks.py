"""Figures of the exploratory looks: direct logit attribution (bars per writer, a layer x head heatmap), head
scores (one layer x head heatmap per score) and attention patterns (one heatmap per head, token labels)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots


def dla_figure(names: Sequence[str], values: Any, head_grid: Any | None, title: str) -> go.Figure:
    """Bars of ``values [len(names)]`` (each writer's mean share of the logit) and, with ``head_grid [L, H]``, a
    diverging heatmap of the heads' shares beside them."""
    vals = torch.as_tensor(values, dtype=torch.float64).tolist()
    cols = 1 if head_grid is None else 2
    fig = make_subplots(rows=1, cols=cols, subplot_titles=["by writer", "by head"][:cols],
                        column_widths=[0.55, 0.45][:cols] if cols == 2 else None)
    fig.add_trace(go.Bar(x=list(names), y=vals, name="share of the logit",
                         marker_color=["#c0392b" if v < 0 else "#2e86c1" for v in vals]), row=1, col=1)
    if head_grid is not None:
        g = torch.as_tensor(head_grid, dtype=torch.float64)
        zmax = float(g.abs().max()) or 1.0
        fig.add_trace(go.Heatmap(z=g.tolist(), x=[str(h) for h in range(g.shape[1])],
                                 y=[str(la) for la in range(g.shape[0])], colorscale="RdBu", zmid=0.0, zmin=-zmax,
                                 zmax=zmax, colorbar={"title": "share"},
                                 hovertemplate="layer %{y} head %{x}<br>share %{z:.4g}<extra></extra>"), row=1, col=2)
        fig.update_yaxes(title_text="layer", autorange="reversed", type="category", row=1, col=2)
        fig.update_xaxes(title_text="head", type="category", row=1, col=2)
    fig.update_yaxes(title_text="mean share of the logit", row=1, col=1)
    fig.update_layout(title=title, template="plotly_white", showlegend=False)
    return fig


def score_heatmaps(scores: Mapping[str, Any], title: str) -> go.Figure:
    """One layer x head heatmap per score (``scores[name] [L, H]``), side by side."""
    names = list(scores)
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=names, horizontal_spacing=0.06)
    for i, name in enumerate(names, 1):
        g = torch.as_tensor(scores[name], dtype=torch.float64)
        fig.add_trace(go.Heatmap(z=g.tolist(), x=[str(h) for h in range(g.shape[1])],
                                 y=[str(la) for la in range(g.shape[0])], colorscale="Viridis", showscale=i == 1,
                                 hovertemplate=f"layer %{{y}} head %{{x}}<br>{name} %{{z:.3g}}<extra></extra>"),
                      row=1, col=i)
        fig.update_yaxes(autorange="reversed", type="category", row=1, col=i)
        fig.update_xaxes(title_text="head", type="category", row=1, col=i)
    fig.update_yaxes(title_text="layer", row=1, col=1)
    fig.update_layout(title=title, template="plotly_white")
    return fig


def pattern_heatmaps(patterns: Any, tokens: Sequence[str], heads: Sequence[int], layer: int) -> go.Figure:
    """Attention patterns ``[len(heads), T, T]`` (query rows, key columns) as one heatmap per head, axes labelled
    with the tokens (made unique by their index)."""
    labels = [f"{i}:{t}" for i, t in enumerate(tokens)]
    p = torch.as_tensor(patterns, dtype=torch.float64)
    fig = make_subplots(rows=1, cols=len(heads), subplot_titles=[f"L{layer}H{h}" for h in heads],
                        horizontal_spacing=0.04)
    for i, _ in enumerate(heads, 1):
        fig.add_trace(go.Heatmap(z=p[i - 1].tolist(), x=labels, y=labels, colorscale="Blues", zmin=0.0, zmax=1.0,
                                 showscale=i == 1, hovertemplate="query %{y}<br>key %{x}<br>%{z:.3f}<extra></extra>"),
                      row=1, col=i)
        fig.update_yaxes(autorange="reversed", type="category", row=1, col=i)
        fig.update_xaxes(type="category", row=1, col=i)
    fig.update_layout(title=f"attention patterns, layer {layer}", template="plotly_white")
    return fig


__all__ = ["dla_figure", "pattern_heatmaps", "score_heatmaps"]
