"""Train per-layer transcoders with the SAE trainer: each MLP's input and output captured in one pass, one transcoder
per layer fitted to predict the output from the input.

``capture_pairs`` reads the MLP module's own input and output (``blocks.L.mlp.hook_in`` / ``blocks.L.mlp.hook_out``;
for a mixture-of-experts block, the sparse block as a whole) at every real token, padding dropped, through
:func:`interp.capturing.capture`. ``fit_transcoder`` trains one layer on such a capture (or a store of it, for data
larger than memory, or a pair of tensors); ``train_transcoder`` does both for several layers at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.capturing import capture
from interp.forward import Inputs
from interp.positions import check_sinks, without_first
from interp.sites import Site
from interp.values import Prompts, Runtime, moved_keywords
from sae.kinds import get_kind, kind_names
from sae.runner import MOVED as FORMAT_MOVED
from sae.runner import SINK_MOVED
from sae.train_config import TrainConfig, TrainResult
from sae.trainer import Trainer, train_sae
from sae.transcoder import Transcoder, TranscoderConfig

if TYPE_CHECKING:
    import pandas as pd

# The encoder starts at this fraction of the decoder's transpose, so the untrained latents add little noise to the
# prediction (an SAE's starting point is near the identity; a transcoder's is not). Started at the full transpose,
# JumpReLU's thresholds first rise to silence that noise and L0 collapses: on the organism's layer 0 after 200 steps,
# FVU 0.146 at L0 4.8 vs 0.018 at L0 16.2 (target 16) with 0.3; TopK is unchanged (0.015).
ENCODER_INIT = 0.3


def pair_sites(layer: int) -> tuple[str, str]:
    """The sites a layer's transcoder reads and predicts: the MLP module's input and output."""
    return Site("mlp_in", layer).name, Site("mlp_module_out", layer).name


def check_layers(model: Any, layers: int | Sequence[int] | None) -> list[int]:
    """The layers as a sorted list (``None``: every layer; negative ones count from the end), each checked to exist."""
    n = int(model.n_layers)
    given = list(range(n)) if layers is None else [layers] if isinstance(layers, int) else list(layers)
    if not given:
        raise ValueError("no layers given; pass layers=None for every layer")
    out = []
    for layer in given:
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise TypeError(f"layers must be ints, got {layer!r}")
        if not -n <= layer < n:
            raise ValueError(f"layer {layer} is out of range: {getattr(model, 'name', 'the model')} has layers "
                             f"0..{n - 1} (negative layers count from the end)")
        out.append(layer % n)
    if len(set(out)) != len(out):
        raise ValueError(f"layers {given} name a layer twice; give each once")
    return sorted(out)


@moved_keywords(FORMAT_MOVED)
def capture_pairs(model: Any, inputs: Prompts | Inputs, layers: int | Sequence[int] | None = None,
                  batch_size: int = 8, out: str | os.PathLike | None = None, progress: bool = False) -> Any:
    """Every real token's MLP input and output at ``layers`` in one pass: :class:`~interp.activations.Activations`
    (or with ``out=PATH`` an :class:`~interp.store.ActivationStore`) with sites ``mlp_in.L``, ``mlp_module_out.L``.
    ``inputs``: prompts (a list: chat template; ``interp.Prompts(texts, chat=False)``: raw text) or token ids
    ``[n, T]``."""
    sites = [s for layer in check_layers(model, layers) for s in pair_sites(layer)]
    return capture(model, inputs, sites=sites, positions="all", out=out,
                   runtime=Runtime(batch_size=batch_size, progress=progress))


def _width(data: Any) -> int:
    if isinstance(data, tuple):
        if len(data) != 2:
            raise TypeError("paired training data is a tuple (mlp_inputs, mlp_outputs) of two tensors [..., d]")
        return int(data[0].shape[-1])
    if hasattr(data, "d_model"):
        return int(data.d_model)
    raise TypeError(f"cannot train a transcoder on {type(data).__name__}; pass (inputs, targets) tensors, or the "
                    f"Activations / ActivationStore of sae.transcoder_train.capture_pairs")


def fit_transcoder(data: Any, layer: int = 0, cfg: TrainConfig | None = None, skip: bool = False,
                   out_dir: str | os.PathLike | None = None, resume: bool = True, model_id: str = "",
                   callback: Callable[[Trainer], None] | None = None, **overrides: Any) -> TrainResult:
    """Train one transcoder (``TrainConfig`` arch ``topk``, ``jumprelu`` or ``relu``; ``skip``: a linear skip
    ``W_skip`` trained with it) on ``data``: a tuple ``(mlp_in [n, d], mlp_out [n, d])``, or a capture holding
    ``layer``'s pair (``cfg.site`` / ``cfg.target_site`` override which sites). The result's ``sae`` is a
    :class:`~sae.transcoder.Transcoder` that reads raw MLP inputs and predicts raw MLP outputs. ``out_dir``:
    checkpoints and resumption as :func:`sae.trainer.train_sae`."""
    cfg = cfg or TrainConfig()
    if overrides:
        cfg = TrainConfig(**{**asdict(cfg), **overrides})
    kind = get_kind(cfg.arch)
    if not kind.transcoder:
        raise ValueError(f"transcoders train as arch {[n for n in kind_names() if get_kind(n).transcoder]}, "
                         f"got {cfg.arch!r}")
    d = _width(data)
    if isinstance(data, tuple):
        sites = pair_sites(layer)
    else:
        sites = (cfg.site or pair_sites(layer)[0], cfg.target_site or pair_sites(layer)[1])
        cfg = replace(cfg, site=sites[0], target_site=sites[1])
    k = cfg.k if kind.needs_k else None
    tcfg = TranscoderConfig(d_in=d, d_sae=cfg.d_sae or cfg.expansion * d, arch=cfg.arch, k=k, layer=layer, skip=skip,
                            input_site=sites[0], site=sites[1], model_id=model_id or getattr(data, "model_id", ""))
    tc = Transcoder(tcfg, seed=cfg.seed)
    with torch.no_grad():
        tc.W_enc.mul_(ENCODER_INIT)
    return train_sae(data, cfg, out_dir=out_dir, resume=resume, callback=callback, sae=tc, fresh=True)


@dataclass
class TranscoderTraining(Result):
    """One :class:`~sae.trainer.TrainResult` per layer; ``transcoders`` are the trained ones by layer."""

    results: dict[int, TrainResult]

    @property
    def transcoders(self) -> dict[int, Transcoder]:
        return {layer: r.sae for layer, r in sorted(self.results.items())}  # type: ignore[misc]

    def __getitem__(self, layer: int) -> Transcoder:
        return self.transcoders[layer]

    def summary(self) -> dict[str, Any]:
        """Per layer: steps, dead fraction and the last logged value of each history series."""
        return {"layers": sorted(self.results), **{f"layer {k}": r.summary() for k, r in sorted(self.results.items())}}

    def to_frame(self) -> pd.DataFrame:
        """One row per layer and logged step: ``layer`` and the columns of :meth:`TrainResult.to_frame` (``fvu``
        is of the MLP output)."""
        import pandas as pd

        frames = [r.to_frame().assign(layer=layer) for layer, r in sorted(self.results.items())]
        df = pd.concat(frames, ignore_index=True)
        return df[["layer", *[c for c in df.columns if c != "layer"]]]

    def plot(self, layer: int, x: str = "step") -> Any:
        """The training curves of one layer."""
        return self.results[layer].plot(x=x, title=f"transcoder, layer {layer}")


TRAIN_MOVED = {**FORMAT_MOVED, **SINK_MOVED,
               "capture_batch_size": "runtime=interp.Runtime(batch_size=...) (prompts per capture pass)",
               "resume": "fit_transcoder(pairs, layer, cfg, resume=...) per layer (train_transcoder always resumes "
                         "from out_dir's checkpoints)",
               **{f.name: f"cfg=sae.TrainConfig({f.name}=...)" for f in fields(TrainConfig) if f.name != "sinks"}}


@moved_keywords(TRAIN_MOVED)
def train_transcoder(model: Any, inputs: Prompts | Inputs, layers: int | Sequence[int] | None = None,
                     cfg: TrainConfig | None = None, skip: bool = False, sinks: str = "keep",
                     out_dir: str | os.PathLike | None = None, runtime: Runtime | None = None) -> TranscoderTraining:
    """Per-layer transcoders of ``model``'s MLPs at ``layers`` (``None``: all) trained on ``inputs`` (prompts, or
    token ids ``[n, T]``): one capture of every layer's MLP input and output (in memory; for more data than memory,
    :func:`capture_pairs` with ``out=`` and :func:`fit_transcoder` per layer), then one transcoder per layer.
    ``runtime.batch_size``: prompts per capture pass (``cfg.batch_size`` is the trainer's, in tokens).
    ``out_dir``: each layer's checkpoints and result under ``OUT/layer_L`` (resumed from there). ``cfg``: e.g.
    ``train_transcoder(model, ids, cfg=sae.TrainConfig(arch="jumprelu", k=16, total_tokens=100_000))``.
    ``sinks="exclude"``: leave each prompt's first token out of the data (``interp.positions.without_first``: an attention sink, where an MLP
    may write a massive activation that would dominate the loss)."""
    layers = check_layers(model, layers)
    cfg = TrainConfig(**{**asdict(cfg or TrainConfig()), "site": None, "target_site": None})  # per layer
    pairs = capture_pairs(model, inputs, layers, batch_size=8 if runtime is None else runtime.batch_size)
    if check_sinks(sinks) == "exclude":
        if pairs.mask is None:
            raise ValueError('sinks="exclude" needs per-token activations with a mask (prompts or token ids as inputs)')
        pairs.mask = without_first(pairs.mask)
    results = {}
    for layer in layers:
        sub = None if out_dir is None else Path(out_dir) / f"layer_{layer}"
        results[layer] = fit_transcoder(pairs, layer, cfg, skip=skip, out_dir=sub, resume=True,
                                        model_id=getattr(model, "name", ""))
    return TranscoderTraining(results)
