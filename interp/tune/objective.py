"""Training objectives: what one step's loss is, given the model and the indices of the batch's examples.

The loop (:mod:`tune.loop`) knows only this protocol, so a preference objective (DPO / ORPO: pairs of chosen and
rejected responses, the reference being the same model with ``disable_adapter()``) plugs in beside
:class:`SFT` without touching the loop, its checkpoints or its resumption.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from interp.chat import collate
from interp.forward import pad_id
from interp.models import Model
from interp.tune.data import Row, fingerprint, targets


class Objective(Protocol):
    """``n`` examples; ``loss(model, idx)`` -> (scalar loss with its graph, tokens processed) for the examples
    ``idx``; ``fingerprint()`` names the data (a resumed run refuses other data)."""

    n: int

    def loss(self, model: Model, idx: Sequence[int]) -> tuple[torch.Tensor, int]: ...

    def fingerprint(self) -> str: ...


def _keeps_logits(hf: torch.nn.Module) -> bool:
    inner = hf.get_base_model() if hasattr(hf, "get_base_model") else hf
    return "logits_to_keep" in inspect.signature(inner.forward).parameters


def kept_logits(model: Model, rows: Sequence[Row]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One left-padded batch of ``rows`` (:func:`interp.chat.collate`, ``position_ids`` from the attention mask, so
    padding changes no real token): the logits that predict each kept response token ``[N, vocab]``, those tokens
    ``[N]`` and the row each came from ``[N]`` (row-major order).

    Only the columns that predict a kept token are unembedded (``logits_to_keep``): the vocabulary head is most of
    the cost otherwise."""
    batch = collate([r.enc for r in rows], pad_id(model.tokenizer)).to(model.device)
    T = batch.input_ids.shape[1]
    tgt = targets(rows, T).to(model.device)
    pred = torch.zeros_like(tgt)
    pred[:, :-1] = tgt[:, 1:]  # position t predicts token t + 1
    cols = pred.any(0).nonzero()[:, 0]
    kw = {"logits_to_keep": cols} if _keeps_logits(model.hf) else {}
    logits = model.hf(**batch.model_inputs, use_cache=False, **kw).logits
    if not kw:
        logits = logits[:, cols]
    sel = pred[:, cols]
    return logits[sel], batch.input_ids[:, cols + 1][sel], sel.nonzero()[:, 0]


def response_nll(model: Model, rows: Sequence[Row]) -> torch.Tensor:
    """Mean next-token cross-entropy over the rows' kept response tokens (:func:`kept_logits`)."""
    logits, labels, _ = kept_logits(model, rows)
    return torch.nn.functional.cross_entropy(logits.float(), labels)


def response_logps(model: Model, rows: Sequence[Row]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the summed log-probability of its kept response tokens ``[B]`` (graph kept) and how many there
    are ``[B]``: the sequence log-likelihoods a preference loss compares."""
    logits, labels, row = kept_logits(model, rows)
    lp = torch.log_softmax(logits.float(), -1).gather(-1, labels[:, None])[:, 0]
    sums = torch.zeros(len(rows), device=lp.device, dtype=lp.dtype).index_add(0, row, lp)
    return sums, torch.bincount(row, minlength=len(rows)).to(lp.dtype)


@dataclass
class SFT:
    """Supervised fine-tuning on response tokens only (prompt, padding and masked-out tokens carry no loss)."""

    rows: list[Row]

    @property
    def n(self) -> int:
        return len(self.rows)

    def loss(self, model: Model, idx: Sequence[int]) -> tuple[torch.Tensor, int]:
        rows = [self.rows[i] for i in idx]
        return response_nll(model, rows), sum(len(r.enc.ids) for r in rows)

    def fingerprint(self) -> str:
        return fingerprint(self.rows)


__all__ = ["Objective", "SFT", "kept_logits", "response_logps", "response_nll"]
