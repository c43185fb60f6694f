"""Optional dependencies (pip extras), imported only where used: a missing one is an ImportError naming
the extra to install. TransformerLens and sae-lens are extras so that a user on TransformerLens 4 (which
sae-lens 6 excludes) can install the toolkit beside it."""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRAS = {"transformer_lens": "transformer-lens", "sae_lens": "sae-lens"}


def import_extra(module: str, what: str) -> ModuleType:
    """``importlib.import_module(module)``, or an ImportError saying ``what`` needs the pip extra that brings it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] != module.split(".")[0]:
            raise  # a dependency of the extra is missing: that message says which
        extra = EXTRAS[module.split(".")[0]]
        raise ImportError(f"{what} needs {module.split('.')[0]}, which is not installed: "
                          f"`pip install 'interp-toolkit[{extra}]'` (or `pip install {extra}`)") from e


__all__ = ["EXTRAS", "import_extra"]
