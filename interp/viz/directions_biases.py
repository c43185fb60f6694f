"""Figures of the bias-direction study: AUROC by layer with its baselines, LODO bars, recovery vs random,
overlap heatmaps, cosines between checkpoints. Inputs are plain tensors, lists and dicts; nothing of ours imported."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")


def _go() -> Any:
    import plotly.graph_objects as go

    return go


def _layer_labels(sites: Sequence[str]) -> list[str]:
    out = []
    for s in sites:
        parts = str(s).split(".")
        out.append(f"L{parts[1]}" if len(parts) >= 3 and parts[0] == "blocks" else str(s))
    return out


def auroc_by_layer(auroc: Mapping[str, Any], control: Mapping[str, Any], lexical: Mapping[str, float],
                   sites: Sequence[str], title: str = "held-out AUROC by layer") -> Any:
    """One line per bias (AUROC ``[n_layers]``), its shuffled-label control dotted and its lexical baseline
    (one number) dashed, in the bias's colour; chance at 0.5."""
    go = _go()
    fig = go.Figure()
    x = _layer_labels(sites)
    for i, name in enumerate(auroc):
        c = _PALETTE[i % len(_PALETTE)]
        fig.add_trace(go.Scatter(x=x, y=torch.as_tensor(auroc[name]).tolist(), name=name, mode="lines+markers",
                                 line={"color": c}))
        if name in control:
            fig.add_trace(go.Scatter(x=x, y=torch.as_tensor(control[name]).tolist(), name=f"{name} shuffled",
                                     mode="lines", line={"color": c, "dash": "dot"}, showlegend=False))
        if name in lexical:
            fig.add_trace(go.Scatter(x=x, y=[float(lexical[name])] * len(x), name=f"{name} lexical", mode="lines",
                                     line={"color": c, "dash": "dash"}, showlegend=False))
    fig.add_hline(y=0.5, line={"color": "grey", "width": 1})
    fig.update_layout(title=title + " (dotted: shuffled labels; dashed: bag-of-tokens baseline)",
                      xaxis_title="layer", yaxis_title="AUROC", yaxis_range=[0, 1.02])
    return fig


def lodo_bars(rows: Mapping[str, tuple[Sequence[float], Sequence[float] | None, Sequence[str]]],
              threshold: float | None = None, title: str = "leave-one-dataset-out AUROC") -> Any:
    """Grouped bars: for each bias, the LODO AUROC of each held-out source (probe), and the lexical baseline's
    beside it (hatched) when given; ``threshold``: the transfer line."""
    go = _go()
    fig = go.Figure()
    sources = sorted({s for _, _, srcs in rows.values() for s in srcs})
    for i, src in enumerate(sources):
        c = _PALETTE[i % len(_PALETTE)]
        xs = [b for b, (_, _, srcs) in rows.items() if src in srcs]
        ys = [rows[b][0][list(rows[b][2]).index(src)] for b in xs]
        fig.add_trace(go.Bar(x=xs, y=ys, name=f"probe, held out {src}", marker_color=c))
        lx = [b for b in xs if rows[b][1] is not None]
        if lx:
            ly = [rows[b][1][list(rows[b][2]).index(src)] for b in lx]
            fig.add_trace(go.Bar(x=lx, y=ly, name=f"lexical, held out {src}", marker_color=c,
                                 marker_pattern_shape="/", opacity=0.5))
    if threshold is not None:
        fig.add_hline(y=threshold, line={"color": "black", "dash": "dash"})
    fig.update_layout(title=title, barmode="group", yaxis_title="AUROC", yaxis_range=[0, 1.02])
    return fig


def recovery_bars(rates: Mapping[str, tuple[Mapping[str, Any], Mapping[str, Any]]],
                  title: str = "recovery of the uncued answer") -> Any:
    """Per bias: the recovery rate steering against its direction vs against random directions, with the 95%
    Wilson intervals; ``rates[bias] = (direction rate, random rate)``, each ``{"rate", "k", "n", "ci95"}``."""
    go = _go()
    fig = go.Figure()
    for i, label in enumerate(("bias direction", "random (same norm)")):
        xs = list(rates)
        rs = [rates[b][i] for b in xs]
        ys = [r["rate"] if r["n"] else 0.0 for r in rs]
        fig.add_trace(go.Bar(x=xs, y=ys, name=label, marker_color=_PALETTE[i],
                             error_y={"type": "data", "symmetric": False,
                                      "array": [r["ci95"][1] - y for r, y in zip(rs, ys, strict=True)],
                                      "arrayminus": [y - r["ci95"][0] for r, y in zip(rs, ys, strict=True)]},
                             text=[f"{r['k']}/{r['n']}" for r in rs], textposition="outside"))
    fig.update_layout(title=title, barmode="group", yaxis_title="recovery rate", yaxis_range=[0, 1.1])
    return fig


def overlap_heatmap(cosine: Any, names: Sequence[str], angles: Any = None, title: str = "overlap") -> Any:
    """Heatmap of ``cosine [B, B]``; with ``angles [B, B]`` (degrees) each cell also shows the angle."""
    go = _go()
    c = torch.as_tensor(cosine, dtype=torch.float64)
    text = [[f"{c[i, j]:.2f}" + ("" if angles is None else f"<br>{float(angles[i][j]):.0f}°")
             for j in range(c.shape[1])] for i in range(c.shape[0])]
    fig = go.Figure(go.Heatmap(z=c.tolist(), x=list(names), y=list(names), zmin=-1, zmax=1, colorscale="RdBu",
                               reversescale=True, text=text, texttemplate="%{text}", colorbar={"title": "cosine"}))
    fig.update_layout(title=title, yaxis_autorange="reversed")
    return fig


def checkpoint_cosines(cosine: Any, names: Sequence[str], sites: Sequence[str], chance: float | None = None,
                       title: str = "cosine between checkpoints") -> Any:
    """One line per bias of ``cosine [B, n_layers]`` against layer; ``chance``: random-direction |cosine| line."""
    go = _go()
    fig = go.Figure()
    x = _layer_labels(sites)
    c = torch.as_tensor(cosine, dtype=torch.float64)
    for i, name in enumerate(names):
        fig.add_trace(go.Scatter(x=x, y=c[i].tolist(), name=name, mode="lines+markers",
                                 line={"color": _PALETTE[i % len(_PALETTE)]}))
    if chance is not None:
        fig.add_hline(y=chance, line={"color": "grey", "dash": "dot"})
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title="cosine", yaxis_range=[-1, 1.02])
    return fig
