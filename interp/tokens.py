"""Which tokens a forward pass holds: prompt vs generated columns, and each row's real prompt span.

:func:`interp.hooks` records every forward pass of the model once, before it runs, from its attention mask and
KV-cache length (a :class:`TokenTracker` as a pre-hook on the whole model); each hook reads it as ``ctx.tokens``
(a :class:`TokenState`), e.g. ``ctx.tokens.mask("generated")`` -> ``Bool[batch, seq]`` for this pass's tokens.

The first pass over an empty cache is the prompt pass: its columns (left padded) are the prompt, and each row's
prompt runs from its first to its last real token. Later passes (with a cache) hold generated tokens.
:meth:`TokenTracker.declare` may declare the prompt batch up front (its post-instruction mask, used when a
cacheless pass has the declared shape, or a pass after the declared number of cached prompt columns), and
:meth:`TokenTracker.keep_rows` says which rows go on after finished ones left the batch; ``steering.apply``'s
handle does both for ``steering.generate``. Chunked prefill (``prefill_chunk_size``) is not supported: its later
chunks would count as generated.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from interp.positions import columns

SKIP = "skip"  # TokenState.select(): the edit touches no token of this pass


@dataclass
class PromptRecord:
    """The prompt of the sequence being generated: padded width and per-row real span."""

    width: int
    start: Tensor            # [B] first real column
    end: Tensor              # [B] one past the last real column
    post_mask: Tensor | None  # [B, width] post-instruction tokens, when declared

    def rows(self, sel: slice | Tensor) -> PromptRecord:
        """The record of rows ``sel`` (a slice, or indices) of the batch."""
        post = None if self.post_mask is None else self.post_mask[
            sel if isinstance(sel, slice) else sel.to(self.post_mask.device)]
        at = sel if isinstance(sel, slice) else sel.to(self.start.device)
        return PromptRecord(self.width, self.start[at], self.end[at], post)


@dataclass
class KeptRows:
    """The rows still generating after finished ones left the batch: row ``i`` of the pass is row ``index[i]`` of
    the prompt batch of ``total`` rows (``index``: ``Long[rows]``)."""

    total: int
    index: Tensor


@dataclass
class Declared:
    """A prompt batch declared before its pass: ``batch`` rows of ``width`` columns, its post-instruction mask
    (``Bool[batch, width]`` or None), and how many of its first columns come from a KV cache."""

    width: int
    batch: int
    post_mask: Tensor | None = None
    cached: int = 0


@dataclass
class TokenState:
    """The current pass: ``seq`` new tokens after ``past`` cached ones, for a batch of ``batch`` rows; ``kept``: which
    rows of the prompt batch these are, once finished rows left it (None: all of them)."""

    batch: int
    seq: int
    past: int
    prompt: PromptRecord
    device: torch.device
    kept: KeptRows | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    def rows(self, sel: slice) -> TokenState:
        """This pass as rows ``sel`` of the batch see it (their prompt record; the same columns)."""
        kept = None if self.kept is None else KeptRows(self.kept.total, self.kept.index[sel])
        return TokenState(len(range(self.batch)[sel]), self.seq, self.past, self.prompt.rows(sel), self.device, kept)

    @property
    def all_prompt(self) -> bool:
        return self.past + self.seq <= self.prompt.width

    @property
    def all_generated(self) -> bool:
        return self.past >= self.prompt.width

    def _cols(self) -> Tensor:
        return torch.arange(self.past, self.past + self.seq, device=self.device)

    def select(self, scope: str, positions: Any) -> Tensor | str | None:
        """``None``: every token; :data:`SKIP`: none; else ``Bool[batch, seq]`` (cached per pass)."""
        key = (scope, positions)
        if key not in self._cache:
            self._cache[key] = self._select(scope, positions)
        return self._cache[key]

    def mask(self, scope: str, positions: Any = "all") -> Tensor:
        """Always a ``Bool[batch, seq]`` tensor (materialises :meth:`select`)."""
        sel = self.select(scope, positions if isinstance(positions, (str, tuple)) else tuple(positions))
        if sel is None or isinstance(sel, str):
            return torch.full((self.batch, self.seq), sel is None, dtype=torch.bool, device=self.device)
        return sel

    def _select(self, scope: str, positions: Any) -> Tensor | str | None:
        want_prompt = scope in ("prompt", "both")
        want_gen = scope in ("generated", "both")
        if self.all_generated:
            return None if want_gen else SKIP
        if positions == "all" and self.all_prompt:
            return None if want_prompt else SKIP
        if not want_prompt and self.all_prompt:
            return SKIP
        cols = self._cols()
        gen = (cols >= self.prompt.width)[None, :].expand(self.batch, self.seq)
        prompt_sel = self._prompt_positions(positions, cols) if want_prompt else torch.zeros_like(gen)
        out = prompt_sel & ~gen
        if want_gen:
            out = out | gen
        return out

    def _prompt_positions(self, positions: Any, cols: Tensor) -> Tensor:
        B, S = self.batch, self.seq
        rec = self.prompt
        if positions == "all":
            return torch.ones(B, S, dtype=torch.bool, device=self.device)
        if positions == "post_instruction":
            if rec.post_mask is None:
                raise ValueError("positions='post_instruction' needs the post-instruction mask: run through "
                                 "steering.generate(...), or call handle.set_batch(batch) (an interp.chat.Batch) "
                                 "inside `with steering.apply(...) as handle:` before the forward pass")
            pm = rec.post_mask.to(self.device)
            out = torch.zeros(B, S, dtype=torch.bool, device=self.device)
            inside = cols < rec.width
            out[:, inside] = pm[:, cols[inside]]
            return out
        col = columns(list(positions), rec.start.to(self.device), rec.end.to(self.device))  # [B, P]
        return (cols[None, :, None] == col[:, None, :]).any(-1)


def _get(args: tuple, kwargs: dict, name: str, index: int) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else None


def _cache_len(cache: Any) -> int:
    if cache is None:
        return 0
    if hasattr(cache, "get_seq_length"):
        return int(cache.get_seq_length())
    if isinstance(cache, (tuple, list)) and cache and isinstance(cache[0], (tuple, list)):
        return int(cache[0][0].shape[-2])
    return 0


def _spans(attn: Tensor | None, width: int, batch: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Per row: first real column and one past the last (left or right padding)."""
    if attn is None:
        return (torch.zeros(batch, dtype=torch.long, device=device),
                torch.full((batch,), width, dtype=torch.long, device=device))
    m = attn[:, :width].bool()
    ar = torch.arange(width, device=m.device)
    start = torch.where(m, ar, width).min(1).values
    end = torch.where(m, ar + 1, 0).max(1).values
    return start, end


class TokenTracker:
    """The token state across the passes of one hooks block: ``state`` (this pass), the ``prompt`` record the
    passes of one generation share, and what the caller declared (``declared``, ``kept``)."""

    def __init__(self, state: TokenState | None = None):
        self.state: TokenState | None = state
        self.prompt: PromptRecord | None = None
        self.declared: Declared | None = None
        self.kept: KeptRows | None = None

    def pre_hook(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        """Forward pre-hook on the whole model (``with_kwargs=True``): record the pass about to run."""
        self.record(args, kwargs)

    def record(self, args: tuple, kwargs: dict) -> TokenState | None:
        """Set ``state`` from a model call's arguments (token ids or embeddings, attention mask, cache)."""
        ids = _get(args, kwargs, "input_ids", 0)
        ref = ids if isinstance(ids, Tensor) else kwargs.get("inputs_embeds")
        if not isinstance(ref, Tensor) or ref.dim() < 2:
            self.state = None
            return None
        B, S, device = ref.shape[0], ref.shape[1], ref.device
        past = _cache_len(kwargs.get("cache", kwargs.get("past_key_values")))
        attn = _get(args, kwargs, "attention_mask", 1)
        rec = self.prompt
        if past == 0 or rec is None or rec.start.shape[0] != B:
            rec = self._new_prompt(B, S, past, attn if isinstance(attn, Tensor) and attn.dim() == 2 else None, device)
        self.state = TokenState(B, S, past, rec, device, self.kept)
        return self.state

    def _new_prompt(self, B: int, S: int, past: int, attn: Tensor | None, device: torch.device) -> PromptRecord:
        d = self.declared
        width, post = S + past, None
        if d is not None and d.width == S + past and d.batch == B and past == d.cached:
            post = d.post_mask  # the declared prompt pass (after its cached columns, if any)
        elif past > 0:
            width = past
        start, end = _spans(attn, width, B, device)
        self.prompt = PromptRecord(width, start, end, post)
        self.kept = None  # a new prompt: every row is there
        return self.prompt

    def declare(self, width: int, batch: int, post_mask: Tensor | None = None, cached: int = 0) -> None:
        """The next prompt pass is ``batch`` rows of ``width`` columns (the first ``cached`` from a KV cache), with
        this post-instruction mask (``Bool[batch, width]``); it starts over with every row."""
        self.declared = Declared(int(width), int(batch), None if post_mask is None else post_mask.bool(), int(cached))
        self.prompt, self.kept = None, None

    def clear(self) -> None:
        """Forget the declared batch and the prompt record."""
        self.declared, self.prompt, self.kept = None, None, None

    def keep_rows(self, idx: Tensor) -> None:
        """Only rows ``idx`` of the current batch go on (the others finished generating): the prompt record is sliced
        to them, and ``kept`` says which of the prompt batch's rows they are (for edits that act per row)."""
        if self.prompt is None:
            raise RuntimeError("keep_rows needs a prompt pass first: no forward pass has recorded a prompt yet")
        n = self.prompt.start.shape[0]
        kept = self.kept or KeptRows(n, torch.arange(n, device=idx.device))
        self.prompt = self.prompt.rows(idx)
        self.kept = replace(kept, index=kept.index.to(idx.device)[idx])


__all__ = ["SKIP", "Declared", "KeptRows", "PromptRecord", "TokenState", "TokenTracker"]
