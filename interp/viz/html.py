"""Self-contained HTML pages: plotly figures (plotly.js inlined once), tables and notes."""

from __future__ import annotations

import html
from typing import Any


def page(title: str, sections: list[tuple[str, Any]]) -> str:
    """An HTML page of ``(heading, figure | html string)`` sections; plotly.js is inlined in the first figure."""
    body, first = [], True
    for heading, content in sections:
        body.append(f"<h2>{html.escape(heading)}</h2>")
        if hasattr(content, "to_html"):
            body.append(content.to_html(full_html=False, include_plotlyjs=True if first else False))
            first = False
        else:
            body.append(str(content))
    style = ("body{font-family:system-ui,sans-serif;max-width:1300px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;font-size:14px}td,th{border:1px solid #ccc;padding:4px 8px;"
             "text-align:left;vertical-align:top}th{background:#f3f3f3}.note{background:#fff6d6;padding:8px}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>{''.join(body)}</body></html>")


def kv_table(rows: list[tuple[str, Any]]) -> str:
    return "<table>" + "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>"
                               for k, v in rows) + "</table>"


def table(header: list[str], rows: list[list[Any]]) -> str:
    """A plain HTML table: one header row, then ``rows`` (each a list of cells, floats to 4 significant digits)."""
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
