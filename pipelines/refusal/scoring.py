"""Refusal tokens, the refusal score, and candidate scoring batched across candidates.

The refusal score of a prompt is the log-odds that the first response token is a refusal token:
``log p(R) - log(1 - p(R))`` with ``p(R)`` the total probability of the refusal tokens at the last prompt
position. Candidates are scored many at a time: the prompts are repeated once per candidate along the
batch, and each row's hooks use that row's own direction, so one forward pass scores a whole chunk.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from interp.chat import Batch, collate
from interp.forward import batches, prepare
from interp.hooks import HookContext, hooks
from interp.models import Model


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


def refusal_score(logits: torch.Tensor, tokens: Sequence[int]) -> torch.Tensor:
    """Log-odds of the refusal tokens from last-position logits ``[..., vocab]``."""
    logp = F.log_softmax(logits.float(), dim=-1)
    lp = torch.logsumexp(logp[..., list(tokens)], dim=-1)
    return lp - torch.log1p(-lp.exp().clamp(max=1 - 1e-7))


def kl_last(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(P || Q) of next-token distributions, per row."""
    lp, lq = F.log_softmax(p_logits.float(), -1), F.log_softmax(q_logits.float(), -1)
    return (lp.exp() * (lp - lq)).sum(-1)


def encode_prompts(model: Model, prompts: Sequence[str]) -> list:
    return prepare(model, list(prompts))[1]


def _repeat(batch: Batch, times: int) -> Batch:
    return Batch(*(t.repeat(times, *([1] * (t.dim() - 1))) for t in
                   (batch.input_ids, batch.attention_mask, batch.position_ids, batch.post_mask, batch.response_mask)))


def last_logits(model: Model, batch: Batch, fns: list | None = None) -> torch.Tensor:
    """Logits at the last position ``[B, vocab]`` (only the last position is unembedded)."""
    dev = model.device
    inputs = {k: v.to(dev) for k, v in batch.model_inputs.items()}
    with torch.inference_mode(), hooks(model, fns or []):
        return model.hf(**inputs, use_cache=False, logits_to_keep=1).logits[:, -1].float().cpu()


@dataclass
class RowEdits:
    """Per-row edits for one forward pass over ``rows`` = candidates x prompts."""

    ablate: torch.Tensor | None = None      # [rows, d] unit directions projected out everywhere
    add: torch.Tensor | None = None         # [rows, d] vectors added at resid_pre of ``add_layer``
    add_layer: torch.Tensor | None = None   # [rows] layer index per row

    def fns(self, model: Model) -> list:
        out = []
        if self.ablate is not None:
            r = self.ablate.to(model.device, model.dtype)

            def ablate(x: torch.Tensor, ctx: HookContext) -> torch.Tensor:
                proj = torch.einsum("btd,bd->bt", x, r)
                return x - proj[..., None] * r[:, None, :]

            for layer in range(model.n_layers):
                for kind in ("resid_pre", "attn_out", "mlp_out"):
                    out.append((f"{kind}.{layer}", ablate))
        if self.add is not None:
            v = self.add.to(model.device, model.dtype)
            rows_layer = self.add_layer.to(model.device)
            for layer in sorted(set(self.add_layer.tolist())):
                sel = (rows_layer == layer).to(model.dtype)[:, None, None]

                def add(x: torch.Tensor, ctx: HookContext, sel: torch.Tensor = sel) -> torch.Tensor:
                    return x + sel * v[:, None, :]

                out.append((f"resid_pre.{layer}", add))
        return out


def score_rows(model: Model, encs: list, per_candidate: torch.Tensor, mode: str, layers: torch.Tensor | None = None,
               max_rows: int = 256) -> torch.Tensor:
    """Last-position logits for every (candidate, prompt): ``[C, N, vocab]``.

    ``mode='ablate'``: ``per_candidate [C, d]`` unit directions projected out at every layer;
    ``mode='add'``: vectors added at resid_pre of ``layers[c]``. Candidates are chunked so a forward holds at
    most ``max_rows`` rows.
    """
    C, N = per_candidate.shape[0], len(encs)
    pad = model.tokenizer.pad_token_id or 0
    batch = collate(encs, pad)
    chunk = max(1, max_rows // N)
    outs = []
    for c0 in range(0, C, chunk):
        c1 = min(C, c0 + chunk)
        k = c1 - c0
        rows = per_candidate[c0:c1].repeat_interleave(N, 0)
        if mode == "ablate":
            edits = RowEdits(ablate=rows)
        elif mode == "add":
            edits = RowEdits(add=rows, add_layer=layers[c0:c1].repeat_interleave(N, 0))
        else:
            raise ValueError(f"unknown mode {mode!r}")
        logits = last_logits(model, _repeat(batch, k), edits.fns(model))
        outs.append(logits.view(k, N, -1))
    return torch.cat(outs)


def baseline_logits(model: Model, encs: list, batch_size: int = 64) -> torch.Tensor:
    return torch.cat([last_logits(model, b) for b in batches(model, encs, batch_size)])
