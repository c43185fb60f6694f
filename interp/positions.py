"""Position rules: which token positions of a left-padded batch a capture keeps.

A rule turns a :class:`~interp.chat.Batch` into a :class:`Plan`: either gather ``index [B, P]`` (with a
validity ``mask [B, P]``) or average with ``weights [B, T]``. ``last`` squeezes ``P`` away.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from interp.chat import Batch

RULES = ("last", "post_instruction", "all", "prompt_mean", "response_mean")


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


def describe(rule: str | int | list[int]) -> str:
    return rule if isinstance(rule, str) else f"positions{list(rule) if not isinstance(rule, int) else [rule]}"


def plan(rule: str | int | list[int], batch: Batch) -> Plan:
    """Build the plan of ``rule`` for ``batch``.

    Rules: ``last`` (last prompt token), ``post_instruction`` (chat-template tokens after the user
    message), ``all`` (every real token), ``prompt_mean``, ``response_mean``, or explicit positions:
    an int / list of ints, negative from the end of the prompt, non-negative from its first real token.
    """
    mask = batch.attention_mask.bool()
    B, T = mask.shape
    prompt = mask & ~batch.response_mask
    if isinstance(rule, (int, list, tuple)) and not isinstance(rule, bool):
        pos = [rule] if isinstance(rule, int) else list(rule)
        if not pos:
            raise ValueError("an empty list of positions; give at least one position")
        n_real = prompt.sum(1)                            # [B]
        prompt_end = _last_true(prompt) + 1               # exclusive end of the prompt
        cols = []
        for p in pos:
            col = prompt_end + p if p < 0 else (prompt_end - n_real) + p
            if ((col < prompt_end - n_real) | (col >= prompt_end)).any():
                short = int(n_real.min())
                raise ValueError(f"position {p} is out of range for a prompt of {short} tokens")
            cols.append(col)
        idx = torch.stack(cols, 1)
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
        counts = sel.sum(1, keepdim=True)
        if (counts == 0).any():
            what = "responses" if rule == "response_mean" else "prompt tokens"
            raise ValueError(f"positions={rule!r} but some items have no {what}; pass responses= to capture")
        return Plan(weights=sel.float() / counts)
    raise ValueError(f"unknown position rule {rule!r}; use one of {RULES} or explicit int positions")


def _last_true(m: torch.Tensor) -> torch.Tensor:
    """Index of the last True per row of ``m [B, T]`` (-1 when none)."""
    T = m.shape[1]
    ar = torch.arange(T).expand_as(m)
    return torch.where(m, ar, torch.full_like(ar, -1)).max(1).values
