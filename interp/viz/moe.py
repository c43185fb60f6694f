"""Figures for the mixture-of-experts refusal study: the fraction of refusal removed per writer condition with
intervals, and the removal by rank of category subspaces against random subspaces (plain numbers in, plotly
figures out; this module knows no result type)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")
Band = tuple[Sequence[float], Sequence[float], Sequence[float]]   # values, lows, highs


def removal_bars(labels: Sequence[str], band: Band, colours: Sequence[str] | None = None,
                 title: str = "Refusal removed by ablating the direction from each group of writers") -> go.Figure:
    """One bar per condition: the fraction of refusal removed (0: none, 1: down to the harmless level) with its
    95% interval; dashed lines at 0 and 1."""
    v, lo, hi = (list(map(float, x)) for x in band)
    if not len(v) == len(lo) == len(hi) == len(labels):
        raise ValueError("removal_bars needs one value, low and high per label")
    fig = go.Figure(go.Bar(x=list(labels), y=v, marker_color=list(colours) if colours else "#d62728",
                           error_y=dict(type="data", symmetric=False, array=[h - x for x, h in zip(v, hi)],
                                        arrayminus=[x - a for x, a in zip(v, lo)]),
                           hovertemplate="%{x}: %{y:.3f}<extra></extra>"))
    for y, text in ((0.0, "refusal unchanged"), (1.0, "harmless level")):
        fig.add_hline(y=y, line_dash="dash", line_color="gray", annotation_text=text, annotation_position="top right")
    fig.update_layout(title=title + "<br><sup>first-token refusal score; whiskers: 95% bootstrap intervals over "
                      "prompts</sup>", yaxis_title="fraction of refusal removed", height=440, showlegend=False)
    return fig


def rank_sweep(ranks: Sequence[int], curves: Mapping[str, Band], reference: Mapping[str, float] | None = None,
               title: str = "Refusal removed by ablating category subspaces of rank r") -> go.Figure:
    """One line per subspace family over ``ranks`` with its 95% band; ``reference``: horizontal lines (e.g. the
    refusal direction's joint removal)."""
    fig = go.Figure()
    x = list(ranks)
    for i, (name, (v, lo, hi)) in enumerate(curves.items()):
        c = "#7f7f7f" if "random" in name else COLOURS[i % len(COLOURS)]
        fig.add_trace(go.Scatter(x=x + x[::-1], y=list(map(float, hi)) + list(map(float, lo))[::-1], fill="toself",
                                 fillcolor=c, opacity=0.15, line=dict(width=0), hoverinfo="skip", showlegend=False))
        fig.add_trace(go.Scatter(x=x, y=list(map(float, v)), mode="lines+markers", name=name,
                                 line=dict(color=c, dash="dot" if "random" in name else "solid")))
    for name, y in (reference or {}).items():
        fig.add_hline(y=float(y), line_dash="dash", line_color="#d62728", annotation_text=name,
                      annotation_position="top left")
    fig.add_hline(y=0.0, line_color="gray")
    fig.update_layout(title=title, xaxis=dict(title="rank of the ablated subspace", dtick=1),
                      yaxis_title="fraction of refusal removed", height=440,
                      legend=dict(orientation="h", x=0, y=-0.2))
    return fig


__all__ = ["removal_bars", "rank_sweep"]
