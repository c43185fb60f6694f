"""Plotly figures for probe results. Inputs are plain tensors, lists and frames; this module never imports ``probes``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")


def _go() -> Any:
    import plotly.graph_objects as go

    return go


def _as2d(v: Any) -> torch.Tensor:
    t = torch.as_tensor(v, dtype=torch.float64)
    return t[None] if t.dim() == 1 else t


def _labels(sites: Sequence[str] | None, n: int) -> list[str]:
    if sites is None:
        return [str(i) for i in range(n)]
    out = []
    for s in sites:
        parts = str(s).split(".")
        out.append(f"L{parts[1]} {parts[2].removeprefix('hook_')}" if len(parts) >= 3 and parts[0] == "blocks" else str(s))
    return out


def layer_scores(scores: Mapping[str, Any], sites: Sequence[str] | None = None, title: str = "scores by layer",
                 chance: float | None = 0.5) -> Any:
    """Lines of mean score against layer with a +-1 std band over folds; ``scores[name]`` is ``[n_folds, n_layers]``."""
    go = _go()
    fig = go.Figure()
    n_layers = None
    for i, (name, v) in enumerate(scores.items()):
        t = _as2d(v)
        n_layers = t.shape[1]
        x = _labels(sites, n_layers)
        mean = t.mean(0)
        std = t.std(0) if t.shape[0] > 1 else torch.zeros_like(mean)
        color = _PALETTE[i % len(_PALETTE)]
        fig.add_trace(go.Scatter(x=x + x[::-1], y=(mean + std).tolist() + (mean - std).tolist()[::-1], fill="toself",
                                 line={"width": 0}, fillcolor=color, opacity=0.2, hoverinfo="skip", showlegend=False))
        fig.add_trace(go.Scatter(x=x, y=mean.tolist(), mode="lines+markers", name=name, line={"color": color}))
    if chance is not None and n_layers is not None:
        fig.add_hline(y=chance, line_dash="dot", line_color="gray", annotation_text="chance")
    fig.update_layout(title=title, xaxis_title="site", yaxis_title="held-out score", template="plotly_white")
    return fig


def cosine_heatmap(matrix: Any, x_labels: Sequence[str] | None = None, y_labels: Sequence[str] | None = None,
                   title: str = "cosine similarity") -> Any:
    """Heatmap of a ``[n_a, n_b]`` cosine matrix (layers x layers, methods x methods, or models)."""
    go = _go()
    m = torch.as_tensor(matrix, dtype=torch.float64)
    xl = _labels(x_labels, m.shape[1]) if x_labels is None or all(str(s).startswith("blocks.") for s in x_labels) \
        else list(map(str, x_labels))
    yl = _labels(y_labels, m.shape[0]) if y_labels is None or all(str(s).startswith("blocks.") for s in y_labels) \
        else list(map(str, y_labels))
    fig = go.Figure(go.Heatmap(z=m.tolist(), x=xl, y=yl, zmin=-1, zmax=1, colorscale="RdBu", reversescale=True,
                               colorbar={"title": "cos"}))
    fig.update_layout(title=title, template="plotly_white", yaxis={"autorange": "reversed"})
    return fig


def transfer_heatmap(matrix: Any, names: Sequence[str], lodo: Any = None, title: str = "transfer AUROC") -> Any:
    """Train-dataset (rows) x test-dataset (columns) AUROC heatmap; an extra "all but" row for leave-one-out."""
    go = _go()
    m = torch.as_tensor(matrix, dtype=torch.float64)
    rows = [f"train {n}" for n in names]
    z = m.tolist()
    if lodo is not None:
        z.append(torch.as_tensor(lodo, dtype=torch.float64).tolist())
        rows.append("train all but column")
    text = [[f"{v:.2f}" for v in row] for row in z]
    fig = go.Figure(go.Heatmap(z=z, x=[f"test {n}" for n in names], y=rows, zmin=0, zmax=1, colorscale="Viridis",
                               text=text, texttemplate="%{text}", colorbar={"title": "AUROC"}))
    fig.update_layout(title=title, template="plotly_white", yaxis={"autorange": "reversed"})
    return fig


def projection_scatter(X: Any, labels: Sequence[Any], axes: Any = None, title: str = "activations",
                       axis_names: tuple[str, str] = ("axis 1", "axis 2")) -> Any:
    """2-D scatter of ``X [n, d]`` (one layer) coloured by label; ``axes [2, d]`` (e.g. two directions) or
    the top two principal components when omitted."""
    go = _go()
    x = torch.as_tensor(X, dtype=torch.float64)
    if x.dim() != 2:
        raise ValueError(f"projection_scatter takes one layer's activations [n, d], got shape {tuple(x.shape)}")
    if len(labels) != x.shape[0]:
        raise ValueError(f"{len(labels)} labels for {x.shape[0]} points")
    if axes is None:
        xc = x - x.mean(0)
        _, _, vt = torch.linalg.svd(xc, full_matrices=False)
        axes = vt[:2]
        axis_names = ("PC 1", "PC 2")
    a = torch.as_tensor(axes, dtype=torch.float64)
    if a.shape != (2, x.shape[1]):
        raise ValueError(f"axes must be [2, {x.shape[1]}], got {tuple(a.shape)}")
    a = a / a.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    xy = x @ a.T
    fig = go.Figure()
    for i, lab in enumerate(dict.fromkeys(labels)):
        m = torch.tensor([v == lab for v in labels])
        fig.add_trace(go.Scattergl(x=xy[m, 0].tolist(), y=xy[m, 1].tolist(), mode="markers", name=str(lab),
                                   marker={"color": _PALETTE[i % len(_PALETTE)], "size": 5, "opacity": 0.7}))
    fig.update_layout(title=title, xaxis_title=axis_names[0], yaxis_title=axis_names[1], template="plotly_white")
    return fig


def projection_histogram(scores: Any, labels: Sequence[Any], title: str = "projection", nbins: int = 40) -> Any:
    """Overlaid histograms of projections ``[n]`` per label."""
    go = _go()
    s = torch.as_tensor(scores, dtype=torch.float64).reshape(-1)
    if len(labels) != s.shape[0]:
        raise ValueError(f"{len(labels)} labels for {s.shape[0]} scores")
    fig = go.Figure()
    for i, lab in enumerate(dict.fromkeys(labels)):
        m = torch.tensor([v == lab for v in labels])
        fig.add_trace(go.Histogram(x=s[m].tolist(), name=str(lab), opacity=0.6, nbinsx=nbins,
                                   marker_color=_PALETTE[i % len(_PALETTE)]))
    fig.update_layout(barmode="overlay", title=title, xaxis_title="projection", yaxis_title="count",
                      template="plotly_white")
    return fig


def rank_curve(ranks: Sequence[int], accuracy: Any, auroc: Any, title: str = "after ablating top-k") -> Any:
    """Held-out accuracy / AUROC (``[n_ranks, n_folds]``) against the number of components removed."""
    go = _go()
    fig = go.Figure()
    for i, (name, v) in enumerate((("accuracy", accuracy), ("auroc", auroc))):
        t = _as2d(v)
        mean = t.mean(1)
        std = t.std(1) if t.shape[1] > 1 else torch.zeros_like(mean)
        fig.add_trace(go.Scatter(x=list(ranks), y=mean.tolist(), error_y={"type": "data", "array": std.tolist()},
                                 mode="lines+markers", name=name, line={"color": _PALETTE[i]}))
    fig.add_hline(y=0.5, line_dash="dot", line_color="gray")
    fig.update_layout(title=title, xaxis_title="components removed (k)", yaxis_title="held-out score",
                      template="plotly_white")
    return fig


def graded_levels(level_means: Any, adjacent_d: Any, levels: Sequence[str], sites: Sequence[str] | None = None,
                  title: str = "graded levels", level_std: Any = None, heldout_d: Any = None) -> Any:
    """Two panels by layer: each level's mean projection with a +-1 std band (``level_means`` / ``level_std``
    ``[n_layers, k]``), and Cohen's d between neighbouring levels (``adjacent_d [n_layers, k-1]``, solid;
    ``heldout_d`` of the same shape, dashed), with d = 0 marked: below it a level sits under the one before."""
    go = _go()
    from plotly.subplots import make_subplots

    m = torch.as_tensor(level_means, dtype=torch.float64)
    d = torch.as_tensor(adjacent_d, dtype=torch.float64)
    sd = None if level_std is None else torch.as_tensor(level_std, dtype=torch.float64)
    x = _labels(sites, m.shape[0])
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("mean projection +- 1 std", "Cohen's d between neighbouring levels"))
    for i, lev in enumerate(levels):
        color = _PALETTE[i % len(_PALETTE)]
        if sd is not None:
            hi, lo = (m[:, i] + sd[:, i]).tolist(), (m[:, i] - sd[:, i]).tolist()
            fig.add_trace(go.Scatter(x=x + x[::-1], y=hi + lo[::-1], fill="toself", line={"width": 0},
                                     fillcolor=color, opacity=0.15, hoverinfo="skip", showlegend=False), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=m[:, i].tolist(), mode="lines+markers", name=str(lev),
                                 line={"color": color}), row=1, col=1)
    for i in range(d.shape[1]):
        color = _PALETTE[(i + len(levels)) % len(_PALETTE)]
        name = f"d {levels[i]} -> {levels[i + 1]}"
        fig.add_trace(go.Scatter(x=x, y=d[:, i].tolist(), mode="lines+markers", name=name + " (fit)",
                                 line={"color": color}), row=2, col=1)
        if heldout_d is not None:
            h = torch.as_tensor(heldout_d, dtype=torch.float64)
            fig.add_trace(go.Scatter(x=x, y=h[:, i].tolist(), mode="lines", name=name + " (held out)",
                                     line={"color": color, "dash": "dash"}), row=2, col=1)
    fig.add_hline(y=0, line_dash="dot", line_color="gray", row=2, col=1)
    fig.update_layout(title=title, template="plotly_white", height=650)
    fig.update_xaxes(title_text="site", row=2, col=1)
    fig.update_yaxes(title_text="projection", row=1, col=1)
    fig.update_yaxes(title_text="d", row=2, col=1)
    return fig


def signature_heatmap(values: Any, directions: Sequence[str], groups: Sequence[str], title: str = "signature") -> Any:
    """Heatmap of projection statistics ``[n_directions, n_groups]`` (e.g. mean projection per corpus)."""
    go = _go()
    v = torch.as_tensor(values, dtype=torch.float64)
    fig = go.Figure(go.Heatmap(z=v.T.tolist(), x=list(directions), y=list(groups), colorscale="RdBu",
                               reversescale=True, zmid=0, colorbar={"title": "projection"}))
    fig.update_layout(title=title, template="plotly_white")
    return fig
