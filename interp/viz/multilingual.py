"""Figures for the multilingual safety studies: refusal retention by layer (projection ratio with its interval,
cosine drift to the source language, the language's own direction against the source's) and refusal rates per
language and condition. Inputs are plain arrays and mappings; this module imports nothing of ours except ``viz``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from interp.viz.directions_similarity import _PALETTE, _band, _floats


def retention_by_layer(layers: Sequence[Any], ratio: Mapping[str, Any], ratio_ci: Mapping[str, Any],
                       drift: Mapping[str, Any], own_cosine: Mapping[str, Any], split_half: Any, random_cosine: float,
                       source: str = "en", title: str = "refusal retention across languages by layer") -> Any:
    """Three panels by layer, one line per language: the projection ratio on the source direction (band: 95%
    bootstrap interval), the centred cosine with the source-language parallel prompt, and the cosine of the
    language's own refusal direction with the source's (dotted: the source's split-half cosine and the random level)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    x = [str(v) for v in layers]
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True,
                        subplot_titles=(f"projection ratio on the {source} refusal direction",
                                        f"centred cosine with the {source} parallel prompt",
                                        f"cosine of the language's own direction with the {source} one"))
    for i, lang in enumerate(ratio):
        color = _PALETTE[i % len(_PALETTE)]
        lo, hi = ratio_ci[lang][0], ratio_ci[lang][1]
        _band(go, fig, x, lo, hi, color, f"{lang} 95% CI", row=1)
        fig.add_trace(go.Scatter(x=x, y=_floats(ratio[lang]), mode="lines+markers", name=f"{lang} ratio",
                                 line={"color": color}), row=1, col=1)
        if lang != source:
            fig.add_trace(go.Scatter(x=x, y=_floats(drift[lang]), mode="lines+markers", name=f"{lang} drift",
                                     line={"color": color}), row=2, col=1)
            fig.add_trace(go.Scatter(x=x, y=_floats(own_cosine[lang]), mode="lines+markers", name=f"{lang} own",
                                     line={"color": color}), row=3, col=1)
    fig.add_trace(go.Scatter(x=x, y=_floats(split_half), mode="lines", name=f"{source} split-half",
                             line={"color": "gray", "dash": "dot"}), row=3, col=1)
    fig.add_hline(y=random_cosine, line_dash="dash", line_color="lightgray", row=3, col=1)
    fig.add_hline(y=1, line_color="lightgray", row=1, col=1)
    fig.update_layout(title=title, template="plotly_white", height=900)
    fig.update_xaxes(title_text="layer", row=3, col=1)
    return fig


def rates_by_language(rows: Sequence[Mapping[str, Any]], title: str = "refusal rate by language") -> Any:
    """Grouped bars: refusal rate per language, one bar per ``set/condition``, with Wilson intervals (``low``/``high``)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    keys = list(dict.fromkeys(f"{r['set']}/{r['condition']}" for r in rows))
    for i, key in enumerate(keys):
        sel = [r for r in rows if f"{r['set']}/{r['condition']}" == key]
        fig.add_trace(go.Bar(x=[r["lang"] for r in sel], y=[r["rate"] for r in sel], name=key,
                             marker_color=_PALETTE[i % len(_PALETTE)],
                             error_y={"type": "data", "symmetric": False,
                                      "array": [r["high"] - r["rate"] for r in sel],
                                      "arrayminus": [r["rate"] - r["low"] for r in sel]}))
    fig.update_layout(title=title, barmode="group", yaxis_title="refusal rate", yaxis_range=[0, 1],
                      template="plotly_white")
    return fig


def language_geometry(layers: Sequence[Any], accuracy: Any, ci: Any, chance: float, overlap: Any,
                      random_overlap: float, ratio: Mapping[str, Mapping[str, Any]], source: str = "en",
                      title: str = "language identity against the refusal direction, by layer") -> Any:
    """Three panels by layer: language-identity accuracy (band: ``ci [2, L]``; dotted: chance), the refusal
    direction's overlap with the language subspace (dotted: a random direction's), and each language's projection
    ratio on the ``source`` direction under each condition of ``ratio[condition][lang] [L]`` (before, leace, random)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    x = [str(v) for v in layers]
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True,
                        subplot_titles=("language identity accuracy (nearest language mean)",
                                        "overlap of the refusal direction with the language subspace",
                                        f"projection ratio on the {source} refusal direction, per erasure"))
    _band(go, fig, x, ci[0], ci[1], _PALETTE[0], "identity 95% CI", row=1)
    fig.add_trace(go.Scatter(x=x, y=_floats(accuracy), mode="lines+markers", name="identity accuracy",
                             line={"color": _PALETTE[0]}), row=1, col=1)
    fig.add_hline(y=chance, line_dash="dot", line_color="gray", annotation_text="chance", row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=_floats(overlap), mode="lines+markers", name="overlap",
                             line={"color": _PALETTE[1]}), row=2, col=1)
    fig.add_hline(y=random_overlap, line_dash="dot", line_color="gray", annotation_text="random direction", row=2, col=1)
    dashes = ("solid", "dash", "dot", "dashdot")
    for c, cond in enumerate(ratio):
        for i, lang in enumerate(ratio[cond]):
            fig.add_trace(go.Scatter(x=x, y=_floats(ratio[cond][lang]), mode="lines+markers", name=f"{lang} {cond}",
                                     line={"color": _PALETTE[(i + 2) % len(_PALETTE)], "dash": dashes[c % 4]}),
                          row=3, col=1)
    fig.update_yaxes(title_text="accuracy", row=1, col=1)
    fig.update_yaxes(title_text="squared projection", row=2, col=1)
    fig.update_yaxes(title_text="ratio", row=3, col=1)
    fig.update_xaxes(title_text="layer", row=3, col=1)
    fig.update_layout(title=title, template="plotly_white", height=900)
    return fig


def neuron_effects(labels: Sequence[str], delta: Sequence[float], random_mean: Sequence[float],
                   random_lo: Sequence[float], random_hi: Sequence[float],
                   title: str = "refusal score change when a neuron set is ablated") -> Any:
    """Bars: the change of the mean refusal score when each set is ablated on each language's prompts; beside them
    the same-size random sets' mean with their 2.5-97.5% range (the control)."""
    import plotly.graph_objects as go

    mean = _floats(random_mean)
    fig = go.Figure(go.Bar(x=list(labels), y=_floats(delta), name="neuron set ablated", marker_color=_PALETTE[0]))
    fig.add_trace(go.Scatter(x=list(labels), y=mean, mode="markers", name="random sets (mean, 95% range)",
                             marker={"color": "gray", "size": 10, "symbol": "diamond"},
                             error_y={"type": "data", "symmetric": False,
                                      "array": [h - m for h, m in zip(_floats(random_hi), mean)],
                                      "arrayminus": [m - lo for m, lo in zip(mean, _floats(random_lo))]}))
    fig.update_layout(title=title, xaxis_title="neuron set on prompts", xaxis_type="category",
                      yaxis_title="change of the mean refusal score", template="plotly_white")
    return fig


def patching_by_layer(layers: Sequence[Any], sites: Sequence[str], restored: Mapping[str, Any],
                      control: Mapping[str, Any], source: str = "en",
                      title: str = "share of the refusal gap restored by patching, by layer") -> Any:
    """One panel per site: for each language the share of its refusal-score gap that patching the ``source`` run's
    activations closes (``restored[lang] [L, n_sites]``, solid) and the same from harmless sources (dotted)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    x = [str(v) for v in layers]
    fig = make_subplots(rows=1, cols=len(sites), shared_yaxes=True, subplot_titles=list(sites))
    for i, lang in enumerate(restored):
        color = _PALETTE[i % len(_PALETTE)]
        for j, _ in enumerate(sites):
            for what, data, dash in (("restored", restored, "solid"), ("control", control, "dot")):
                fig.add_trace(go.Scatter(x=x, y=_floats(data[lang][:, j]), mode="lines+markers",
                                         name=f"{lang} {what}", legendgroup=f"{lang} {what}", showlegend=j == 0,
                                         line={"color": color, "dash": dash}), row=1, col=j + 1)
        fig.update_xaxes(title_text="layer")
    fig.update_yaxes(title_text=f"share of the gap to {source} closed", row=1, col=1)
    fig.update_layout(title=title, template="plotly_white")
    return fig
