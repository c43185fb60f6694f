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
