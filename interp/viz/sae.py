"""Plotly figures for SAE results. Inputs are plain tensors, lists and dicts; this module never imports ``sae``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


def _go() -> Any:
    import plotly.graph_objects as go

    return go


def training_curves(history: Mapping[str, Sequence[float]], keys: Sequence[str] = ("l0", "fvu", "dead"),
                    x: str = "tokens", title: str = "SAE training") -> Any:
    """One panel per metric (default L0, FVU, dead fraction) against ``history[x]`` (tokens or steps)."""
    from plotly.subplots import make_subplots

    go = _go()
    names = {"l0": "L0", "fvu": "FVU", "dead": "dead fraction", "loss": "loss", "mse": "MSE", "aux": "AuxK loss",
             "lr": "learning rate"}
    keys = [k for k in keys if k in history]
    if not keys:
        raise ValueError(f"history has none of the requested metrics; it holds {sorted(history)}")
    xs = list(history.get(x, range(len(history[keys[0]]))))
    fig = make_subplots(rows=len(keys), cols=1, shared_xaxes=True, subplot_titles=[names.get(k, k) for k in keys],
                        vertical_spacing=0.08)
    for i, k in enumerate(keys, 1):
        fig.add_trace(go.Scatter(x=xs, y=list(map(float, history[k])), mode="lines", name=names.get(k, k)),
                      row=i, col=1)
    if "fvu" in keys:
        fig.update_yaxes(type="log", row=keys.index("fvu") + 1, col=1)
    fig.update_xaxes(title_text=x, row=len(keys), col=1)
    fig.update_layout(title=title, template="plotly_white", showlegend=False, height=220 * len(keys) + 80)
    return fig


def activation_histogram(acts: Any, latents: Sequence[int] | None = None, labels: Sequence[str] | None = None,
                         bins: int = 50, log_y: bool = True, only_active: bool = True,
                         title: str = "latent activations") -> Any:
    """Histogram of activations, one overlaid trace per group: ``acts`` ``[n]`` (one latent), ``[n, L]`` with
    ``latents`` choosing columns, or a dict ``{name: [n]}`` (e.g. harmful vs harmless prompts, any sizes).
    ``only_active`` drops zeros, which otherwise swamp the plot."""
    go = _go()
    if isinstance(acts, Mapping):
        groups = [(str(k), torch.as_tensor(v, dtype=torch.float32).reshape(-1)) for k, v in acts.items()]
    else:
        a = torch.as_tensor(acts, dtype=torch.float32)
        if a.dim() == 1:
            a = a[:, None]
        cols = list(latents) if latents is not None else list(range(a.shape[1]))
        groups = [(labels[j] if labels is not None else (f"latent {c}" if latents is not None else "activations"),
                   a[:, c]) for j, c in enumerate(cols)]
    fig = go.Figure()
    for name, v in groups:
        if only_active:
            v = v[v > 0]
        fig.add_trace(go.Histogram(x=v.tolist(), nbinsx=bins, name=name, opacity=0.6 if len(groups) > 1 else 1.0))
    fig.update_layout(title=title, barmode="overlay", template="plotly_white", xaxis_title="activation",
                      yaxis_title="count")
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def frequency_histogram(frequency: Any, bins: int = 60, title: str = "latent firing frequency") -> Any:
    """Histogram of ``log10`` firing frequency ``[d_sae]`` (dead latents counted in the title)."""
    go = _go()
    f = torch.as_tensor(frequency, dtype=torch.float64)
    dead = int((f == 0).sum())
    fig = go.Figure(go.Histogram(x=torch.log10(f[f > 0]).tolist(), nbinsx=bins))
    fig.update_layout(title=f"{title} ({dead} dead of {f.numel()})", template="plotly_white",
                      xaxis_title="log10 frequency", yaxis_title="latents")
    return fig


def diff_ranking(scores: Any, top: int = 20, labels: Mapping[int, str] | Sequence[str] | None = None,
                 base: Any = None, tuned: Any = None, title: str = "latents ranked by activation change",
                 score_name: str = "change") -> Any:
    """Bars of the ``top`` latents by ``scores`` ``[d_sae]`` (e.g. tuned - base mean activation). With ``base``
    and ``tuned`` ``[d_sae]`` the two means are drawn side by side instead."""
    go = _go()
    s = torch.as_tensor(scores, dtype=torch.float64)
    order = s.argsort(descending=True)[: min(top, s.numel())].tolist()

    def lab(i: int) -> str:
        if labels is None:
            return f"#{i}"
        return labels.get(i, f"#{i}") if isinstance(labels, Mapping) else labels[i]

    names = [lab(i) for i in order]
    fig = go.Figure()
    if base is not None and tuned is not None:
        b, t = torch.as_tensor(base, dtype=torch.float64), torch.as_tensor(tuned, dtype=torch.float64)
        fig.add_trace(go.Bar(x=names, y=b[order].tolist(), name="base"))
        fig.add_trace(go.Bar(x=names, y=t[order].tolist(), name="tuned"))
        fig.update_layout(barmode="group", yaxis_title="mean activation")
    else:
        fig.add_trace(go.Bar(x=names, y=s[order].tolist(), name=score_name))
        fig.update_layout(yaxis_title=score_name)
    fig.update_layout(title=title, template="plotly_white", xaxis_title="latent", xaxis_type="category")
    return fig


def latent_bars(latents: Sequence[int], series: Mapping[str, Sequence[float]], title: str = "latents",
                yaxis: str = "score") -> Any:
    """Grouped bars, one group per latent in the given order (best first), one bar per named series
    (e.g. ``{"cosine": [...]}`` or ``{"base": [...], "tuned": [...]}``)."""
    go = _go()
    names = [f"#{int(i)}" for i in latents]
    fig = go.Figure()
    for k, v in series.items():
        if len(v) != len(names):
            raise ValueError(f"series {k!r} has {len(v)} values for {len(names)} latents")
        fig.add_trace(go.Bar(x=names, y=[float(x) for x in v], name=k))
    fig.update_layout(title=title, barmode="group", template="plotly_white", xaxis_title="latent",
                      xaxis_type="category", yaxis_title=yaxis)
    return fig


def metrics_summary(frequency: Any, scalars: Mapping[str, float], counts: Mapping[str, float] | None = None,
                    bins: int = 60, title: str = "SAE metrics") -> Any:
    """Left: histogram of ``log10`` firing frequency of the latents that fire. Middle: bars of the fractions
    in ``scalars`` (FVU, dead, dense). Right: bars of the counts in ``counts`` (e.g. L0)."""
    from plotly.subplots import make_subplots

    go = _go()
    f = torch.as_tensor(frequency, dtype=torch.float64)
    dead = int((f == 0).sum())
    panels = ["log10 firing frequency", "fractions"] + (["per token"] if counts else [])
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=panels)
    fig.add_trace(go.Histogram(x=torch.log10(f[f > 0]).tolist(), nbinsx=bins, name="latents", showlegend=False),
                  row=1, col=1)
    fig.add_trace(go.Bar(x=list(scalars), y=[float(v) for v in scalars.values()], showlegend=False,
                         marker_color="#4062bb"), row=1, col=2)
    if counts:
        fig.add_trace(go.Bar(x=list(counts), y=[float(v) for v in counts.values()], showlegend=False,
                             marker_color="#2ca02c"), row=1, col=3)
    fig.update_xaxes(title_text="log10 frequency", row=1, col=1)
    fig.update_yaxes(title_text="latents", row=1, col=1)
    fig.update_layout(title=f"{title} ({dead} dead of {f.numel()} latents)", template="plotly_white")
    return fig


def ce_loss_bars(conditions: Sequence[str], ce: Sequence[float], recovered: Mapping[str, float],
                 title: str = "cross-entropy with the SAE spliced in") -> Any:
    """Next-token CE (nats) per condition (clean, SAE, zero- and mean-ablated); the recovered fractions in the
    title, since they are the headline numbers."""
    go = _go()
    fig = go.Figure(go.Bar(x=list(conditions), y=[float(v) for v in ce], marker_color="#4062bb"))
    rec = ", ".join(f"{k} {v:.3f}" for k, v in recovered.items())
    fig.update_layout(title=f"{title} (recovered: {rec})", template="plotly_white", xaxis_title="condition",
                      yaxis_title="cross-entropy (nats)")
    return fig
