"""Figures for representational-similarity studies: RSA by layer against its permutation null and noise ceiling,
typicality gradients by layer, cross-language similarity and retrieval by layer, and an RDM heatmap. Inputs are
plain arrays, lists and mappings; this module imports nothing of ours."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")


def _floats(v: Any) -> list[float]:
    return [float(x) for x in (v.tolist() if hasattr(v, "tolist") else v)]


def _band(go: Any, fig: Any, x: list, lo: Any, hi: Any, color: str, name: str, row: int | None = None) -> None:
    lo, hi = _floats(lo), _floats(hi)
    trace = go.Scatter(x=x + x[::-1], y=hi + lo[::-1], fill="toself", line={"width": 0}, fillcolor=color,
                       opacity=0.2, hoverinfo="skip", name=name)
    fig.add_trace(trace) if row is None else fig.add_trace(trace, row=row, col=1)


def rsa_by_layer(r: Any, layers: Sequence[Any], null_lo: Any, null_hi: Any, p: Any = None,
                 ceiling: tuple[float, float] | None = None, title: str = "RSA by layer",
                 ylabel: str = "rank correlation with target") -> Any:
    """RSA per layer (line; filled markers where ``p < 0.05``) over the permutation null's band and, when given, the
    noise ceiling (lower, upper) as a shaded strip."""
    import plotly.graph_objects as go

    x = [str(v) for v in layers]
    fig = go.Figure()
    _band(go, fig, x, null_lo, null_hi, "#7f7f7f", "permutation null (2.5-97.5%)")
    if ceiling is not None:
        fig.add_hrect(y0=ceiling[0], y1=ceiling[1], fillcolor="#2ca02c", opacity=0.15, line_width=0,
                      annotation_text="noise ceiling")
    sig = None if p is None else ["circle" if float(q) < 0.05 else "circle-open" for q in _floats(p)]
    fig.add_trace(go.Scatter(x=x, y=_floats(r), mode="lines+markers", name="model vs target",
                             marker={"symbol": sig, "size": 8}, line={"color": _PALETTE[0]},
                             text=None if p is None else [f"p={q:.3g}" for q in _floats(p)]))
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title=ylabel, template="plotly_white")
    return fig


def typicality_by_layer(pooled: Any, lo: Any, hi: Any, layers: Sequence[Any], per_group: Mapping[str, Any] | None = None,
                        null_hi: Any = None, title: str = "typicality gradient by layer") -> Any:
    """Pooled rank correlation of closeness-to-prototype with typicality per layer, its bootstrap interval, each group's
    correlation as a thin line, and the permutation null's upper 97.5% as a dotted line."""
    import plotly.graph_objects as go

    x = [str(v) for v in layers]
    fig = go.Figure()
    _band(go, fig, x, lo, hi, _PALETTE[0], "pooled 95% bootstrap")
    for i, (name, v) in enumerate((per_group or {}).items()):
        fig.add_trace(go.Scatter(x=x, y=_floats(v), mode="lines", name=str(name), opacity=0.5,
                                 line={"width": 1, "color": _PALETTE[(i + 1) % len(_PALETTE)]}))
    fig.add_trace(go.Scatter(x=x, y=_floats(pooled), mode="lines+markers", name="pooled",
                             line={"color": _PALETTE[0], "width": 3}))
    if null_hi is not None:
        fig.add_trace(go.Scatter(x=x, y=_floats(null_hi), mode="lines", name="null 97.5%",
                                 line={"dash": "dot", "color": "gray"}))
    fig.add_hline(y=0, line_color="gray", line_width=1)
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title="Spearman(closeness, typicality)",
                      template="plotly_white")
    return fig


def cross_language_by_layer(cosines: Mapping[str, Any], retrieval: Mapping[str, Any], layers: Sequence[Any],
                            title: str = "cross-language similarity by layer") -> Any:
    """Two panels by layer: mean cosines (matched / mismatched pairs, centred / raw, shuffled control) and retrieval
    accuracy (nearest other-language neighbour is the translation) with its shuffled-pairing control."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    x = [str(v) for v in layers]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=("mean cosine", "retrieval accuracy"))
    for i, (name, v) in enumerate(cosines.items()):
        fig.add_trace(go.Scatter(x=x, y=_floats(v), mode="lines+markers", name=name,
                                 line={"color": _PALETTE[i % len(_PALETTE)],
                                       "dash": "dot" if "raw" in name or "shuffled" in name else None}), row=1, col=1)
    for i, (name, v) in enumerate(retrieval.items()):
        fig.add_trace(go.Scatter(x=x, y=_floats(v), mode="lines+markers", name=name,
                                 line={"color": _PALETTE[(i + 4) % len(_PALETTE)],
                                       "dash": "dot" if "raw" in name or "shuffled" in name else None}), row=2, col=1)
    fig.update_layout(title=title, template="plotly_white")
    fig.update_xaxes(title_text="layer", row=2, col=1)
    return fig


def rdm_heatmap(matrix: Any, labels: Sequence[str] | None = None, title: str = "dissimilarity matrix") -> Any:
    """Heatmap of one ``[n, n]`` dissimilarity matrix with item labels."""
    import plotly.graph_objects as go

    m = [_floats(row) for row in (matrix.tolist() if hasattr(matrix, "tolist") else matrix)]
    lab = list(labels) if labels is not None else [str(i) for i in range(len(m))]
    fig = go.Figure(go.Heatmap(z=m, x=lab, y=lab, colorscale="Viridis", colorbar={"title": "dissimilarity"}))
    fig.update_layout(title=title, template="plotly_white", yaxis={"autorange": "reversed"})
    return fig
