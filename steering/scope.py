"""Which tokens of the current forward pass an edit touches: prompt vs generated, and prompt positions.

:func:`steering.apply` puts a :class:`TokenState` in the hooks' shared ``data`` dict under ``"token_state"``
before every forward pass of the model (from the attention mask and the KV-cache length). Any hook, also
one from a package that does not import ``steering`` (e.g. ``sae`` latent interventions), can read it:

    st = ctx.data.get("token_state")
    mask = st.mask("generated", "all")      # Bool[batch, seq] for the tokens of this pass

The first pass over an empty cache is the prompt pass: its columns (left padded) are the prompt, and
each row's prompt runs from its first to its last real token. Later passes (with a cache) hold generated
tokens. :meth:`Steering.set_batch` may declare the prompt batch up front (its post-instruction mask, used
when a cacheless pass has the declared shape, or a pass after the declared number of cached prompt columns);
:func:`steering.generate` does this for every batch.
Chunked prefill (``prefill_chunk_size``) is not supported: its later chunks would count as generated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from interp.positions import columns

STATE_KEY = "token_state"
PROMPT_KEY = "steering.prompt"
DECLARED_KEY = "steering.declared"
ROWS_KEY = "steering.rows"  # after rows left the batch mid-generation: (original batch size, Long[rows] kept)
SKIP = "skip"  # select(): the edit touches no token of this pass


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
class TokenState:
    """The current pass: ``seq`` new tokens after ``past`` cached ones, for a batch of ``batch`` rows."""

    batch: int
    seq: int
    past: int
    prompt: PromptRecord
    device: torch.device
    _cache: dict = field(default_factory=dict, repr=False)

    def rows(self, sel: slice) -> TokenState:
        """This pass as rows ``sel`` of the batch see it (their prompt record; the same columns)."""
        return TokenState(len(range(self.batch)[sel]), self.seq, self.past, self.prompt.rows(sel), self.device)

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


def record_pass(data: dict, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook body on the whole model: set ``data["token_state"]`` for this pass."""
    ids = _get(args, kwargs, "input_ids", 0)
    emb = kwargs.get("inputs_embeds")
    ref = ids if ids is not None else emb
    if ref is None:
        data.pop(STATE_KEY, None)
        return
    B, S = ref.shape[0], ref.shape[1]
    device = ref.device
    past = _cache_len(kwargs.get("cache", kwargs.get("past_key_values")))
    attn = _get(args, kwargs, "attention_mask", 1)
    if not isinstance(attn, Tensor) or attn.dim() != 2:
        attn = None
    rec: PromptRecord | None = data.get(PROMPT_KEY)
    if past == 0 or rec is None or rec.start.shape[0] != B:
        declared = data.get(DECLARED_KEY)
        width = S + past
        post = None
        if declared is not None and declared["width"] == S + past and declared["batch"] == B and \
                past == declared.get("cached", 0):  # the declared prompt pass (after its cached columns, if any)
            width, post = declared["width"], declared["post_mask"]
        elif past > 0:
            width = past
        start, end = _spans(attn, width, B, device)
        rec = PromptRecord(width, start, end, post)
        data[PROMPT_KEY] = rec
        data.pop(ROWS_KEY, None)  # a new prompt: every row is there
    data[STATE_KEY] = TokenState(B, S, past, rec, device)


def keep_rows(data: dict, idx: Tensor) -> None:
    """Only rows ``idx`` of the current batch go on (the others finished generating): the prompt record is sliced
    to them, and ``data[ROWS_KEY]`` says which of the batch's original rows they are (for edits that act per row,
    such as :class:`~steering.rows.RowGroups`). A new prompt pass (:meth:`~steering.applying.Steering.set_batch`)
    starts over with every row."""
    rec: PromptRecord | None = data.get(PROMPT_KEY)
    if rec is None:
        raise RuntimeError("keep_rows needs a prompt pass first: there is no prompt record in the hooks' data")
    total, rows = data.get(ROWS_KEY, (rec.start.shape[0], torch.arange(rec.start.shape[0], device=idx.device)))
    data[PROMPT_KEY] = rec.rows(idx)
    data[ROWS_KEY] = (total, rows.to(idx.device)[idx])
