"""Training pairs as token rows: (prompt, response) through the chat template (``interp.forward.prepare``), with a
per-token loss mask over the response tokens.

A response's token ``k`` sits at position ``response_start + k`` of its row (BOS and template included), exactly
where :func:`interp.readout.token_logprobs` and :func:`tune.attribution.token_attribution` put it, so a mask built
from an attribution (``tune.masks.top_mask``) lines up with the tokens trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from interp.chat import Encoded
from interp.forward import prepare
from interp.io import content_hash
from interp.models import Model
from interp.values import Prompts, moved_keywords

MOVED = {"chat": "prompts=interp.Prompts(texts, chat=...)", "system": "prompts=interp.Prompts(texts, system=...)"}
"""The formatting keywords the fine-tuning functions took before issue 37: the prompts carry them."""

MaskLike = Sequence[bool] | Sequence[int] | torch.Tensor


@dataclass(frozen=True)
class Row:
    """One training pair: ``enc`` (token ids, where the response starts) and ``keep [k]``, one flag per response
    token: ``True`` when the token is in the loss."""

    enc: Encoded
    keep: tuple[bool, ...]

    @property
    def n_response(self) -> int:
        return len(self.enc.ids) - self.enc.response_start


def check_pairs(prompts: Sequence[str], responses: Sequence[str]) -> None:
    """Refuse a single string, or responses that do not match the prompts one to one."""
    for what, xs in (("prompts", prompts), ("responses", responses)):
        if isinstance(xs, str):
            raise TypeError(f"{what} must be a list of strings, not one string; wrap it in a list")
    if len(prompts) != len(responses):
        raise ValueError(f"{len(responses)} responses for {len(prompts)} prompts; give exactly one response per "
                         f"prompt, in the same order")
    if not prompts:
        raise ValueError("no training pairs; give at least one (prompt, response)")
    empty = [i for i, r in enumerate(responses) if not r]
    if empty:
        raise ValueError(f"response {empty[0]} is empty; every pair needs a response to learn from")


@moved_keywords(MOVED)
def encode_pairs(model: Model, prompts: Prompts | Sequence[str], responses: Sequence[str],
                 mask_out: Sequence[MaskLike] | None = None) -> list[Row]:
    """Rows of (prompt, response) pairs, in the prompts' chat format (a list: the chat template;
    ``interp.Prompts(texts, chat=False, system=...)`` to change it); ``mask_out[i]`` (one flag per response token of
    pair ``i``, ``True`` = masked out of the loss) removes tokens from the loss. ``None``: every response token
    counts."""
    check_pairs(prompts, responses)
    p = Prompts.of(prompts)
    _, encs = prepare(model, list(p.texts), chat=p.chat, responses=list(responses), system=p.system)
    short = [i for i, e in enumerate(encs) if len(e.ids) - e.response_start < 1 or e.response_start < 1]
    if short:
        raise ValueError(f"response {short[0]} has no tokens after the prompt; check the response text")
    keeps = [tuple([True] * (len(e.ids) - e.response_start)) for e in encs] if mask_out is None \
        else _keeps(encs, mask_out)
    if not any(any(k) for k in keeps):
        raise ValueError("the mask removes every response token from the loss, so there is nothing to train on; "
                         "mask fewer tokens (e.g. a lower q in tune.masks.top_mask) or pass mask_out=None")
    return [Row(e, k) for e, k in zip(encs, keeps, strict=True)]


def _keeps(encs: list[Encoded], mask_out: Sequence[MaskLike]) -> list[tuple[bool, ...]]:
    if isinstance(mask_out, torch.Tensor) and mask_out.dim() < 2:
        raise TypeError("mask_out must hold one mask per pair (a list of per-token masks), not one flat mask")
    if len(mask_out) == 0:
        raise ValueError(f"mask_out is empty but there are {len(encs)} pairs; give one mask per pair "
                         f"(tune.masks.top_mask builds them) or pass mask_out=None to train on every token")
    if len(mask_out) != len(encs):
        raise ValueError(f"{len(mask_out)} masks for {len(encs)} pairs; give one mask per pair")
    out = []
    for i, (e, m) in enumerate(zip(encs, mask_out, strict=True)):
        flags = [bool(x) for x in (m.tolist() if isinstance(m, torch.Tensor) else m)]
        n = len(e.ids) - e.response_start
        if len(flags) != n:
            raise ValueError(f"mask {i} has {len(flags)} entries but response {i} has {n} tokens; build masks from "
                             f"token_attribution on the same prompts and responses (one flag per response token)")
        out.append(tuple(not f for f in flags))
    return out


def fingerprint(rows: Sequence[Row]) -> str:
    """A short hash of the rows' token ids and loss masks (a resumed run refuses other data)."""
    return content_hash([[r.enc.ids, r.enc.response_start, list(r.keep)] for r in rows])


def targets(rows: Sequence[Row], width: int) -> torch.Tensor:
    """``[B, width]`` bool, left-padded like :func:`interp.chat.collate`: ``True`` at the positions whose token is
    in the loss."""
    out = torch.zeros(len(rows), width, dtype=torch.bool)
    for b, r in enumerate(rows):
        start = width - len(r.enc.ids) + r.enc.response_start
        out[b, start:width] = torch.tensor(r.keep, dtype=torch.bool)
    return out


__all__ = ["Row", "check_pairs", "encode_pairs", "fingerprint", "targets"]
