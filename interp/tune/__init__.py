"""Fine-tuning as a component and what a fine-tune changed, token by token.

``fine_tune`` (peft LoRA or full / layer-restricted fine-tuning, response-only loss with per-token masks, seeded,
checkpointed, resumable), ``token_attribution`` (per response token, log p_adapted - log p_base, with concentration
and characterisation) and ``top_mask`` (the top-q% attributed tokens as loss masks; ``tune.masks.random_mask`` the
equal-size control). Submodules load lazily: ``tune.config.TuneConfig``, ``tune.loop.train_loop``,
``tune.objective`` (the objective protocol a preference step plugs into), ``tune.classes`` (token classes).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TuneConfig": "interp.tune.config",
    "fine_tune": "interp.tune.loop",
    "token_attribution": "interp.tune.attribution",
    "top_mask": "interp.tune.masks",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    try:
        return importlib.import_module(f"interp.tune.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module 'interp.tune' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_EXPORTS))
