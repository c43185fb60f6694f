"""The one progress bar of the patching tools: tqdm on stderr, cleared when done, off with ``progress=False``."""

from __future__ import annotations

from typing import Any

from tqdm.auto import tqdm


def progress_bar(total: int | None, desc: str, progress: bool = True, unit: str = "forward") -> Any:
    """A tqdm bar of ``total`` steps (``leave=False``, so a finished sweep leaves no line behind); silent and
    free when ``progress`` is false, so results are identical either way."""
    return tqdm(total=total, desc=desc, unit=unit, disable=not progress, leave=False)


__all__ = ["progress_bar"]
