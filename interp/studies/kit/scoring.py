"""Refusal tokens, and last-position logits for many candidates at once.

Candidates are scored many at a time: the prompts are stacked once per candidate along the batch and a
:class:`steering.RowEdits` gives each row its own direction, so one forward pass scores a chunk of
candidates. Every forward goes through :mod:`interp.forward`; the score itself is :func:`evals.refusal_score`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Float, Int

import steering
from interp.chat import Encoded
from interp.forward import batches, last_logits, resid_pre_cache, untouched_prefix
from interp.models import Model
from interp.studies.kit.config import ABLATE_POSITIONS


def check_ablate_positions(positions: str) -> str:
    """``positions`` if it is one of :data:`ABLATE_POSITIONS`, else a ValueError naming them."""
    if positions not in ABLATE_POSITIONS:
        raise ValueError(f"ablate_positions must be one of {ABLATE_POSITIONS}, got {positions!r}")
    return positions


def ablation(r: torch.Tensor, positions: str = "all", sites: Any = None, layers: Any = "all") -> Any:
    """The pipeline's ablation of unit ``r``: :class:`steering.DirectionalAblation` (every writer, or ``sites``),
    at every token or only at the post-instruction tokens of the prompt (generated tokens always)."""
    kw: dict[str, Any] = {"layers": layers, "positions": check_ablate_positions(positions)}
    if sites is not None:
        kw["sites"] = sites
    return steering.DirectionalAblation(r, **kw)


def refusal_tokens(first_ids_refused: Sequence[int], first_ids_helpful: Sequence[int], cover: float = 0.9,
                   max_tokens: int = 8) -> list[int]:
    """First tokens of the model's own refusals, most common first, until they cover ``cover`` of them.

    Tokens that start helpful answers at least as often as refusals are left out.
    """
    if not first_ids_refused:
        return []
    ref, helpful = Counter(first_ids_refused), Counter(first_ids_helpful)
    n_ref, n_help = len(first_ids_refused), max(len(first_ids_helpful), 1)
    out, covered = [], 0
    for tok, c in ref.most_common():
        if helpful[tok] / n_help >= c / n_ref:
            continue
        out.append(int(tok))
        covered += c
        if covered >= cover * n_ref or len(out) >= max_tokens:
            break
    return out


def prompt_logits(model: Model, encs: Sequence[Encoded], *interventions: Any, batch_size: int = 64,
                  prefixes: Sequence[tuple[Any, int]] | None = None) -> Float[torch.Tensor, "n vocab"]:
    """Next-token logits at each prompt's last token, with ``interventions`` attached (none: plain), on CPU.
    ``prefixes``: per batch of ``batch_size``, the plain keys and values of its first columns and how many
    (:func:`steering.prefill.prompt_prefixes`, e.g. a generation session's): only the later columns are computed,
    for interventions that leave the earlier ones as they are (the caller checks, e.g. with
    :func:`steering.prefill.leaves_prompt_prefix`)."""
    bs = batches(model, encs, batch_size)
    if prefixes is not None and len(prefixes) != len(bs):
        raise ValueError(f"prefixes holds {len(prefixes)} batches but the prompts make {len(bs)} of {batch_size}")
    reuse = [{"prefix": kv, "start": start} if kv is not None and start > 0 else {}
             for kv, start in (prefixes if prefixes is not None else [(None, 0)] * len(bs))]
    if not interventions:
        return torch.cat([last_logits(model, b, **r).cpu() for b, r in zip(bs, reuse)])
    out = []
    with steering.apply(model, *interventions) as handle:
        for b, r in zip(bs, reuse):
            handle.set_batch(b, cached=r.get("start", 0))  # an edit at positions="post_instruction" knows the tokens
            out.append(last_logits(model, b, **r).cpu())
    return torch.cat(out)


def score_rows(model: Model, encs: Sequence[Encoded], per_candidate: Float[torch.Tensor, "c d"], mode: str,
               layers: Int[torch.Tensor, " c"] | None = None, max_rows: int = 256,
               reduce: Callable[[torch.Tensor], torch.Tensor] | None = None, reuse_prefix: bool = True,
               positions: str = "all") -> torch.Tensor:
    """Last-position logits for every (candidate, prompt): ``[C, N, vocab]``, or ``reduce`` of them per chunk
    (``[c, N, vocab] -> [c, N]``, e.g. a refusal score: the vocabulary-wide logits are never all held).

    ``mode='ablate'``: ``per_candidate`` unit directions projected out at every layer; ``mode='add'``:
    vectors added at resid_pre of ``layers[c]``, candidates taken in layer order and each chunk resumed from
    its lowest layer's cached resid_pre (``reuse_prefix``: the blocks below are not recomputed, exact). A
    forward holds at most ``max_rows`` rows. ``positions`` (ablation only): ``"all"`` tokens, or only the
    ``"post_instruction"`` ones (see :data:`ABLATE_POSITIONS`); then, with ``reuse_prefix``, the columns before the
    first post-instruction token are computed once, plainly, and reused by every chunk (:func:`untouched_prefix`).
    """
    if mode not in ("ablate", "add"):
        raise ValueError(f"mode must be 'ablate' or 'add', got {mode!r}")
    check_ablate_positions(positions)
    if mode == "add" and layers is None:
        raise ValueError("mode='add' needs layers=[C], the layer each candidate is added at")
    n_cand, n = per_candidate.shape[0], len(encs)
    (batch,) = batches(model, encs, n)
    chunk = max(1, max_rows // n)
    order = torch.arange(n_cand) if layers is None else torch.argsort(layers, stable=True)
    resid = resid_pre_cache(model, batch, [x for x in layers.tolist() if x > 0]) if (
        mode == "add" and reuse_prefix and layers is not None) else {}
    prefix, start = untouched_prefix(model, batch) if (
        mode == "ablate" and positions == "post_instruction" and reuse_prefix) else (None, 0)
    outs: list[tuple[torch.Tensor, torch.Tensor]] = []
    for c0 in range(0, n_cand, chunk):
        sel = order[c0:c0 + chunk]
        rows = per_candidate[sel].repeat_interleave(n, 0)
        kw: dict[str, Any] = {}
        if mode == "ablate":
            mask = None if positions == "all" else batch.post_mask[:, start:].repeat(len(sel), 1)
            edits = steering.RowEdits(ablate=rows, ablate_mask=mask)
            if prefix is not None:  # the columns before the first post-instruction token are not recomputed
                kw = {"prefix": [(K.repeat(len(sel), 1, 1, 1), V.repeat(len(sel), 1, 1, 1)) for K, V in prefix],
                      "start": start}
        else:
            assert layers is not None
            edits = steering.RowEdits(add=rows, add_layer=layers[sel].repeat_interleave(n, 0))
            low = int(layers[sel].min())
            kw = {"from_layer": low, "resid": resid[low]} if low in resid else {}
        with steering.apply(model, edits):
            logits = last_logits(model, batch, repeat=len(sel), **kw).cpu().view(len(sel), n, -1)
        outs.append((sel, logits if reduce is None else reduce(logits)))
    first = outs[0][1]
    out = first.new_empty((n_cand, *first.shape[1:]))
    for sel, part in outs:
        out[sel] = part
    return out


__all__ = ["ablation", "check_ablate_positions", "prompt_logits", "refusal_tokens", "score_rows"]
