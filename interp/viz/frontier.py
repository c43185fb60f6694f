"""The refusal-vs-damage frontier as figures (plain lists in, plotly out): heretic-style trial scatter with the
Pareto front, and the confirmed points with their held-out intervals, random controls and the chosen point."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots


def frontier_figure(trials: Mapping[str, Sequence[Any]], points: Mapping[str, Sequence[float]], baseline: float,
                    chosen: int | None, title: str = "Refusal vs damage frontier") -> go.Figure:
    """Left: every trial's validation refusal score vs harmless first-token KL (``trials``: ``score``, ``kl`` and
    ``front``, the Pareto front's indices into the trials, joined). Right: the confirmed points' held-out harmful
    refusal rate [95% CI] vs KL (``points``: ``rate``, ``lo``, ``hi``, ``kl``, ``control_rate``, ``control_kl``),
    each random control at its own KL, the ``baseline`` rate dashed and the ``chosen`` point (index into them)."""
    missing = [k for k in ("score", "kl", "front") if k not in trials] + [
        k for k in ("rate", "lo", "hi", "kl", "control_rate", "control_kl") if k not in points]
    if missing:
        raise KeyError(f"frontier_figure needs trials['score', 'kl', 'front'] and points['rate', 'lo', 'hi', 'kl', "
                       f"'control_rate', 'control_kl']; missing {missing}")
    trial_score, trial_kl, front = trials["score"], trials["kl"], trials["front"]
    rate, lo, hi, kl = points["rate"], points["lo"], points["hi"], points["kl"]
    control_rate, control_kl = points["control_rate"], points["control_kl"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("trials (validation, screened)",
                                                        "frontier (held-out, confirmed)"))
    fig.add_trace(go.Scatter(x=list(trial_kl), y=list(trial_score), mode="markers", name="trial",
                             marker=dict(color="#9ecae1", size=6)), row=1, col=1)
    order = sorted(front, key=lambda i: trial_kl[i])
    fig.add_trace(go.Scatter(x=[trial_kl[i] for i in order], y=[trial_score[i] for i in order],
                             mode="lines+markers", name="Pareto front", line=dict(color="#08519c")), row=1, col=1)
    err = dict(type="data", symmetric=False, array=[h - r for h, r in zip(hi, rate)],
               arrayminus=[r - low for r, low in zip(rate, lo)])
    fig.add_trace(go.Scatter(x=list(kl), y=list(rate), mode="markers+lines", error_y=err, name="frontier point",
                             line=dict(color="#2ca02c")), row=1, col=2)
    fig.add_trace(go.Scatter(x=list(control_kl), y=list(control_rate), mode="markers", name="random control",
                             marker=dict(color="#bcbd22", symbol="x", size=9)), row=1, col=2)
    if chosen is not None:
        fig.add_trace(go.Scatter(x=[kl[chosen]], y=[rate[chosen]], mode="markers", name="chosen",
                                 marker=dict(color="#d62728", symbol="star", size=16)), row=1, col=2)
    fig.add_hline(y=float(baseline), line_dash="dash", line_color="gray", row=1, col=2,
                  annotation_text="no edit")
    fig.update_xaxes(title_text="harmless first-token KL", row=1, col=1)
    fig.update_xaxes(title_text="harmless first-token KL", row=1, col=2)
    fig.update_yaxes(title_text="refusal score (log-odds)", row=1, col=1)
    fig.update_yaxes(title_text="harmful refusal rate", row=1, col=2)
    fig.update_layout(title=title, height=420)
    return fig


__all__ = ["frontier_figure"]
