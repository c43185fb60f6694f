"""Plotly figures for patching and circuits: layer x position / layer x head heatmaps, attribution against exact
patching, learned-mask rankings, neuron contrasts and overlaps, and transplant search trajectories."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
import torch


def _title(default: str, title: str | None) -> str:
    return default if title is None else title


def sweep_heatmap(sweep: Any, normalized: bool | None = None, title: str | None = None) -> go.Figure:
    """Heatmap of a :class:`~patching.results.Sweep` (rows: layers; columns: positions, heads, ...)."""
    use_norm = sweep.reference is not None and abs(sweep.reference - sweep.baseline) > 1e-12 if normalized is None \
        else normalized
    z = sweep.normalized() if use_norm else sweep.delta
    label = "normalised effect" if use_norm else f"change in {sweep.metric or 'metric'}"
    zmax = float(torch.nan_to_num(z.abs()).max()) or 1.0
    fig = go.Figure(go.Heatmap(
        z=z.tolist(), x=list(sweep.cols), y=list(sweep.rows), colorscale="RdBu", zmid=0.0, zmin=-zmax, zmax=zmax,
        colorbar={"title": label},
        hovertemplate=f"{sweep.row_name} %{{y}}<br>{sweep.col_name} %{{x}}<br>{label} %{{z:.4g}}<extra></extra>"))
    fig.update_layout(
        title=_title(f"{sweep.method} patching of {sweep.site} ({sweep.metric}): {sweep.row_name} x {sweep.col_name}", title),
        xaxis_title=sweep.col_name, yaxis_title=sweep.row_name, yaxis={"autorange": "reversed"},
        template="plotly_white")
    return fig


def attribution_scatter(check: Any, title: str | None = None) -> go.Figure:
    """Attribution estimate against exact patching, one trace per site kind, with the identity line."""
    fig = go.Figure()
    lo, hi = 0.0, 0.0
    for kind in check.exact:
        x, y = check.exact[kind].flatten(), check.estimate[kind].flatten()
        lo, hi = min(lo, float(x.min()), float(y.min())), max(hi, float(x.max()), float(y.max()))
        fig.add_trace(go.Scatter(x=x.tolist(), y=y.tolist(), mode="markers", name=f"{kind} (r={check.r[kind]:.3f})",
                                 opacity=0.7))
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x", line={"dash": "dash", "color": "gray"}))
    fig.update_layout(title=_title("attribution patching vs exact patching (metric change)", title),
                      xaxis_title="exact patching", yaxis_title="attribution estimate", template="plotly_white")
    return fig


def mask_ranking(result: Any, k: int = 20, title: str | None = None) -> go.Figure:
    """Bar chart of the ``k`` highest learned mask scores."""
    top = result.ranking(k)
    unit = "head" if result.over == "heads" else "neuron"
    fig = go.Figure(go.Bar(x=[f"L{la}.{'H' if unit == 'head' else 'N'}{c}" for la, c, _ in top],
                           y=[s for _, _, s in top], marker_color="#4062bb"))
    fig.update_layout(title=_title(f"learned {unit} mask ({result.objective} {result.metric}): top {len(top)}", title),
                      xaxis_title=unit, yaxis_title="ablation strength", yaxis={"range": [0, 1]}, template="plotly_white")
    return fig


def transplant_trajectory(search: Any, title: str | None = None) -> go.Figure:
    """Score after each greedy transplant step, with the target's and the source's scores as references."""
    xs = ["none"] + [f"+{t['part']}" + (f":{','.join(map(str, t['layers']))}" if t["layers"] else "")
                     for t in search.trajectory]
    ys = [search.baseline] + [t["score"] for t in search.trajectory]
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="lines+markers", name="transplanted target"))
    if search.source_score is not None:
        fig.add_hline(y=search.source_score, line_dash="dash", line_color="green", annotation_text="source")
    fig.add_hline(y=search.baseline, line_dash="dot", line_color="gray", annotation_text="target")
    fig.update_layout(title=_title("greedy transplant: score after each added block", title),
                      xaxis_title="component added", yaxis_title="score", template="plotly_white")
    return fig


def neuron_contrast_heatmap(contrast: Any, by: str = "effect", title: str | None = None) -> go.Figure:
    """Per-neuron effect size (or mean difference) between two prompt sets, layers x neurons."""
    z = contrast.effect if by == "effect" else contrast.diff
    zmax = float(z.abs().max()) or 1.0
    fig = go.Figure(go.Heatmap(z=z.tolist(), y=[str(la) for la in contrast.layers], colorscale="RdBu", zmid=0.0,
                               zmin=-zmax, zmax=zmax, colorbar={"title": by}))
    fig.update_layout(title=_title(f"neuron contrast ({by}): layer x neuron", title), xaxis_title="neuron",
                      yaxis_title="layer", yaxis={"autorange": "reversed"}, template="plotly_white")
    return fig


def overlap_heatmap(overlap: Any, title: str | None = None) -> go.Figure:
    """Jaccard overlap of neuron sets across conditions, annotated with intersection sizes."""
    text = [[str(int(v)) for v in row] for row in overlap.intersections.tolist()]
    fig = go.Figure(go.Heatmap(z=overlap.jaccard.tolist(), x=overlap.names, y=overlap.names, colorscale="Blues",
                               zmin=0, zmax=1, text=text, texttemplate="%{text}", colorbar={"title": "Jaccard"}))
    fig.update_layout(title=_title(f"neuron set overlap (common to all: {len(overlap.common)})", title),
                      template="plotly_white")
    return fig


def grid_heatmap(z: Any, x: Sequence[str], y: Sequence[str], xaxis: str, yaxis: str, label: str,
                 title: str, diverging: bool = False) -> go.Figure:
    """A plain heatmap of ``z [len(y), len(x)]`` (e.g. mean head write norm, layers x heads); ``diverging``
    centres a red-blue scale at zero, otherwise a one-sided scale from zero."""
    t = torch.as_tensor(z, dtype=torch.float64)
    zmax = float(torch.nan_to_num(t.abs()).max()) or 1.0
    scale = {"colorscale": "RdBu", "zmid": 0.0, "zmin": -zmax, "zmax": zmax} if diverging else \
        {"colorscale": "Viridis", "zmin": 0.0}
    fig = go.Figure(go.Heatmap(z=t.tolist(), x=list(x), y=list(y), colorbar={"title": label}, **scale,
                               hovertemplate=f"{yaxis} %{{y}}<br>{xaxis} %{{x}}<br>{label} %{{z:.4g}}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title=xaxis, yaxis_title=yaxis, yaxis={"autorange": "reversed"},
                      xaxis_type="category", template="plotly_white")
    return fig


def effect_bars(labels: Sequence[str], delta: Sequence[float], control: Sequence[float] | None = None,
                joint: float | None = None, metric: str = "metric", title: str | None = None) -> go.Figure:
    """Change of the metric when each component is ablated alone (blue), beside the same ablation of random
    components (grey, the control) and a dashed line at the change with all chosen components ablated."""
    fig = go.Figure(go.Bar(x=list(labels), y=[float(v) for v in delta], name="chosen", marker_color="#4062bb"))
    if control is not None and len(control):
        fig.add_trace(go.Bar(x=[f"random {i}" for i in range(len(control))], y=[float(v) for v in control],
                             name="random control", marker_color="#9a9a9a"))
    if joint is not None:
        fig.add_hline(y=joint, line_dash="dash", line_color="#d62728", annotation_text="all chosen ablated")
    fig.update_layout(title=_title(f"ablation effect on {metric}", title), xaxis_title="component",
                      xaxis_type="category", yaxis_title=f"change in {metric}", template="plotly_white")
    return fig



def intervention_bars(labels: Sequence[str], before: Sequence[float], after: Sequence[float],
                      predicted: Sequence[float], mode: str = "", title: str | None = None) -> go.Figure:
    """Each target's value before and after a feature intervention, and the graph's predicted value after
    (before + predicted change; left out where the graph cannot predict it)."""
    b = [float(v) for v in before]
    pred = [None if v != v else bv + float(v) for bv, v in zip(b, (float(x) for x in predicted))]
    fig = go.Figure([go.Bar(x=list(labels), y=b, name="before", marker_color="#9a9a9a"),
                     go.Bar(x=list(labels), y=[float(v) for v in after], name="after", marker_color="#4062bb"),
                     go.Scatter(x=list(labels), y=pred, mode="markers", name="predicted after (graph)",
                                marker={"color": "#d62728", "symbol": "x", "size": 12})])
    fig.update_layout(title=_title(f"targets before and after the intervention ({mode})", title), barmode="group",
                      xaxis_title="target", xaxis_type="category", yaxis_title="value", template="plotly_white")
    return fig


__all__ = ["grid_heatmap", "effect_bars", "intervention_bars", "sweep_heatmap", "attribution_scatter", "mask_ranking",
           "transplant_trajectory",
           "neuron_contrast_heatmap", "overlap_heatmap"]
