"""Figures comparing fine-tuned models: one value per model with an interval, and curves per model with controls."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

_PALETTE = ("#4062bb", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


def method_rates(bars: Mapping[str, tuple[float, float, float]], ylabel: str, title: str) -> go.Figure:
    """One bar per label ``{label: (value, low, high)}``; ``low`` / ``high`` (NaN: none) as error bars."""
    names = list(bars)
    vals = [float(bars[n][0]) for n in names]
    has = [not (math.isnan(bars[n][1]) or math.isnan(bars[n][2])) for n in names]
    err = None
    if any(has):
        err = dict(type="data", symmetric=False, array=[bars[n][2] - v if h else 0 for n, v, h in zip(names, vals, has)],
                   arrayminus=[v - bars[n][1] if h else 0 for n, v, h in zip(names, vals, has)])
    fig = go.Figure(go.Bar(x=names, y=vals, error_y=err, marker_color="#4062bb",
                           text=[f"{v:.3g}" for v in vals], textposition="outside"))
    fig.update_layout(title=title, yaxis_title=ylabel, xaxis_type="category", template="plotly_white")
    return fig


def method_curves(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
                  controls: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None, xlabel: str, ylabel: str,
                  title: str) -> go.Figure:
    """One solid line per name ``{name: (x, y)}``, and its control (same colour, dotted) when ``controls`` has it."""
    fig = go.Figure()
    for i, (name, (x, y)) in enumerate(curves.items()):
        color = _PALETTE[i % len(_PALETTE)]
        fig.add_trace(go.Scatter(x=list(x), y=list(y), mode="lines+markers", name=name, line=dict(color=color)))
        if controls and name in controls:
            cx, cy = controls[name]
            fig.add_trace(go.Scatter(x=list(cx), y=list(cy), mode="lines+markers", name=f"{name} (random control)",
                                     line=dict(color=color, dash="dot"), opacity=0.6))
    fig.update_layout(title=title, xaxis_title=xlabel, yaxis_title=ylabel, template="plotly_white")
    return fig


__all__ = ["method_curves", "method_rates"]
