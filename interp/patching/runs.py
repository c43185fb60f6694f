"""Prompt sets as left-padded batches, paired runs with an explicit position alignment, and capturing forwards.

A :class:`PromptPairs` holds a clean and a corrupted batch (one row per pair) and an alignment: ``P`` aligned
positions, with the padded column of each aligned position in each run (``cols[run]`` is ``[n_pairs, P]``).
Patching moves activations between the two runs along this alignment only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Int

from interp.chat import Batch
from interp.forward import Inputs, batch_of, last_logits
from interp.hooking import HookContext, module_hooks
from interp.models import Model
from interp.positions import columns
from interp.sites import Site
from interp.values import Prompts as PromptValues
from interp.values import Runtime, moved_keywords

RUNS = ("clean", "corrupted")
Prompts = PromptValues | Inputs | Batch
MOVED = {"source": "runs=(source, target)", "target": "runs=(source, target)",
         "batch_size": "runtime=interp.Runtime(batch_size=...)", "progress": "runtime=interp.Runtime(progress=...)",
         "seed": "runtime=interp.Runtime(seed=...)", "chat": "prompts=interp.Prompts(texts, chat=...)"}
"""Keywords the patching functions took before issue 37, and where each went."""
CHAT_MOVED = {"chat": MOVED["chat"]}


def lengths(batch: Batch) -> torch.Tensor:
    return batch.attention_mask.sum(1).long()


def aligned_columns(batch: Batch, positions: Int[torch.Tensor, "n P"], what: str) -> Int[torch.Tensor, "n P"]:
    """Padded columns of per-row prompt positions (the core rule, :func:`interp.positions.columns`)."""
    T = batch.input_ids.shape[1]
    try:
        return columns(positions, T - lengths(batch), torch.full_like(lengths(batch), T), what)
    except ValueError as e:
        raise ValueError(f"{e}; fix the alignment") from None


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


def check_runs(runs: Sequence[str]) -> tuple[str, str]:
    """``runs = (source, target)``: activations are taken from the source run and patched into the target run
    (``("clean", "corrupted")``: denoising; ``("corrupted", "clean")``: noising)."""
    if isinstance(runs, str) or len(runs) != 2 or any(r not in RUNS for r in runs):
        raise ValueError(f"runs=(source, target): each run must be one of {RUNS}, e.g. ('clean', 'corrupted'); "
                         f"got {runs!r}")
    return runs[0], runs[1]


def patch_runtime(runtime: Runtime | None, progress: bool = True) -> Runtime:
    """``runtime``, by default 64 rows per forward (variants x pairs) and a bar when ``progress``."""
    return runtime if runtime is not None else Runtime(batch_size=64, progress=progress)


@moved_keywords({"chat": "clean=interp.Prompts(texts, chat=...) and corrupted=interp.Prompts(texts, chat=...)"})
def make_pairs(model: Model, clean: Prompts, corrupted: Prompts, align: Any = "end") -> PromptPairs:
    """Pair clean and corrupted prompts and align their positions.

    ``align``: ``"end"`` (default; the last ``P`` tokens, ``P`` the shortest prompt: chat suffixes line up),
    ``"same"`` (token for token: each pair must have one token count, so every position of a pair lines up),
    ``"start"``, a list of ``(clean_pos, corrupted_pos)`` shared by all pairs, or one such list per pair.
    Positions count from the first real token (>= 0) or from the end (< 0).
    """
    cb, rb = batch_of(model, clean), batch_of(model, corrupted)
    n = cb.input_ids.shape[0]
    if rb.input_ids.shape[0] != n:
        raise ValueError(f"{n} clean prompts but {rb.input_ids.shape[0]} corrupted prompts; they must be paired 1:1")
    lc, lr = lengths(cb), lengths(rb)
    if isinstance(align, str):
        P = int(torch.minimum(lc, lr).min())
        if align == "same":
            check_same_length(lc, lr)
        if align in ("end", "same"):
            per_pair = [[(p - P, p - P) for p in range(P)]] * n
            labels = [f"{p - P}" for p in range(P)]
        elif align == "start":
            per_pair = [[(p, p) for p in range(P)]] * n
            labels = [f"{p}" for p in range(P)]
        else:
            raise ValueError(f"align must be 'end', 'same', 'start' or a list of (clean_pos, corrupted_pos) pairs, got "
                             f"{align!r}")
    else:
        per_pair = _explicit(align, n)
        labels = [f"{c}/{r}" if c != r else f"{c}" for c, r in per_pair[0]]
    pos = torch.tensor(per_pair, dtype=torch.long)  # [n, P, 2]: (clean, corrupted) positions
    cc, rc = aligned_columns(cb, pos[..., 0], "clean prompt"), aligned_columns(rb, pos[..., 1], "corrupted prompt")
    tok = model.tokenizer
    if tok is not None:
        labels = [f"{lab} {tok.decode([int(cb.input_ids[0, c])])!r}"[:24] for lab, c in zip(labels, cc[0].tolist(), strict=True)]
    return PromptPairs(clean=cb, corrupted=rb, cols={"clean": cc, "corrupted": rc}, labels=labels)


def check_same_length(lc: torch.Tensor, lr: torch.Tensor) -> None:
    """Refuse pairs whose clean and corrupted prompts differ in token count (``align='same'``)."""
    bad = (lc != lr).nonzero().flatten().tolist()
    if bad:
        i = bad[0]
        raise ValueError(f"align='same' patches token for token, so each pair needs one token count; pair {i} has "
                         f"{int(lc[i])} clean and {int(lr[i])} corrupted tokens ({len(bad)} pairs differ): write the "
                         f"two prompts to the same token count, or align their last tokens (align='end') or explicit "
                         f"(clean_pos, corrupted_pos) pairs")


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

    def grad_entry(mod: Any, args: Any, out: torch.Tensor) -> torch.Tensor:
        return out if out.requires_grad else out.detach().requires_grad_(True)

    entry = [(model.module(model.spec.embed), "post", grad_entry)] if grad else []
    # no_grad rather than inference mode without grad: callers compute with these activations under autograd
    with torch.set_grad_enabled(grad), module_hooks(entry):
        logits = last_logits(model, batch, [(s, make(s)) for s in sites], grad=True)
    return got, logits


def gather_aligned(x: torch.Tensor, cols: Int[torch.Tensor, "n P"]) -> torch.Tensor:
    """``x [n, T, ...]`` -> ``[n, P, ...]`` at the aligned columns."""
    rows = torch.arange(x.shape[0], device=x.device)[:, None]
    return x[rows, cols.to(x.device)]


__all__ = ["PromptPairs", "make_pairs", "run_with_capture", "gather_aligned", "check_pairs", "check_run",
           "aligned_columns", "lengths", "RUNS", "Prompts"]
