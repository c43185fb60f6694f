"""Position rules: which token positions of a left-padded batch a capture keeps.

A rule turns a :class:`~interp.chat.Batch` into a :class:`Plan`: either gather ``index [B, P]`` (with a
validity ``mask [B, P]``) or average with ``weights [B, T]``. ``last`` squeezes ``P`` away.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from interp.chat import Batch

RULES = ("last", "post_instruction", "all", "prompt_mean", "response_mean")
SINKS = ("exclude", "keep")
SINK_RATIO = 20.0
"""A position is a massive activation (an attention sink) at a site when its activation norm exceeds
``SINK_RATIO`` x the (lower) median norm of its row's real tokens there. Measured (resid_post, 13 prompts): the
largest ratio of any other token was 13.5 (Gemma 3 270M, layer 0), 8.7 (SmolLM2, ' the' at layers 2-8) and
2.0 (the tiny models, the organism); SmolLM2's first token is 41-186x at layers 11-27. 20 sits between, with a
margin of 1.5x below and 2x above. Ratios of 4-17 (SmolLM2's first token at layers 1-8 and 28-29, Gemma's BOS) are
not flagged: there the token does not dominate a mean over a dozen tokens."""
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
    real: torch.Tensor | None = None     # [B, T] real tokens (the rows the sink rule's median is taken over)
    sinks: str = "exclude"               # means: leave out massive positions (see SINK_RATIO) or keep them

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, T, ...]`` -> ``[B, P, ...]``, ``[B, ...]`` (squeezed / averaged); computed in float32 for means."""
        return self.take(x)[0]

    def take(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`apply` and the massive positions (:func:`massive`) among the rule's: ``[B, P]`` flags where
        positions are kept, ``[B]`` counts for a mean (left out unless ``sinks='keep'``); ``None`` without ``real``."""
        known = self.real is not None and tuple(x.shape[:2]) == tuple(self.real.shape)
        flags = massive(x, self.real.to(x.device)) if known else None
        if self.weights is not None:
            w = self.weights.to(x.device, torch.float32)
            if flags is None:
                return torch.einsum("bt...,bt->b...", x.float(), w), None
            hit = flags & (w > 0)
            if self.sinks == "exclude":  # a row whose every weighted position is massive keeps them
                hit &= (w.masked_fill(hit, 0.0).sum(1, keepdim=True) > 0)
                left = w.masked_fill(hit, 0.0)
                w = torch.where(hit.any(1, keepdim=True), left / left.sum(1, keepdim=True), w)  # rows without: exact
            return torch.einsum("bt...,bt->b...", x.float(), w), hit.sum(1)
        if flags is not None:
            flags = flags & self.real.to(x.device)
            flags = flags if self.index is None else flags.gather(1, self.index.to(x.device))
            flags = flags & self.mask.to(x.device)
        if self.index is None:  # every position
            return x, flags
        idx = self.index.to(x.device)
        gathered = x[torch.arange(x.shape[0], device=x.device)[:, None], idx]
        return (gathered[:, 0] if self.squeeze else gathered), flags

    @property
    def n_positions(self) -> int | None:
        if self.squeeze or self.weights is not None:
            return None
        return self.mask.shape[1]


@dataclass(frozen=True)
class Positions:
    """Which positions a capture keeps and how its means are taken: ``rule`` (one of :data:`RULES`, an int or a
    list of ints, see :func:`plan`), ``sinks`` (``"exclude"``: means leave out massive positions; ``"keep"``) and
    ``skip_special`` (means leave out BOS and template tokens; ``False`` includes them). ``positions=`` takes this
    or a plain rule (these defaults, :meth:`of`)."""

    rule: PositionSpec = "last"
    sinks: str = "exclude"
    skip_special: bool = True

    def __post_init__(self) -> None:
        rule = self.rule
        if isinstance(rule, str):
            if rule not in RULES:
                raise ValueError(f"unknown position rule {rule!r}; use one of {RULES} or explicit int positions")
        elif isinstance(rule, bool) or not (isinstance(rule, int) or (isinstance(rule, Sequence) and all(
                isinstance(i, int) and not isinstance(i, bool) for i in rule))):
            raise TypeError(f"positions must be one of {RULES}, an int or a list of ints, got {rule!r}")
        elif not isinstance(rule, int):
            object.__setattr__(self, "rule", tuple(rule))
        check_sinks(self.sinks)
        if not isinstance(self.skip_special, bool):
            raise TypeError(f"skip_special must be True or False, got {self.skip_special!r}")

    @classmethod
    def of(cls, positions: Positions | PositionSpec) -> Positions:
        """``positions`` as :class:`Positions` (a plain rule gets the defaults)."""
        return positions if isinstance(positions, Positions) else cls(positions)

    @property
    def mean(self) -> bool:
        return isinstance(self.rule, str) and "mean" in self.rule

    def describe(self) -> str:
        """The rule as recorded in metadata and fingerprints (``+special`` / ``+sinks``: a mean keeping those)."""
        text = describe(self.rule)
        return text + ("+special" if self.mean and not self.skip_special else "") + (
            "+sinks" if self.mean and self.sinks == "keep" else "")


def describe(rule: PositionSpec) -> str:
    """A rule as text (for metadata and fingerprints)."""
    return rule if isinstance(rule, str) else f"positions{list(rule) if not isinstance(rule, int) else [rule]}"


def check_sinks(sinks: str) -> str:
    """``sinks`` if it is one of :data:`SINKS`, else an error naming them."""
    if sinks not in SINKS:
        raise ValueError(f"sinks={sinks!r}: pass sinks='exclude' or 'keep' (massive-activation positions, see "
                         f"interp.positions.SINK_RATIO, left out of means and training data, or kept)")
    return sinks


def massive(x: torch.Tensor, real: torch.Tensor, ratio: float = SINK_RATIO) -> torch.Tensor:
    """``[B, T]`` massive-activation positions of ``x [B, T, ...]``: real tokens (``real [B, T]``) whose norm
    exceeds ``ratio`` x the lower median norm of their row's real tokens (see :data:`SINK_RATIO`)."""
    real = real.bool()
    norms = x.detach().float().flatten(2).norm(dim=-1)
    med = norms.masked_fill(~real, float("nan")).nanmedian(1, keepdim=True).values
    return real & (norms > ratio * med)


def sink_note(sites: list[str], tally: torch.Tensor | None, sinks: str, mean: bool) -> dict[str, Any]:
    """``meta["sinks"]``: the rule, the mode and the massive positions found per site (``excluded`` from a mean);
    warns when a mean left some out."""
    note: dict[str, Any] = {"mode": sinks, "ratio": SINK_RATIO,
                            "rule": "norm > ratio x the lower median norm of the prompt's real tokens at the site"}
    if tally is None:
        return note
    counts = {s: int(c) for s, c in zip(sites, tally.tolist(), strict=True)}
    note["flagged"] = counts
    if mean and sinks == "exclude":
        note["excluded"] = counts
        if sum(counts.values()):
            hit = [k for k, v in counts.items() if v]
            warnings.warn(f"left {sum(counts.values())} massive-activation positions (attention sinks: norm > "
                          f"{SINK_RATIO:g}x the prompt's median) out of the means at {len(hit)} of {len(sites)} sites "
                          f"({hit[0]}{' ...' if len(hit) > 1 else ''}); meta['sinks'] has the counts, "
                          f"interp.Positions(rule, sinks='keep') includes them", UserWarning, stacklevel=5)
    return note


def plan(rule: PositionSpec, batch: Batch, skip_special: bool = True, sinks: str = "exclude") -> Plan:
    """Build the plan of ``rule`` for ``batch``.

    Rules: ``last`` (last prompt token), ``post_instruction`` (chat-template tokens after the user
    message), ``all`` (every real token), ``prompt_mean``, ``response_mean``, or explicit positions:
    an int / list of ints, negative from the end of the prompt, non-negative from its first real token.
    ``skip_special``: the means leave out the tokenizer's special tokens (BOS, template tokens), whose huge
    attention-sink activations would dominate them; a row made only of special tokens keeps them all.
    ``sinks``: the means also leave out massive-activation positions (:func:`massive`), found per site from the
    activations themselves (e.g. SmolLM2's first token without a chat template); ``"keep"`` includes them.
    Every plan reports them (:meth:`Plan.take`).
    """
    p = _plan(rule, batch, skip_special)
    p.real, p.sinks = batch.attention_mask.bool(), check_sinks(sinks)
    return p


def _plan(rule: PositionSpec, batch: Batch, skip_special: bool) -> Plan:
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
            raise ValueError(f"positions={rule!r} but some items have no {what}; give them responses: "
                             f"capture(model, interp.Prompts(texts, responses=...), ...)")
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
