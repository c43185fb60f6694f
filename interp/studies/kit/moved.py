"""Where the keywords the studies no longer take went (for :func:`interp.values.moved_keywords`): ``seed``,
``batch_size`` and ``progress`` into ``runtime=``, the study's knobs into its ``config=``, chat formatting into the
prompts."""

from __future__ import annotations


def moved(runtime: tuple[str, ...] = ("seed", "batch_size", "progress"), config: str | None = None,
          knobs: tuple[str, ...] = (), prompts: tuple[str, ...] = ()) -> dict[str, str]:
    """Old keyword -> its new home: ``runtime`` names into ``interp.Runtime``, ``knobs`` into ``config`` (a config
    class's name, e.g. ``"DiffConfig"``), ``prompts`` (``chat``, ``system``, ``responses``) into ``interp.Prompts``."""
    out = {k: f"runtime=interp.Runtime({k}=...)" for k in runtime}
    out.update({k: f"config={config}({k}=...)" for k in knobs})
    out.update({k: f"prompts=interp.Prompts(texts, {k}=...)" for k in prompts})
    return out


__all__ = ["moved"]
