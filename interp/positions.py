"""Position rules: which token positions of a left-padded batch a capture keeps.

A rule turns a :class:`~interp.chat.Batch` into a :class:`Plan`: either gather ``index [B, P]`` (with a
validity ``mask [B, P]``) or average with ``weights [B, T]``. ``last`` squeezes ``P`` away.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from interp.chat import Batch

RULES = ("last", "post_instruction", "all", "prompt_mean", "response_mean")
PositionSpec = str | int | Sequence[int]
"""A position rule (one of :data:`RULES`) or explicit positions (see :func:`columns`)."""


def columns(positions: int | Sequence[int] | torch.Tensor, start: torch.Tensor, end: torch.Tensor,
            what: str = "a prompt") -> torch.Tensor:
    """Padded columns ``[B, P]`` of explicit positions in rows whose real tokens span ``[start, end)`` (``[B]``).

    The one position rule of the project: ``p >= 0`` counts from the first real token, ``p < 0`` from the end
    (``-1`` is the last). ``positions`` is shared by every row, or one row of positions per row ``[B, P]``.
    ``what`` names the offending row in errors: ``"a prompt"``, or a prefix such as ``"clean prompt"`` that
    the row index follows.
    """
    pos = torch.as_tensor(positions, dtype=torch.long, device=start.device)
    if pos.dim() == 0:
        pos = pos[None]
    if pos.numel() == 0:
        raise ValueError("an empty list of positions; give at least one position")
    pos = pos.expand(start.shape[0], -1) if pos.dim() == 1 else pos
    if pos.shape[0] != start.shape[0]:
        raise ValueError(f"{pos.shape[0]} rows of positions for {start.shape[0]} prompts")
    s, e = start[:, None], end[:, None]
    col = torch.where(pos < 0, e + pos, s + pos)
    bad = (col < s) | (col >= e)
    if bad.any():
        r, j = (int(v) for v in bad.nonzero()[0])
        n = int(end[r] - start[r])
        row = what if what == "a prompt" else f"{what} {r}"
        raise ValueError(f"position {int(pos[r, j])} is out of range for {row} of {n} tokens (valid {-n}..{n - 1}); "
                         f"positions count from the first real token (>= 0) or from the end (< 0)")
    return col


@dataclass
class Plan:
    index: torch.Tensor | None = None    # [B, P] positions to gather (None with a mask: every position)
    mask: torch.Tensor | None = None     # [B, P] real positions
    weights: torch.Tensor | None = None  # [B, T] averaging weights (rows sum to 1)
    squeeze: bool = False

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, T, ...]`` -> ``[B, P, ...]``, ``[B, ...]`` (squeezed / averaged); computed in float32 for means."""
        if self.weights is not None:
            w = self.weights.to(x.device, torch.float32)
            return torch.einsum("bt...,bt->b...", x.float(), w)
        if self.index is None:  # every position
            return x
        idx = self.index.to(x.device)
        gathered = x[torch.arange(x.shape[0], device=x.device)[:, None], idx]
        return gathered[:, 0] if self.squeeze else gathered

    @property
    def n_positions(self) -> int | None:
        if self.squeeze or self.weights is not None:
            return None
        return self.mask.shape[1]


def describe(rule: PositionSpec) -> str:
    """A rule as text (for metadata and fingerprints)."""
    return rule if isinstance(rule, str) else f"positions{list(rule) if not isinstance(rule, int) else [rule]}"


def plan(rule: PositionSpec, batch: Batch, skip_special: bool = True) -> Plan:
    """Build the plan of ``rule`` for ``batch``.

    Rules: ``last`` (last prompt token), ``post_instruction`` (chat-template tokens after the user
    message), ``all`` (every real token), ``prompt_mean``, ``response_mean``, or explicit positions:
    an int / list of ints, negative from the end of the prompt, non-negative from its first real token.
    ``skip_special``: the means leave out the tokenizer's special tokens (BOS, template tokens), whose huge
    attention-sink activations would dominate them; a row made only of special tokens keeps them all.
    """
    mask = batch.attention_mask.bool()
    B, T = mask.shape
    prompt = mask & ~batch.response_mask
    if isinstance(rule, (int, list, tuple)) and not isinstance(rule, bool):
        prompt_end = _last_true(prompt) + 1               # exclusive end of the prompt
        idx = columns(list(rule) if not isinstance(rule, int) else rule, prompt_end - prompt.sum(1), prompt_end)
        return Plan(index=idx, mask=torch.ones_like(idx, dtype=torch.bool), squeeze=isinstance(rule, int))
    if rule == "last":
        return Plan(index=(_last_true(prompt))[:, None], mask=torch.ones(B, 1, dtype=torch.bool), squeeze=True)
    if rule == "post_instruction":
        post = batch.post_mask & prompt
        n = post.sum(1)
        if (n == 0).any():
            raise ValueError("some prompts have no post-instruction tokens (no chat template suffix after the "
                             "instruction); use positions='last' or format prompts with a chat template")
        P = int(n.max())
        end = _last_true(post) + 1
        idx = end[:, None] - P + torch.arange(P)[None, :]
        valid = idx >= (end - n)[:, None]
        return Plan(index=idx.clamp(min=0), mask=valid)
    if rule == "all":
        return Plan(index=None, mask=mask)
    if rule in ("prompt_mean", "response_mean"):
        sel = prompt if rule == "prompt_mean" else (batch.response_mask & mask)
        if skip_special and batch.special_mask is not None:
            kept = sel & ~batch.special_mask.to(sel.device)
            sel = torch.where(kept.any(1, keepdim=True), kept, sel)
        counts = sel.sum(1, keepdim=True)
        if (counts == 0).any():
            what = "responses" if rule == "response_mean" else "prompt tokens"
            raise ValueError(f"positions={rule!r} but some items have no {what}; pass responses= to capture")
        return Plan(weights=sel.float() / counts)
    raise ValueError(f"unknown position rule {rule!r}; use one of {RULES} or explicit int positions")


def without_first(mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` mask of each row's real tokens less its first one: the attention sink, whose activations many
    models (SmolLM2, Llama, Gemma) make orders of magnitude larger than the rest, so dictionaries leave it out.
    Works for left or right padding."""
    m = mask.bool().clone()
    has = m.any(1)
    rows = torch.arange(m.shape[0], device=m.device)[has]
    m[rows, m[has].long().argmax(1)] = False
    return m


def _last_true(m: torch.Tensor) -> torch.Tensor:
    """Index of the last True per row of ``m [B, T]`` (-1 when none)."""
    T = m.shape[1]
    ar = torch.arange(T).expand_as(m)
    return torch.where(m, ar, torch.full_like(ar, -1)).max(1).values
