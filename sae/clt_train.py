"""Train and evaluate cross-layer transcoders.

:func:`train_clt` trains on one capture of every MLP's input and output (:func:`sae.transcoder_train.capture_pairs`),
end to end by default (:mod:`sae.clt_e2e`: every encoder and decoder against the joint loss, as Ameisen et al. 2025
do; lower FVU at the same L0 on the organism, benchmarks/RESULTS_graphs.md), or in two stages:

1. per layer, a transcoder from MLP input to MLP output with the SAE trainer (:func:`sae.transcoder_train.
   fit_transcoder`: the kind's activation, sparsity terms, thresholds, input normalisation), gathered into a CLT
   with zero cross-layer decoders (:meth:`sae.clt.CrossLayerTranscoder.from_transcoders`);
2. jointly over all layers, with the encoders (so the features and their sparsity) held: every decoder, the
   cross-layer ones included, and every ``b_dec`` fitted by Adam to the mean over layers of each MLP output's
   fraction of variance unexplained, each layer's prediction summing the writes of all layers up to it.

In the two stages the features are the per-layer transcoders' and the cross-layer decoders explain what they leave
in later MLPs; end to end the encoders are trained against the joint loss too.
:func:`evaluate_clt`: per layer FVU of the MLP output, L0 and dead latents, and the CE loss recovered with every
MLP replaced by the CLT at once.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.forward import Inputs
from interp.positions import check_sinks, without_first
from interp.sites import Site
from interp.values import Prompts, Runtime
from sae.clt import CrossLayerTranscoder, check_clt

if TYPE_CHECKING:
    import pandas as pd
from sae.edits import TranscoderSplice
from sae.quality import SAEMetrics, ce_recovered
from sae.train_config import TrainConfig, TrainResult
from sae.transcoder_quality import TranscoderQuality
from sae.transcoder_train import capture_pairs, fit_transcoder, pair_sites


@dataclass(frozen=True)
class CrossConfig:
    """Stage 2 of :func:`train_clt`: ``steps`` Adam steps of ``batch_size`` tokens at ``lr`` (cosine to 0).
    ``cross_layer=False`` is the control: the same refit with the cross-layer decoders held at zero (per-layer
    transcoders whose decoders were refitted), so a gain can be put down to the cross-layer writes."""

    steps: int = 300
    batch_size: int = 1024
    lr: float = 1e-3
    seed: int = 0
    cross_layer: bool = True

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1 or not self.lr > 0:
            raise ValueError(f"CrossConfig needs steps >= 0, batch_size >= 1, lr > 0; got {self}")


@dataclass
class CLTTraining(Result):
    """The trained ``clt``; ``per_layer``: stage 1's result per layer; ``history``: stage 2's mean FVU over layers
    on its batches by step; ``fvu_per_layer`` / ``fvu_joint``: mean FVU over layers on the whole training capture
    after stage 1 (zero cross-layer decoders) and after stage 2. ``method="end_to_end"``: no stage 1 (``per_layer``
    empty, ``fvu_per_layer`` NaN), ``history`` the logged batches' mean FVU, ``fvu_joint`` the trained CLT's."""

    clt: CrossLayerTranscoder
    per_layer: dict[int, TrainResult]
    history: list[float] = field(default_factory=list)
    fvu_per_layer: float = float("nan")
    fvu_joint: float = float("nan")
    method: str = "two_stage"

    def summary(self) -> dict[str, Any]:
        return {"method": self.method, "n_layers": self.clt.n_layers, "d_sae": self.clt.d_sae, "arch": self.clt.cfg.arch,
                "cross_steps": len(self.history), "fvu_per_layer": self.fvu_per_layer, "fvu_joint": self.fvu_joint}

    def to_frame(self) -> pd.DataFrame:
        """Stage 2's curve: one row per cross-layer step with the mean FVU over layers on its batch."""
        import pandas as pd

        return pd.DataFrame({"step": range(len(self.history)), "fvu": self.history})

    def plot(self, title: str = "cross-layer transcoder training") -> Any:
        """The ``history`` (stage 2's or the end-to-end run's batch FVU), with the whole-capture FVUs as lines."""
        import plotly.graph_objects as go

        fig = go.Figure(go.Scatter(x=list(range(len(self.history))), y=self.history, name="batch FVU (mean over layers)"))
        for name, v in (("after stage 1 (per layer)", self.fvu_per_layer), ("after stage 2 (joint)", self.fvu_joint)):
            if v == v:
                fig.add_hline(y=v, line_dash="dot", annotation_text=name)
        return fig.update_layout(title=title, xaxis_title="step", yaxis_title="FVU")


def layer_pairs(pairs: Any, n_layers: int, sinks: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer's MLP input and output on the same tokens: ``x, y [n, n_layers, d]`` (``pairs``: a capture of
    :func:`sae.transcoder_train.capture_pairs` over every layer; ``sinks`` as ``Activations.flat_tokens``)."""
    sites = [s for layer in range(n_layers) for s in pair_sites(layer)]
    t = pairs.flat_tokens(None, sinks=sinks, sinks_at=sites)
    order = [pairs.sites.index(s) for s in sites]
    t = t[:, order]
    return t[:, 0::2].float(), t[:, 1::2].float()


def joint_fvu(clt: CrossLayerTranscoder, x: torch.Tensor, y: torch.Tensor, var: torch.Tensor | None = None
              ) -> torch.Tensor:
    """Mean over layers of each MLP output's FVU (``x, y [n, n_layers, d]``; ``var [n_layers]``: each layer's total
    variance per token, default from ``y``)."""
    zs = {i: clt.encode(i, x[:, i].to(clt.dtype)) for i in range(clt.n_layers)}
    if var is None:
        var = (y - y.mean(0)).pow(2).sum(-1).mean(0)
    errs = torch.stack([(clt.predict(i, zs) - y[:, i].to(clt.dtype)).pow(2).sum(-1).mean()
                        for i in range(clt.n_layers)])
    return (errs / var.to(errs).clamp_min(1e-30)).mean()


def fit_cross(clt: CrossLayerTranscoder, x: torch.Tensor, y: torch.Tensor, cfg: CrossConfig | None = None
              ) -> list[float]:
    """Stage 2 on ``x, y [n, n_layers, d]``: decoders and ``b_dec`` fitted jointly, encoders held (in place); the
    mean FVU of each step's batch."""
    cfg = cfg or CrossConfig()
    enc = [p for tc in clt.layers for p in (tc.W_enc, tc.b_enc, *(getattr(tc, n) for n, _ in tc.kind.extra))]
    dec = [p for tc in clt.layers for p in (tc.W_dec, tc.b_dec)] + (list(clt.W_later) if cfg.cross_layer else [])
    if not cfg.cross_layer:
        enc += list(clt.W_later)
        with torch.no_grad():
            for w in clt.W_later:
                w.zero_()
    for p in enc:
        p.requires_grad_(False)
    var = (y - y.mean(0)).pow(2).sum(-1).mean(0)
    opt = torch.optim.Adam(dec, lr=cfg.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(cfg.steps, 1))
    gen = torch.Generator().manual_seed(cfg.seed)
    history = []
    try:
        for _ in range(cfg.steps):
            idx = torch.randint(0, x.shape[0], (min(cfg.batch_size, x.shape[0]),), generator=gen)
            loss = joint_fvu(clt, x[idx], y[idx], var)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            history.append(float(loss.detach()))
    finally:
        for p in enc:
            p.requires_grad_(True)
    return history


METHODS = ("two_stage", "end_to_end")


def train_clt(model: Any, inputs: Prompts | Inputs, cfg: TrainConfig | None = None, cross: CrossConfig | None = None,
              sinks: str = "keep", runtime: Runtime | None = None, method: str | None = None,
              out_dir: str | os.PathLike | None = None) -> CLTTraining:
    """A CLT of every MLP of ``model`` trained on ``inputs`` (prompts or token ids ``[n, T]``). ``method``:
    ``"end_to_end"`` (:mod:`sae.clt_e2e`: encoders and all decoders trained together; ``out_dir``: its checkpoint,
    from which a run resumes, and its result) or ``"two_stage"`` (the module docstring; ``cross`` is stage 2).
    Default: two-stage when ``cross`` is given, else end to end (lower FVU at the same L0 on the organism:
    benchmarks/RESULTS_graphs.md).
    ``cfg``: the per-layer (or end-to-end) training (``arch`` ``relu`` / ``jumprelu`` / ``topk``, ``d_sae``, ``k``,
    ``total_tokens``, ...); ``sinks="exclude"``: each prompt's first token left out of the data;
    ``runtime.batch_size``: prompts per capture pass."""
    method = method or ("two_stage" if cross is not None else "end_to_end")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if (cross is not None and method == "end_to_end") or (out_dir is not None and method == "two_stage"):
        raise ValueError("cross= configures the two-stage trainer's stage 2 and out_dir= the end-to-end trainer's "
                         "checkpoints; pass the one that fits method=")
    cfg = TrainConfig(**{**asdict(cfg or TrainConfig()), "site": None, "target_site": None})
    n = int(model.n_layers)
    pairs = capture_pairs(model, inputs, None, batch_size=8 if runtime is None else runtime.batch_size)
    if check_sinks(sinks) == "exclude":
        if pairs.mask is None:
            raise ValueError('sinks="exclude" needs per-token activations with a mask (prompts or token ids as inputs)')
        pairs.mask = without_first(pairs.mask)
    if method == "end_to_end":
        return _train_end_to_end(model, pairs, cfg, out_dir)
    results = {layer: fit_transcoder(pairs, layer, cfg, model_id=getattr(model, "name", "")) for layer in range(n)}
    clt = CrossLayerTranscoder.from_transcoders({i: r.sae for i, r in results.items()})  # type: ignore[misc]
    x, y = layer_pairs(pairs, n, cfg.sinks)
    x, y = x.to(clt.layers[0].device), y.to(clt.layers[0].device)
    with torch.no_grad():
        before = float(joint_fvu(clt, x, y))
    history = fit_cross(clt, x, y, cross)
    with torch.no_grad():
        after = float(joint_fvu(clt, x, y))
    clt.cfg.meta.update({"trained": "per-layer transcoders, then decoders jointly (sae.clt_train)",
                         "n_tokens": int(x.shape[0])})
    return CLTTraining(clt, results, history, before, after)


def _train_end_to_end(model: Any, pairs: Any, cfg: TrainConfig, out_dir: str | os.PathLike | None) -> CLTTraining:
    from sae.clt_e2e import fit_clt

    x, y = layer_pairs(pairs, int(model.n_layers), cfg.sinks)
    tr = fit_clt(x, y, cfg, out_dir=out_dir, model_id=getattr(model, "name", ""))
    clt = tr.clt
    clt.cfg.meta["n_tokens"] = int(x.shape[0])
    with torch.no_grad():
        fvu = float(joint_fvu(clt, x.to(tr.device), y.to(tr.device)))
    return CLTTraining(clt, {}, list(tr.history["fvu"]), float("nan"), fvu, method="end_to_end")


@torch.no_grad()
def evaluate_clt(model: Any, clt: CrossLayerTranscoder, inputs: Inputs, batch_size: int = 8, ce: bool = True,
                 sinks: str = "keep") -> TranscoderQuality:
    """Per layer: FVU and MSE of the MLP output predicted by the CLT (every layer's writes up to it), L0, dead and
    dense fractions of that layer's latents; with ``ce`` the CE loss recovered with every MLP replaced by the CLT at
    once (:class:`sae.edits.TranscoderSplice`). ``sinks="exclude"``: the per-layer figures leave each prompt's
    first token out."""
    check_clt(model, clt)
    pairs = capture_pairs(model, inputs, None, batch_size=batch_size)
    if check_sinks(sinks) == "exclude" and pairs.mask is not None:
        pairs.mask = without_first(pairs.mask)
    x, y = layer_pairs(pairs, clt.n_layers, "keep")
    x, y = x.to(clt.layers[0].device), y.to(clt.layers[0].device)
    zs = {i: clt.encode(i, x[:, i].to(clt.dtype)) for i in range(clt.n_layers)}
    layers = {}
    for i in range(clt.n_layers):
        err = (clt.predict(i, zs) - y[:, i]).double().pow(2).sum()
        var = (y[:, i] - y[:, i].mean(0)).double().pow(2).sum().clamp_min(1e-30)
        freq = (zs[i] > 0).double().mean(0).float()
        layers[i] = SAEMetrics(l0=float((zs[i] > 0).float().sum(-1).mean()), fvu=float(err / var),
                               mse=float(err) / x.shape[0], dead_fraction=float((freq == 0).float().mean()),
                               dense_fraction=float((freq > 0.1).float().mean()), frequency=freq, n_tokens=x.shape[0])
    res = None
    if ce:
        sites = [Site("mlp_module_out", i).name for i in range(clt.n_layers)]
        res = ce_recovered(model, inputs, TranscoderSplice(clt).hook_fns(model), sites, batch_size)
    return TranscoderQuality(layers=layers, ce=res)


__all__ = ["CLTTraining", "CrossConfig", "evaluate_clt", "fit_cross", "layer_pairs", "train_clt"]
