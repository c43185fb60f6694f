"""Metrics on logits, one definition each: refusal score, KL, cross-entropy, logit difference, token log-prob.

Every function is per row (``[..., vocab]`` in, ``[...]`` out) and differentiable, so patching metrics,
attribution and the refusal pipeline all reduce these the way they need (``.mean()`` over prompts).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int


def _ids(ids: int | Sequence[int] | torch.Tensor, n: int, name: str, device: torch.device) -> torch.Tensor:
    t = torch.as_tensor(ids, dtype=torch.long)
    if t.dim() == 0:
        t = t.expand(n)
    if t.dim() != 1 or t.shape[0] != n:
        raise ValueError(f"{name} must be one token id or one per row ({n}), got shape {tuple(t.shape)}")
    return t.to(device)


def refusal_score(logits: Float[torch.Tensor, "... vocab"],
                  tokens: Sequence[int] | torch.Tensor) -> Float[torch.Tensor, "..."]:
    """Log-odds that the next token is a refusal token: ``log p(R) - log(1 - p(R))``, ``p(R)`` summed over
    ``tokens``. Both terms are log-sum-exps over disjoint parts of the vocabulary, so no clamp is needed."""
    ids = torch.as_tensor(list(tokens) if not isinstance(tokens, torch.Tensor) else tokens, dtype=torch.long)
    if ids.numel() == 0:
        raise ValueError("refusal_score needs at least one refusal token id (see patching.measures.refusal_token_ids)")
    lp = F.log_softmax(logits.float(), dim=-1)
    ids = ids.to(lp.device)
    inside = torch.zeros(lp.shape[-1], dtype=torch.bool, device=lp.device)
    inside[ids] = True
    neg = torch.finfo(lp.dtype).min
    lp_in = torch.logsumexp(lp.masked_fill(~inside, neg), dim=-1)
    lp_out = torch.logsumexp(lp.masked_fill(inside, neg), dim=-1)
    return lp_in - lp_out


def kl_div(p_logits: Float[torch.Tensor, "... vocab"], q_logits: Float[torch.Tensor, "... vocab"]
           ) -> Float[torch.Tensor, "..."]:
    """``KL(P || Q)`` of the next-token distributions given by two sets of logits, per row (0 when equal)."""
    if p_logits.shape != q_logits.shape:
        raise ValueError(f"KL needs logits of one shape: reference {tuple(p_logits.shape)} vs "
                         f"{tuple(q_logits.shape)}; take both from the same prompts")
    lp = F.log_softmax(p_logits.float(), -1)
    lq = F.log_softmax(q_logits.float(), -1).to(lp.device)
    return (lp.exp() * (lp - lq)).sum(-1)


def cross_entropy(logits: Float[torch.Tensor, "b t vocab"], input_ids: Int[torch.Tensor, "b t"],
                  mask: torch.Tensor | None = None) -> tuple[float, int]:
    """Summed next-token cross-entropy of ``input_ids`` and the number of predictions counted.

    ``mask [b, t]`` marks the tokens to predict (e.g. the response tokens); position ``t`` is predicted from
    ``t - 1`` and only targets whose mask is set count. With left padding, pass a mask that leaves out each
    row's first real token too (it would be predicted from padding); ``None`` counts every target.
    """
    target_ok = torch.ones_like(input_ids[:, 1:], dtype=torch.bool) if mask is None else mask[:, 1:].bool()
    lp = F.log_softmax(logits[:, :-1].float(), -1)
    nll = -lp.gather(-1, input_ids[:, 1:, None].to(lp.device)).squeeze(-1)
    keep = target_ok.to(nll.device)
    return float(nll[keep].double().sum()), int(keep.sum())  # summed in float64: long texts lose no precision


def logit_diff(logits: Float[torch.Tensor, "n vocab"], correct: int | Sequence[int] | torch.Tensor,
               wrong: int | Sequence[int] | torch.Tensor) -> Float[torch.Tensor, " n"]:
    """``logit[correct] - logit[wrong]`` per row (one id for all rows or one per row)."""
    n = logits.shape[0]
    rows = torch.arange(n, device=logits.device)
    c, w = _ids(correct, n, "correct", logits.device), _ids(wrong, n, "wrong", logits.device)
    return (logits[rows, c] - logits[rows, w]).float()


def token_logprob(logits: Float[torch.Tensor, "n vocab"], token_ids: int | Sequence[int] | torch.Tensor
                  ) -> Float[torch.Tensor, " n"]:
    """Log-probability of ``token_ids`` per row (one id for all rows or one per row)."""
    n = logits.shape[0]
    lp = F.log_softmax(logits.float(), -1)
    return lp[torch.arange(n, device=lp.device), _ids(token_ids, n, "token_ids", lp.device)]


__all__ = ["cross_entropy", "kl_div", "logit_diff", "refusal_score", "token_logprob"]
