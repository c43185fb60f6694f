"""Sparse autoencoders: train (ReLU/TopK/BatchTopK/JumpReLU), evaluate, read/write sae-lens, load
published SAEs from the local HF cache (``from_pretrained``), analyse, intervene.

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
    "TrainResult": "sae.trainer",
    "Trainer": "sae.trainer",
    "train_sae": "sae.trainer",
    "TokenStream": "sae.stream",
    "save_saelens": "sae.saelens_io",
    "load_saelens": "sae.saelens_io",
    "from_pretrained": "sae.pretrained",
    "evaluate": "sae.quality",
    "SAEMetrics": "sae.quality",
    "ce_loss_recovered": "sae.quality",
    "CELossRecovered": "sae.quality",
    "fvu": "sae.quality",
    "l0": "sae.quality",
    "aligned_latents": "sae.analysis",
    "separating_latents": "sae.analysis",
    "diff_latents": "sae.analysis",
    "encode_tokens": "sae.analysis",
    "LatentRanking": "sae.analysis",
    "top_contexts": "sae.contexts",
    "contexts_html": "sae.contexts",
    "SAESplice": "sae.edits",
    "LatentSteering": "sae.edits",
    "LatentAblation": "sae.edits",
    "planted_dictionary": "sae.synthetic",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'sae' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_EXPORTS))
