"""Figures of the value and partisan vector studies: held-out separation by layer, the layer-selection rule's
parts, forced-choice rate vs alpha against random vectors (Wilson intervals), and cross-lingual agreement by layer
(plain arrays in, plotly figures out; this module knows no study type)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots


def _list(v: Any) -> list[float]:
    return [float(x) for x in (v.tolist() if hasattr(v, "tolist") else v)]


def separation_by_layer(layers: Sequence[int], auroc: Any, control: Any = None,
                        title: str = "held-out AUROC by layer") -> go.Figure:
    """Held-out AUROC per layer, the shuffled-label control beside it, chance at 0.5."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=list(layers), y=_list(auroc), mode="lines+markers", name="held-out AUROC"))
    if control is not None:
        fig.add_trace(go.Scatter(x=list(layers), y=_list(control), mode="lines", name="shuffled-label control",
                                 line=dict(color="#7f7f7f", dash="dot")))
    fig.add_hline(y=0.5, line_dash="dash", line_color="gray", annotation_text="chance")
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title="AUROC", height=380)
    return fig


def layer_selection(layers: Sequence[int], auroc: Any, effect: Any, score: Any, chosen: Sequence[int],
                    title: str = "layer selection") -> go.Figure:
    """Three stacked panels by layer: held-out AUROC, single-layer causal effect, their product; chosen layers
    marked in red."""
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, subplot_titles=("held-out AUROC", "causal effect",
                                                                             "score = separation x effect"))
    x = list(layers)
    colors = ["#d62728" if la in set(chosen) else "#1f77b4" for la in x]
    fig.add_trace(go.Scatter(x=x, y=_list(auroc), mode="lines+markers", name="AUROC"), row=1, col=1)
    fig.add_trace(go.Bar(x=x, y=_list(effect), name="effect", marker_color=colors), row=2, col=1)
    fig.add_trace(go.Bar(x=x, y=_list(score), name="score", marker_color=colors), row=3, col=1)
    fig.update_layout(title=title, height=620, showlegend=False)
    fig.update_xaxes(title_text="layer", row=3, col=1)
    return fig


def _band(fig: go.Figure, x: list[float], lo: list[float], hi: list[float], color: str, name: str) -> None:
    fig.add_trace(go.Scatter(x=x + x[::-1], y=hi + lo[::-1], fill="toself", fillcolor=color, line=dict(width=0),
                             name=name, hoverinfo="skip"))


def rate_vs_alpha(alphas: Sequence[float], value_rate: Any, value_ci: Sequence[tuple[float, float]], random_rate: Any,
                  random_ci: Sequence[Sequence[tuple[float, float]]], baseline: float,
                  title: str = "forced-choice rate vs alpha") -> go.Figure:
    """The value vector's rate with its 95% band, each random vector's rate (dotted, its band lighter), and the
    no-intervention baseline."""
    x = [float(a) for a in alphas]
    fig = go.Figure()
    rows = [_list(r) for r in (random_rate.tolist() if hasattr(random_rate, "tolist") else random_rate)]
    for j, (row, ci) in enumerate(zip(rows, random_ci, strict=True)):
        _band(fig, x, [c[0] for c in ci], [c[1] for c in ci], "rgba(188,189,34,0.10)", f"random {j} 95%")
        fig.add_trace(go.Scatter(x=x, y=row, mode="lines+markers", name="random vector (same norm)",
                                 legendgroup="random", showlegend=j == 0, line=dict(color="#bcbd22", dash="dot")))
    _band(fig, x, [c[0] for c in value_ci], [c[1] for c in value_ci], "rgba(44,160,44,0.2)", "value 95%")
    fig.add_trace(go.Scatter(x=x, y=_list(value_rate), mode="lines+markers", name="value vector",
                             line=dict(color="#2ca02c", width=3)))
    fig.add_hline(y=float(baseline), line_dash="dash", line_color="gray", annotation_text="no intervention")
    fig.update_layout(title=title, xaxis_title="alpha (fraction of residual norm)", yaxis_title="pole rate",
                      yaxis_range=[0, 1], height=420)
    return fig


def agreement_by_layer(layers: Sequence[int], series: Mapping[str, Any], title: str = "agreement by layer"
                       ) -> go.Figure:
    """Named curves by layer (e.g. cosine of two languages' directions, transfer AUROC)."""
    fig = go.Figure()
    for name, v in series.items():
        fig.add_trace(go.Scatter(x=list(layers), y=_list(v), mode="lines+markers", name=name))
    fig.add_hline(y=0.0, line_color="lightgray")
    fig.update_layout(title=title, xaxis_title="layer", height=380)
    return fig


__all__ = ["agreement_by_layer", "layer_selection", "rate_vs_alpha", "separation_by_layer"]
