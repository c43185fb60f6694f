"""Figures for feature pages: a histogram drawn from counts already binned (so the page shows exactly the counts the
caller computed, not plotly's own binning). Inputs are plain lists; this module never imports ``sae``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def binned_histogram(edges: Sequence[float], counts: Sequence[int], title: str = "activations",
                     x_title: str = "activation", log_y: bool = False) -> Any:
    """Bars of ``counts [n]`` over bins with ``edges [n + 1]`` (bar at each bin's centre, as wide as the bin)."""
    import plotly.graph_objects as go

    edges, counts = [float(e) for e in edges], [int(c) for c in counts]
    if len(edges) != len(counts) + 1:
        raise ValueError(f"{len(counts)} counts need {len(counts) + 1} bin edges, got {len(edges)}")
    centres = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
    widths = [b - a for a, b in zip(edges[:-1], edges[1:])]
    fig = go.Figure(go.Bar(x=centres, y=counts, width=widths, marker_color="#e8590c",
                           hovertemplate="%{x:.3g}: %{y}<extra></extra>"))
    fig.update_layout(title=title, template="plotly_white", xaxis_title=x_title, yaxis_title="count", height=300,
                      bargap=0.02, margin=dict(t=50, b=40, l=50, r=20))
    if log_y:
        fig.update_yaxes(type="log")
    return fig


__all__ = ["binned_histogram"]
