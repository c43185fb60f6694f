"""Prompt sets as left-padded batches, paired runs with an explicit position alignment, and plain forwards.

A :class:`PromptPairs` holds a clean and a corrupted batch (one row per pair) and an alignment: ``P`` aligned
positions, with the padded column of each aligned position in each run (``cols[run]`` is ``[n_pairs, P]``).
Patching moves activations between the two runs along this alignment only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int

from interp.chat import Batch, Encoded, collate
from interp.hooks import HookContext, hooks
from interp.models import Model
from interp.sites import Site

RUNS = ("clean", "corrupted")
Prompts = Sequence[str] | Sequence[Sequence[int]] | Batch


def encode_prompts(model: Model, prompts: Prompts, chat: bool = True) -> Batch:
    """Strings (chat-formatted unless ``chat=False``) or lists of token ids -> one left-padded :class:`Batch`."""
    if isinstance(prompts, Batch):
        return prompts
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of strings (or of token-id lists), not one string; wrap it in a list")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("the prompt list is empty; give at least one prompt")
    pad = 0
    if model.tokenizer is not None and model.tokenizer.pad_token_id is not None:
        pad = int(model.tokenizer.pad_token_id)
    if all(isinstance(p, str) for p in prompts):
        from interp.forward import prepare

        _, encs = prepare(model, prompts, chat=chat)
    elif all(isinstance(p, (list, tuple, torch.Tensor)) for p in prompts):
        encs = []
        for i, p in enumerate(prompts):
            ids = [int(t) for t in (p.tolist() if isinstance(p, torch.Tensor) else p)]
            if not ids:
                raise ValueError(f"prompt {i} has no tokens")
            encs.append(Encoded(ids, len(ids), len(ids)))
    else:
        raise TypeError("prompts must all be strings or all be token-id lists")
    return collate(encs, pad, max_length=model.max_length)


def lengths(batch: Batch) -> torch.Tensor:
    return batch.attention_mask.sum(1).long()


def column(batch: Batch, row: int, pos: int, what: str) -> int:
    """Padded column of prompt position ``pos`` (>= 0 from the first real token, < 0 from the end)."""
    n = int(batch.attention_mask[row].sum())
    T = batch.input_ids.shape[1]
    if not -n <= pos < n:
        raise ValueError(f"position {pos} is out of range for {what}, which has {n} tokens (valid {-n}..{n - 1}); "
                         f"fix the alignment")
    return T - n + pos if pos >= 0 else T + pos


@dataclass
class PromptPairs:
    """Paired clean/corrupted batches and their aligned positions (``cols[run]``: ``[n_pairs, P]`` columns)."""

    clean: Batch
    corrupted: Batch
    cols: dict[str, torch.Tensor]
    labels: list[str]

    @property
    def n_pairs(self) -> int:
        return self.clean.input_ids.shape[0]

    @property
    def n_positions(self) -> int:
        return self.cols["clean"].shape[1]

    def batch(self, run: str) -> Batch:
        check_run(run)
        return self.clean if run == "clean" else self.corrupted

    def __repr__(self) -> str:
        return f"PromptPairs(n_pairs={self.n_pairs}, aligned_positions={self.n_positions})"


def check_pairs(pairs: object) -> None:
    if not isinstance(pairs, PromptPairs):
        raise TypeError(f"expected PromptPairs from make_pairs(model, clean, corrupted), got {type(pairs).__name__}")


def check_run(run: str) -> None:
    if run not in RUNS:
        raise ValueError(f"run must be one of {RUNS}, got {run!r}")


def make_pairs(model: Model, clean: Prompts, corrupted: Prompts, align: Any = "end", chat: bool = True) -> PromptPairs:
    """Pair clean and corrupted prompts and align their positions.

    ``align``: ``"end"`` (default; the last ``P`` tokens, ``P`` the shortest prompt: chat suffixes line up),
    ``"start"``, a list of ``(clean_pos, corrupted_pos)`` shared by all pairs, or one such list per pair.
    Positions count from the first real token (>= 0) or from the end (< 0).
    """
    cb, rb = encode_prompts(model, clean, chat), encode_prompts(model, corrupted, chat)
    n = cb.input_ids.shape[0]
    if rb.input_ids.shape[0] != n:
        raise ValueError(f"{n} clean prompts but {rb.input_ids.shape[0]} corrupted prompts; they must be paired 1:1")
    lc, lr = lengths(cb), lengths(rb)
    if isinstance(align, str):
        P = int(torch.minimum(lc, lr).min())
        if align == "end":
            per_pair = [[(p - P, p - P) for p in range(P)]] * n
            labels = [f"{p - P}" for p in range(P)]
        elif align == "start":
            per_pair = [[(p, p) for p in range(P)]] * n
            labels = [f"{p}" for p in range(P)]
        else:
            raise ValueError(f"align must be 'end', 'start' or a list of (clean_pos, corrupted_pos) pairs, got {align!r}")
    else:
        per_pair = _explicit(align, n)
        labels = [f"{c}/{r}" if c != r else f"{c}" for c, r in per_pair[0]]
    cc = torch.tensor([[column(cb, i, c, f"clean prompt {i}") for c, _ in pp] for i, pp in enumerate(per_pair)])
    rc = torch.tensor([[column(rb, i, r, f"corrupted prompt {i}") for _, r in pp] for i, pp in enumerate(per_pair)])
    tok = model.tokenizer
    if tok is not None:
        labels = [f"{lab} {tok.decode([int(cb.input_ids[0, c])])!r}"[:24] for lab, c in zip(labels, cc[0].tolist(), strict=True)]
    return PromptPairs(clean=cb, corrupted=rb, cols={"clean": cc, "corrupted": rc}, labels=labels)


def _explicit(align: Any, n: int) -> list[list[tuple[int, int]]]:
    items = list(align)
    if not items:
        raise ValueError("an empty alignment; give at least one (clean_pos, corrupted_pos) pair")
    shared = all(_is_pair(x) for x in items)
    per_pair = [items] * n if shared else items
    if not shared and (len(per_pair) != n or not all(all(_is_pair(x) for x in pp) for pp in per_pair)):
        raise ValueError("align must be a list of (clean_pos, corrupted_pos) int pairs, or one such list per prompt "
                         f"pair ({n} lists)")
    P = len(per_pair[0])
    if any(len(pp) != P for pp in per_pair):
        raise ValueError("every prompt pair must align the same number of positions")
    return [[(int(c), int(r)) for c, r in pp] for pp in per_pair]


def _is_pair(x: Any) -> bool:
    return isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(v, int) for v in x)


def inputs(model: Model, batch: Batch, repeat: int = 1) -> dict[str, torch.Tensor]:
    """Model inputs on the model's device, the batch stacked ``repeat`` times along the batch dimension."""
    dev = model.device
    return {k: v.to(dev).repeat(repeat, 1) for k, v in batch.model_inputs.items()}


def last_logits(model: Model, model_inputs: Mapping[str, torch.Tensor]) -> Float[torch.Tensor, "b vocab"]:
    """Logits at the last (real, since padding is on the left) position, in float32."""
    out = model.hf(**model_inputs, use_cache=False, logits_to_keep=1)
    return out.logits[:, -1].float()


def run_with_capture(model: Model, batch: Batch, sites: Sequence[Site], grad: bool = False
                     ) -> tuple[dict[Site, torch.Tensor], torch.Tensor]:
    """One forward keeping the full activations ``[n, T, ...]`` of ``sites`` and the last-position logits.

    With ``grad=True`` the activations stay in the autograd graph (for attribution), also when the model's
    weights are frozen: the embedding output is made to require grad.
    """
    got: dict[Site, torch.Tensor] = {}

    def make(site: Site):
        def fn(x: torch.Tensor, ctx: HookContext) -> torch.Tensor | None:
            got[site] = x
            return x if grad else None  # returning x keeps the very tensor used downstream in the graph
        return fn

    cm = _grad_entry(model) if grad else nullcontext()
    with torch.set_grad_enabled(grad), cm, hooks(model, [(s, make(s)) for s in sites]):
        logits = last_logits(model, inputs(model, batch))
    return got, logits


class _grad_entry:
    """Make the token embedding's output require grad, so activations get gradients with frozen weights."""

    def __init__(self, model: Model) -> None:
        self.module = model.module(model.spec.embed)
        self.handle: Any = None

    def __enter__(self) -> _grad_entry:
        def hook(mod: Any, args: Any, out: torch.Tensor) -> torch.Tensor:
            return out if out.requires_grad else out.detach().requires_grad_(True)
        self.handle = self.module.register_forward_hook(hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.handle.remove()


def gather_aligned(x: torch.Tensor, cols: Int[torch.Tensor, "n P"]) -> torch.Tensor:
    """``x [n, T, ...]`` -> ``[n, P, ...]`` at the aligned columns."""
    rows = torch.arange(x.shape[0], device=x.device)[:, None]
    return x[rows, cols.to(x.device)]


__all__ = ["PromptPairs", "make_pairs", "encode_prompts", "inputs", "last_logits", "run_with_capture",
           "gather_aligned", "check_pairs", "check_run", "column", "lengths", "RUNS", "Prompts"]
