"""Standing blocks in for: a forward that starts at a block, reading a given residual stream there.

Scoring many candidate additions at one layer, or generating under an addition at one layer, needs only the blocks
from that layer on: the blocks below compute what a plain pass computes. :func:`skip_blocks` replaces them by
pass-throughs for a pass (families in ``SKIPPABLE``); :func:`resume_from` also covers the other families (the blocks
run and their output is replaced).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn as nn

from interp.hooking import count_hooks, hooks
from interp.models import Model

# families whose model loop feeds each block's output (a tensor) to the next block as its first argument, so a
# block can be stood in for by a pass-through (checked equal to the full forward in tests/test_core_forward_resume.py)
SKIPPABLE = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "olmo2", "gpt2",
                       "gpt_neox", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe"})


def can_skip(model: Model) -> bool:
    """Whether blocks can be stood in for (:func:`skip_blocks`): a family in ``SKIPPABLE`` whose HF
    ``model_type`` is that family (an inferred or user-registered spec is not assumed to loop the same way)."""
    return model.spec.family in SKIPPABLE and getattr(model.config, "model_type", None) == model.spec.family


def _swap_in(x: torch.Tensor, resid: torch.Tensor, layer: int) -> torch.Tensor:
    if x.shape != resid.shape:
        raise ValueError(f"resid has shape {tuple(resid.shape)} (repeated) but block {layer} reads {tuple(x.shape)}; "
                         f"take resid from the same batch")
    return resid.to(x.device, x.dtype)


@contextmanager
def resume_from(model: Model, from_layer: int, resid: torch.Tensor | None) -> Iterator[bool]:
    """For the passes inside: block ``from_layer`` reads ``resid`` (``[rows, T, d]``, the pass's rows) as its
    resid_pre. Yields whether the blocks below are skipped (:func:`skip_blocks`: they compute nothing and write no
    key/value cache); for families outside ``SKIPPABLE`` they run and their output is replaced (yields False). A
    hook inside the blocks below is refused (its edit would be lost). ``resid=None``: nothing changes."""
    if resid is None:
        yield False
        return
    skip = from_layer if can_skip(model) else 0
    with hooks(model, _resume_hooks(model, from_layer, resid, bool(skip))), skip_blocks(model, skip, resid):
        if not skip:
            _refuse_hooks_below(model, from_layer, 1)
        yield bool(skip)


def _resume_hooks(model: Model, from_layer: int, resid: torch.Tensor | None, skipped: bool) -> list[tuple[str, Any]]:
    """Where blocks are not skipped, the hook that hands block ``from_layer`` the given ``resid``: at the output
    of the block below, so every hook at ``from_layer``'s resid_pre sees it."""
    if resid is None or skipped:
        return []
    return [(f"blocks.{from_layer - 1}.hook_resid_post", lambda x, ctx: _swap_in(x, resid, from_layer))]


class _PassThrough(nn.Module):
    """Stands in for a skipped block: returns the residual stream it is given, or ``resid`` when it is the last."""

    def __init__(self, resid: torch.Tensor | None = None, layer: int = 0):
        super().__init__()
        self.resid, self.layer = resid, layer

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return hidden_states if self.resid is None else _swap_in(hidden_states, self.resid, self.layer)


def _refuse_hooks_below(model: Model, upto: int, ours: int) -> None:
    """An edit below the resumed block would be skipped (or overwritten): refuse it."""
    for i in range(upto):
        if count_hooks(model.blocks[i]) > (ours if i == upto - 1 else 0):
            raise ValueError(f"a hook is attached inside block {i}, below from_layer={upto}, whose output the resumed "
                             f"forward does not compute; resume from a layer at or below the lowest edited one")


@contextmanager
def skip_blocks(model: Model, upto: int, resid: torch.Tensor | None = None) -> Iterator[None]:
    """Blocks ``0..upto-1`` replaced by pass-throughs for the duration (restored on exit and on exception), the
    last one returning ``resid`` when given: the model computes only blocks ``upto..``. Only for families in
    ``SKIPPABLE``; a hook inside a skipped block would silently not run, so one is refused."""
    if upto <= 0:
        yield
        return
    if not can_skip(model):
        raise ValueError(f"blocks of {model.spec.family} models cannot be skipped (not in interp.forward.SKIPPABLE)")
    _refuse_hooks_below(model, upto, 0)
    blocks = model.blocks
    saved = [blocks[i] for i in range(upto)]
    try:
        for i in range(upto):
            blocks[i] = _PassThrough(resid if i == upto - 1 else None, upto)
        yield
    finally:
        for i, b in enumerate(saved):
            blocks[i] = b


__all__ = ["SKIPPABLE", "can_skip", "resume_from", "skip_blocks"]
