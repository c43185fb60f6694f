"""Figures for calibrated trait scales and steering cost: per-trait layer curves with the chosen band, bars with
intervals (corpus signatures, decompositions) (plain arrays in, plotly figures out; this module knows no result
type). Behaviour vs strength beside its KL / CE cost is ``viz.steering.alpha_cost_curve``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
import torch

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def trait_layers(values: Mapping[str, torch.Tensor], bands: Mapping[str, Sequence[int]], layers: Sequence[int],
                 ylabel: str = "held-out adjacent d (min over levels)", threshold: float | None = None,
                 title: str = "Trait directions by layer") -> go.Figure:
    """One curve per trait over ``layers``, its chosen band shaded in the trait's colour, and the threshold."""
    fig = go.Figure()
    x = list(layers)
    for i, (name, v) in enumerate(values.items()):
        c = COLOURS[i % len(COLOURS)]
        fig.add_trace(go.Scatter(x=x, y=v.float().tolist(), mode="lines+markers", name=name, line=dict(color=c)))
        band = list(bands.get(name, []))
        if band:
            fig.add_vrect(x0=min(band) - 0.4, x1=max(band) + 0.4, fillcolor=c, opacity=0.08, line_width=0)
    if threshold is not None:
        fig.add_hline(y=float(threshold), line_dash="dash", line_color="gray", annotation_text="threshold")
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title=ylabel, height=420)
    return fig


def interval_bars(names: Sequence[str], groups: Sequence[str], value: torch.Tensor, lo: torch.Tensor,
                  hi: torch.Tensor, ylabel: str = "level units", title: str = "") -> go.Figure:
    """Grouped bars ``value [n_groups, n_names]`` with interval whiskers ``lo`` / ``hi`` (same shape)."""
    fig = go.Figure()
    v, a, b = value.float().reshape(len(groups), len(names)), lo.float().reshape(len(groups), -1), \
        hi.float().reshape(len(groups), -1)
    for g, grp in enumerate(groups):
        fig.add_trace(go.Bar(x=list(names), y=v[g].tolist(), name=str(grp), marker_color=COLOURS[g % len(COLOURS)],
                             error_y=dict(type="data", symmetric=False, array=(b[g] - v[g]).tolist(),
                                          arrayminus=(v[g] - a[g]).tolist())))
    fig.add_hline(y=0, line_color="gray")
    fig.update_layout(title=title, yaxis_title=ylabel, barmode="group", height=400)
    return fig


__all__ = ["interval_bars", "trait_layers"]
