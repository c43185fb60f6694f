"""interp-toolkit core: load models, name sites, hook, capture and store activations.

Heavy submodules load lazily, so one broken optional dependency cannot break ``import interp``.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "load_model": "interp.models",
    "from_hf": "interp.models",
    "Model": "interp.models",
    "ArchSpec": "interp.arch",
    "register_spec": "interp.arch",
    "spec_for": "interp.arch",
    "Site": "interp.sites",
    "parse_site": "interp.sites",
    "expand_sites": "interp.sites",
    "hooks": "interp.hooks",
    "capture": "interp.capture",
    "Activations": "interp.activations",
    "ActivationStore": "interp.store",
    "format_prompts": "interp.chat",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module = importlib.import_module(_EXPORTS[name])
        return getattr(module, name)
    raise AttributeError(f"module 'interp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_EXPORTS))
