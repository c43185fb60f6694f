"""Figures of the refusal-direction analysis (plain tensors and dicts in, plotly figures out)."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

Band = tuple[Sequence[float], Sequence[float] | None, Sequence[float] | None]
"""Rates with their intervals, one per bar: ``(rates, lows, highs)`` (``lows`` / ``highs`` may be ``None``)."""

BETTER, NEUTRAL, WORSE = "#2166ac", "#f7f7f7", "#b2182b"  # one meaning in every candidate map: blue = better


def _diverging(z: torch.Tensor, mid: float, lower_is_better: bool) -> dict:
    """Heatmap colour settings: white at ``mid`` (the filter's threshold), blue on the side that helps selection.
    NaN cells (candidates not scored) are left out of the range and drawn empty."""
    z = z[~z.isnan()]
    if z.numel() == 0:
        z = torch.tensor([mid])
    zmin, zmax = min(float(z.min()), mid), max(float(z.max()), mid)
    if zmax - zmin < 1e-12:
        zmax = zmin + 1.0
    t = (mid - zmin) / (zmax - zmin)
    low, high = (BETTER, WORSE) if lower_is_better else (WORSE, BETTER)
    stops = [[0.0, low], [t, NEUTRAL], [1.0, high]] if 0.0 < t < 1.0 else (
        [[0.0, NEUTRAL], [1.0, high]] if t <= 0.0 else [[0.0, low], [1.0, NEUTRAL]])
    return dict(colorscale=stops, zmin=zmin, zmax=zmax)


def candidate_heatmaps(bypass: torch.Tensor, induce: torch.Tensor, kl: torch.Tensor, layers: Sequence[int],
                       pos_labels: Sequence[str], chosen: tuple[int, int] | None,
                       thresholds: tuple[float, float, float] | None = None) -> go.Figure:
    """Three heatmaps over layer x post-instruction position (``[layers, P]`` each), the chosen candidate marked.

    One colour meaning throughout: blue is better for selection (low bypass, high induce, low KL), red worse,
    white at each filter's threshold ``(baseline harmful refusal score, induce threshold, KL threshold)``
    (default: each map's median). Colourbars sit under their panels, titled there, clear of the axes.
    """
    panels = ((bypass, "bypass: refusal score,<br>direction ablated (harmful)", True,
               "blue: lower = better<br>white: harmful baseline"),
              (induce, "induce: refusal score,<br>direction added (harmless)", False,
               "blue: higher = better<br>white: induce threshold"),
              (kl, "KL on harmless,<br>direction ablated", True, "blue: lower = better<br>white: KL threshold"))
    fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t, _, _ in panels], horizontal_spacing=0.07)
    x = [f"{p} ({i - len(pos_labels)})" if p else str(i - len(pos_labels)) for i, p in enumerate(pos_labels)]
    for c, (z, _, lower_better, bar_title) in enumerate(panels, start=1):
        mid = float(z.nanmedian()) if thresholds is None else float(thresholds[c - 1])
        dom = fig.layout[f"xaxis{'' if c == 1 else c}"].domain
        fig.add_trace(go.Heatmap(z=z.tolist(), x=x, y=list(layers), **_diverging(z, mid, lower_better),
                                 colorbar=dict(orientation="h", x=(dom[0] + dom[1]) / 2, xanchor="center",
                                               y=-0.22, yanchor="top", len=dom[1] - dom[0], thickness=12,
                                               title=dict(text=bar_title, side="top")),
                                 hovertemplate="layer %{y}<br>position %{x}<br>%{z:.3f}<extra></extra>"),
                      row=1, col=c)
        if chosen is not None:
            fig.add_trace(go.Scatter(x=[x[chosen[1]]], y=[layers[chosen[0]]], mode="markers",
                                     marker=dict(symbol="x", size=14, color="black", line=dict(width=2)),
                                     name="selected", showlegend=False,
                                     hovertemplate="selected candidate<extra></extra>"), row=1, col=c)
    fig.update_yaxes(title_text="layer", dtick=1, row=1, col=1)
    fig.update_yaxes(dtick=1)
    fig.update_layout(height=580, margin=dict(t=120, b=190),
                      title="Candidate directions (difference of means at resid_pre)<br>"
                            "<sup>x marks the selected candidate</sup>")
    return fig


def projections_by_layer(harmful: torch.Tensor, harmless: torch.Tensor, layers: Sequence[int]) -> go.Figure:
    """Projection of harmful / harmless prompts on the direction at every layer (``[n, n_layers]`` each)."""
    fig = go.Figure()
    for name, proj, color in (("harmful", harmful, "#d62728"), ("harmless", harmless, "#1f77b4")):
        xs = [str(layer) for layer in layers for _ in range(proj.shape[0])]
        fig.add_trace(go.Box(x=xs, y=proj.T.flatten().tolist(), name=name, marker_color=color, boxpoints=False))
    fig.update_layout(boxmode="group", title="Projection on the refusal direction, layer by layer",
                      xaxis_title="layer (resid_pre, last token)", yaxis_title="projection", height=380)
    return fig


def refusal_rates(rates: dict[str, float], intervals: dict[str, Sequence[float]] | None = None,
                  judge: str = "anchored phrase judge", title: str | None = None) -> go.Figure:
    """Refusal rate under each condition (baselines, interventions, random controls), with 95% intervals
    ``{condition: (low, high)}`` as error bars when given; ``title`` replaces the test-prompt title."""
    names = list(rates)
    colors = ["#7f7f7f" if "baseline" in n else "#bcbd22" if ("random" in n or "orthogonal" in n) else "#2ca02c"
              for n in names]
    err = None
    if intervals:
        err = dict(type="data", symmetric=False, array=[100 * (intervals[n][1] - rates[n]) for n in names],
                   arrayminus=[100 * (rates[n] - intervals[n][0]) for n in names])
    fig = go.Figure(go.Bar(x=names, y=[100 * rates[n] for n in names], marker_color=colors, error_y=err,
                           text=[f"{100 * rates[n]:.0f}%" for n in names], textposition="outside"))
    fig.update_layout(title=title or f"Refusal rate on test prompts ({judge} over generations; bars: 95% Wilson "
                                     "intervals)",
                      yaxis=dict(title="refusal rate (%)", range=[0, 115]), height=440)
    return fig


def cosine_heatmap(vectors: torch.Tensor, layers: Sequence[int], title: str, zero_note: str | None = None
                   ) -> go.Figure:
    """Cosine similarity between per-layer candidates ``[n_layers, d]``.

    A candidate of (near) zero norm has no direction: its row and column are left empty and a note under the
    figure names those layers, with ``zero_note`` saying why (e.g. resid_pre at layer 0 is the embedding).
    """
    v = vectors.float()
    norms = v.norm(dim=-1)
    zero = norms <= 1e-6 * max(float(norms.max()), 1e-30)
    cos = torch.nn.functional.normalize(v, dim=-1) @ torch.nn.functional.normalize(v, dim=-1).T
    cos[zero, :] = float("nan")
    cos[:, zero] = float("nan")
    z = [[None if c != c else c for c in row] for row in cos.tolist()]
    fig = go.Figure(go.Heatmap(z=z, x=list(layers), y=list(layers), zmin=-1, zmax=1, colorscale="RdBu_r",
                               colorbar=dict(title=dict(text="cosine", side="top"))))
    fig.update_layout(title=title, xaxis=dict(title="layer", dtick=1), yaxis=dict(title="layer", dtick=1),
                      height=460, width=600)
    dead = [layers[i] for i in torch.nonzero(zero).flatten().tolist()]
    if dead:
        text = f"empty: layer{'s' if len(dead) > 1 else ''} {', '.join(map(str, dead))} (zero-norm candidate)"
        if zero_note:
            text += "<br>" + zero_note
        fig.add_annotation(text=text, xref="paper", yref="paper", x=0, y=-0.2, xanchor="left", yanchor="top",
                           showarrow=False, align="left", font=dict(size=12))
        fig.update_layout(margin=dict(b=140), height=520)
    return fig


def subspace_curve(ranks: Sequence[int], rates: Sequence[float], scores: Sequence[float], baseline: float | None,
                   control_rates: Sequence[float] | None = None, control_scores: Sequence[float] | None = None,
                   baseline_score: float | None = None) -> go.Figure:
    """Harmful refusal rate (top) and refusal score (bottom) when ablating subspaces of rank 1..k, one x axis.

    ``control_*`` are the same measures for random subspaces of the same ranks: the curve to beat; ``baseline``
    (rate) and ``baseline_score``: the dashed no-ablation levels, drawn when given.
    """
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("harmful refusal rate (%)", "mean refusal score on harmful prompts"))
    r = list(ranks)
    for row, ys, ctrl, base in ((1, [100 * v for v in rates], control_rates and [100 * v for v in control_rates],
                                 None if baseline is None else 100 * baseline),
                                (2, list(scores), control_scores, baseline_score)):
        fig.add_trace(go.Scatter(x=r, y=ys, mode="lines+markers", name="refusal direction + per-category",
                                 line=dict(color="#d62728"), legendgroup="real", showlegend=row == 1), row=row, col=1)
        if ctrl:
            fig.add_trace(go.Scatter(x=r, y=list(ctrl), mode="lines+markers", name="random subspace (control)",
                                     line=dict(color="#7f7f7f", dash="dot"), legendgroup="ctrl",
                                     showlegend=row == 1), row=row, col=1)
        if base is not None:
            fig.add_hline(y=base, line_dash="dash", line_color="gray", annotation_text="no ablation",
                          annotation_position="top right", row=row, col=1)
    fig.update_yaxes(title_text="rate (%)", range=[-5, 105], row=1, col=1)
    fig.update_yaxes(title_text="score", row=2, col=1)
    fig.update_xaxes(title_text="rank of the ablated subspace (refusal direction first, then per-category)",
                     dtick=1, row=2, col=1)
    fig.update_layout(title="Ablating subspaces of rank 1..k (harmful test prompts)", height=560,
                      legend=dict(orientation="h", x=0, y=-0.18))
    return fig


def writer_bars(labels: Sequence[str], ablated: Band, control: Band,
                baseline: tuple[float, tuple[float, float] | None] | None = None,
                title: str = "Refusal rate with the direction ablated from one group of writers") -> go.Figure:
    """Refusal rate (0..1 in, % shown) per writer group with its interval (``ablated = (rates, lows, highs)``), the
    control beside each (``control``, the same), and a dashed line at the rate with nothing ablated (``baseline =
    (rate, (low, high) or None)``, the interval shaded)."""
    rates, lows, highs = ablated
    control_rates, control_lows, control_highs = control
    baseline, baseline_interval = baseline if baseline is not None else (None, None)
    n = len(labels)
    if not all(len(s) == n for s in (rates, lows, highs, control_rates)):
        raise ValueError("writer_bars needs one rate, low, high and control rate per label")

    def err(r: Sequence[float], lo: Sequence[float] | None, hi: Sequence[float] | None) -> dict | None:
        if lo is None or hi is None:
            return None
        return dict(type="data", symmetric=False, array=[100 * (h - v) for v, h in zip(r, hi)],
                    arrayminus=[100 * (v - low) for v, low in zip(r, lo)])

    fig = go.Figure()
    for name, r, lo, hi, color in (("refusal direction ablated", rates, lows, highs, "#d62728"),
                                   ("orthogonal control ablated", control_rates, control_lows, control_highs,
                                    "#9a9a9a")):
        fig.add_trace(go.Bar(x=list(labels), y=[100 * v for v in r], name=name, marker_color=color,
                             error_y=err(r, lo, hi), hovertemplate="%{x}: %{y:.0f}%<extra>" + name + "</extra>"))
    if baseline is not None:
        if baseline_interval is not None:
            fig.add_hrect(y0=100 * baseline_interval[0], y1=100 * baseline_interval[1], fillcolor="gray", opacity=0.12,
                          line_width=0)
        fig.add_hline(y=100 * baseline, line_dash="dash", line_color="gray", annotation_text="nothing ablated",
                      annotation_position="top right")
    fig.update_layout(barmode="group", title=title + "<br><sup>whiskers: 95% intervals; grey band: the interval with nothing ablated</sup>", height=440,
                      xaxis_title="writers the direction is ablated from",
                      yaxis=dict(title="harmful refusal rate (%)", range=[0, 110]),
                      legend=dict(orientation="h", x=0, y=-0.25))
    return fig


def filter_counts(rules: Sequence[str], passing: Sequence[int], total: int | None, note: str = "") -> go.Figure:
    """How many candidates pass each selection filter (``rules``: the filters' rules, the last one all together),
    out of ``total``; ``note`` (e.g. the selected candidate) under the title."""
    fig = go.Figure(go.Bar(x=[int(v) for v in passing], y=list(rules), orientation="h", marker_color="#4062bb",
                           text=[f"{int(v)}" + (f" of {total}" if total else "") for v in passing],
                           textposition="outside", hovertemplate="%{y}: %{x}<extra></extra>"))
    fig.update_layout(title="Candidates passing each selection filter" + (f"<br><sup>{note}</sup>" if note else ""),
                      xaxis=dict(title="candidates (layer x position)", range=[0, 1.15 * max([total or 0, *passing, 1])]),
                      yaxis=dict(title="filter", autorange="reversed"), height=360, template="plotly_white")
    return fig
