"""Plotly figures for generated text and baked weights: response length and refusal share per prompt group, and
the weight removed from each residual writer with the measured logit error. Inputs are plain lists and floats;
this module never imports ``steering``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def generation_summary(groups: Sequence[str], lengths: Sequence[int], refused: Sequence[bool] | None = None,
                       title: str = "generations") -> Any:
    """Left: response length (tokens) per group as box plots. Right, when ``refused`` is given: the share of
    responses judged refusals per group (one bar each, with the count in the hover)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    if len(groups) != len(lengths) or (refused is not None and len(refused) != len(lengths)):
        raise ValueError(f"groups ({len(groups)}), lengths ({len(lengths)}) and refused "
                         f"({'-' if refused is None else len(refused)}) must have one entry per response")
    names = list(dict.fromkeys(groups))
    cols = 2 if refused is not None else 1
    fig = make_subplots(rows=1, cols=cols, subplot_titles=["response length (tokens)", "refusal share"][:cols])
    for g in names:
        ys = [int(n) for n, gg in zip(lengths, groups, strict=True) if gg == g]
        fig.add_trace(go.Box(y=ys, name=g, boxpoints="all", jitter=0.3, showlegend=False), row=1, col=1)
    if refused is not None:
        hits = [[bool(r) for r, gg in zip(refused, groups, strict=True) if gg == g] for g in names]
        share = [sum(h) / len(h) for h in hits]
        fig.add_trace(go.Bar(x=names, y=share, name="refusal share", showlegend=False, marker_color="#d62728",
                             customdata=[[sum(h), len(h)] for h in hits],
                             hovertemplate="%{x}: %{customdata[0]} of %{customdata[1]} refused<extra></extra>"),
                      row=1, col=2)
        fig.update_yaxes(range=[0, 1], row=1, col=2)
    fig.update_yaxes(title_text="tokens", rangemode="tozero", row=1, col=1)
    fig.update_layout(title=title, template="plotly_white")
    return fig


def bake_summary(writers: Sequence[str], layers: Sequence[int | None], removed: Sequence[float],
                 max_logit_error: float | None = None, rel_logit_error: float | None = None, exact: bool = True,
                 title: str = "baked directional ablation", value_label: str = "removed fraction of ||W||") -> Any:
    """Left: ``removed`` (each edited weight's removed norm fraction, or what ``value_label`` names) by layer, one
    trace per writer (global writers such as the embedding sit at layer -1). Right: the measured max and relative
    logit error against hooks (the panel says "not measured" when it was not)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    err_title = "logit error vs hooks" if max_logit_error is not None else "logit error: not measured"
    fig = make_subplots(rows=1, cols=2, column_widths=[0.75, 0.25],
                        subplot_titles=[f"{value_label} per writer", err_title])
    for w in dict.fromkeys(writers):
        pts = [(-1 if la is None else int(la), float(r)) for ww, la, r in zip(writers, layers, removed, strict=True)
               if ww == w]
        fig.add_trace(go.Bar(x=[p[0] for p in pts], y=[p[1] for p in pts], name=w), row=1, col=1)
    if max_logit_error is not None:
        fig.add_trace(go.Bar(x=["max abs", "relative"], y=[max_logit_error, rel_logit_error or 0.0],
                             name="logit error", marker_color="#7f7f7f", showlegend=False), row=1, col=2)
    fig.update_xaxes(title_text="layer", dtick=1, row=1, col=1)
    fig.update_yaxes(title_text=value_label, rangemode="tozero", row=1, col=1)
    fig.update_layout(title=f"{title} ({'exact' if exact else 'inexact: post-sublayer norms'})",
                      barmode="group", template="plotly_white")
    return fig


__all__ = ["generation_summary", "bake_summary"]
