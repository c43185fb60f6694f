"""Plotly figures for studies through fine-tuning: quantities over training steps, one panel per quantity and one
line per run, with fitted curves dashed. Inputs are plain lists and dicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

COLORS = ("#d62728", "#7f7f7f", "#2ca02c", "#1f77b4", "#9467bd", "#8c564b")


def step_panels(runs: Mapping[str, Mapping[str, Sequence[float]]], keys: Sequence[str],
                fitted: Mapping[tuple[str, str], tuple[Sequence[float], Sequence[float]]] | None = None,
                names: Mapping[str, str] | None = None, title: str = "over fine-tuning steps") -> Any:
    """``runs[run]["step"]`` and ``runs[run][key]`` for each ``key`` of ``keys`` (one panel each);
    ``fitted[(run, key)] = (steps, values)``: a fitted curve drawn dashed over that run's points."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    names = dict(names or {})
    keys = [k for k in keys if any(k in r for r in runs.values())]
    if not keys:
        raise ValueError("none of the requested quantities is in the runs")
    fig = make_subplots(rows=len(keys), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[names.get(k, k) for k in keys])
    for i, k in enumerate(keys, 1):
        for j, (run, r) in enumerate(runs.items()):
            color = COLORS[j % len(COLORS)]
            fig.add_trace(go.Scatter(x=list(r["step"]), y=[float(v) for v in r[k]], mode="markers+lines", name=run,
                                     legendgroup=run, showlegend=i == 1, line=dict(color=color, width=1.5)),
                          row=i, col=1)
            if fitted and (run, k) in fitted:
                xs, ys = fitted[(run, k)]
                fig.add_trace(go.Scatter(x=list(xs), y=[float(v) for v in ys], mode="lines", name=f"{run} fit",
                                         legendgroup=run, showlegend=False, line=dict(color=color, dash="dash")),
                              row=i, col=1)
    fig.update_xaxes(title_text="fine-tuning step", row=len(keys), col=1)
    fig.update_layout(title=title, template="plotly_white", height=200 * len(keys) + 100)
    return fig


__all__ = ["step_panels"]
