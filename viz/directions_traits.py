"""Figures for calibrated trait scales and steering cost: per-trait layer curves with the chosen band, bars with
intervals (corpus signatures, decompositions), and behaviour vs strength beside its KL / CE cost (plain arrays in,
plotly figures out; this module knows no result type)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


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


def alpha_cost_curve(alphas: Sequence[float], steered: torch.Tensor, random: torch.Tensor, baseline: float,
                     kl: torch.Tensor, random_kl: torch.Tensor | None, *, ce: torch.Tensor | None = None,
                     random_ce: torch.Tensor | None = None, baseline_ce: float | None = None, metric: str = "metric",
                     title: str = "Behaviour and cost vs steering strength") -> go.Figure:
    """Behaviour vs alpha (top), KL(steered || unsteered) below, and CE on reference texts (when given) at the
    bottom; random same-strength controls dotted, the unsteered value dashed."""
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


__all__ = ["alpha_cost_curve", "interval_bars", "trait_layers"]
