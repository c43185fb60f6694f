"""Sparse autoencoders: train (ReLU, TopK, BatchTopK, JumpReLU, JumpReLU to a target L0, gated, Matryoshka
BatchTopK: the kinds of ``sae.kinds``, a registry a kind of your own joins with ``sae.kinds.register_kind``),
evaluate, read/write sae-lens, load
published SAEs from the local HF cache (``from_pretrained``), analyse, intervene. Transcoders (an MLP's input ->
its output): ``Transcoder``, ``train_transcoder``; formats in ``sae.saelens_io`` and ``sae.circuit_tracer_io``,
quality in ``sae.transcoder_quality``. Crosscoders for model diffing (one dictionary over a base and a fine-tuned
model's activations at a site): ``sae.crosscoder`` (``Crosscoder``, ``train_crosscoder``), read with
``sae.crosscoder_analysis`` (decoder-norm ratios, latent scaling, fine-tune-only / base-only / shared latents).

Submodules load lazily, so ``import sae`` needs neither Triton nor sae-lens. ``sae`` never imports
``steering``; interventions follow the shared protocol ``hook_fns(model) -> {site: fn(x, ctx)}``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SAE": "sae.model",
    "SAEConfig": "sae.model",
    "TrainConfig": "sae.trainer",
    "train_sae": "sae.trainer",
    "save_saelens": "sae.saelens_io",
    "load_saelens": "sae.saelens_io",
    "from_pretrained": "sae.pretrained",
    "evaluate": "sae.quality",
    "diff_latents": "sae.analysis",
    "top_contexts": "sae.contexts",
    "LatentSteering": "sae.edits",
    "LatentAblation": "sae.edits",
    "Transcoder": "sae.transcoder",
    "train_transcoder": "sae.transcoder_train",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    try:  # the rest of the API lives in the submodules: sae.analysis, sae.quality, sae.contexts, ...
        return importlib.import_module(f"sae.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module 'sae' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_EXPORTS))
