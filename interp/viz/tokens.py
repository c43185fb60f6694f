"""Token-level figures: heat text (each token shaded by a value, hover shows it) and a concentration curve
(cumulative share of a total held by the top fraction of items)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any


def token_html(tok: str) -> str:
    """A token's text made visible and safe in HTML (newline and tab as arrows, whitespace kept)."""
    vis = tok.replace("\n", "\u21b5").replace("\t", "\u2192")
    return html.escape(vis).replace(" ", "&nbsp;") if vis.strip() == "" else html.escape(vis)


def _shade(v: float, scale: float, diverging: bool) -> str:
    a = max(-1.0, min(1.0, v / scale)) if scale else 0.0
    if a >= 0 or not diverging:
        return f"rgba(255,90,0,{max(a, 0.0):.3f})"
    return f"rgba(30,110,255,{-a:.3f})"


def heat_text(lines: Sequence[Sequence[str]], values: Sequence[Sequence[float]], title: str | None = None,
              prefixes: Sequence[str] | None = None, marks: Sequence[int | None] | None = None,
              scale: float | None = None, diverging: bool = False, line_class: str = "heat-line") -> str:
    """An HTML snippet: one line per token sequence, each token shaded by its value (hover: the value).

    ``diverging``: negative values in blue, positive in orange (else negatives draw unshaded); ``scale``: the
    magnitude drawn at full colour (default the largest shown); ``prefixes``: grey text before each line;
    ``marks``: the index of a token to underline in each line."""
    if len(lines) != len(values):
        raise ValueError(f"{len(lines)} token lines but {len(values)} value lines")
    top = scale or max((abs(v) if diverging else v for vs in values for v in vs), default=1.0) or 1.0
    rows = []
    for i, (toks, vals) in enumerate(zip(lines, values)):
        if len(toks) != len(vals):
            raise ValueError(f"line {i} has {len(toks)} tokens but {len(vals)} values")
        mark = marks[i] if marks is not None else None
        spans = "".join(
            f'<span style="background:{_shade(v, top, diverging)};'
            f'{"border-bottom:2px solid #c00;" if j == mark else ""}" title="{v:.3f}">{token_html(t)}</span>'
            for j, (t, v) in enumerate(zip(toks, vals)))
        pre = f'<span style="color:#888">{html.escape(prefixes[i])} </span>' if prefixes is not None else ""
        rows.append(f'<div class="{line_class}" style="margin:2px 0;font-family:monospace;white-space:pre-wrap">'
                    f'{pre}{spans}</div>')
    head = f'<div style="font-weight:bold">{html.escape(title)}</div>\n' if title else ""
    return f'<div class="heat-text">{head}{chr(10).join(rows)}\n</div>'


def concentration_curve(shares: Sequence[float], marks: dict[str, float] | None = None,
                        title: str = "concentration", x_title: str = "top fraction of tokens",
                        y_title: str = "share of total positive gain") -> Any:
    """Cumulative share (``shares[k]``: share held by the top ``k + 1`` items) against the top fraction, with the
    equal-share diagonal; ``marks``: labelled points (e.g. ``{"top 10%": 0.1}``) drawn on the curve."""
    import plotly.graph_objects as go

    n = len(shares)
    xs = [(k + 1) / n for k in range(n)]
    fig = go.Figure([go.Scatter(x=[0, *xs], y=[0.0, *shares], mode="lines", name="observed"),
                     go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line=dict(dash="dot", color="#999"),
                                name="equal shares")])
    for label, frac in (marks or {}).items():
        k = max(1, min(n, round(frac * n) if frac * n >= 1 else 1))
        fig.add_trace(go.Scatter(x=[xs[k - 1]], y=[shares[k - 1]], mode="markers+text", text=[label],
                                 textposition="bottom right", showlegend=False))
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, yaxis_range=[0, 1.02])
    return fig


def token_values(labels: Sequence[str], values: Sequence[float], title: str = "per token",
                 y_title: str = "value") -> Any:
    """One bar per token (``labels`` on the x axis, in order), e.g. a response's per-token log-probs."""
    import plotly.graph_objects as go

    fig = go.Figure([go.Bar(x=list(labels), y=[float(v) for v in values])])
    return fig.update_layout(title=title, xaxis_title="token", yaxis_title=y_title, template="plotly_white")


__all__ = ["concentration_curve", "heat_text", "token_html", "token_values"]
