"""Where the direction studies' removed keywords went (issue 37): study knobs into the study's ``config=``,
``seed`` / ``batch_size`` / ``progress`` into ``runtime=``; the check itself is :func:`interp.values.refuse_moved`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

RUNTIME = ("seed", "batch_size", "progress")


def moved_into(config: type, names: Sequence[str] = ()) -> dict[str, str]:
    """Where the keywords a study no longer takes went: ``seed`` / ``batch_size`` / ``progress`` into ``runtime=``,
    each of ``names`` (default: every field of ``config``) into ``config=<config>(name=...)``."""
    names = list(names) or [f.name for f in fields(config)]
    out = {k: f"config={config.__name__}({k}=...)" for k in names}
    out.update({k: f"runtime=interp.Runtime({k}=...)" for k in RUNTIME})
    return out


__all__ = ["moved_into"]
