"""Metrics for patching: callables ``metric(logits [n_prompts, vocab]) -> scalar`` read at the last prompt token.

Every patching function calls the metric on the last-position logits of one prompt set (rows in the order of
the prompts), so per-prompt data (answer tokens, reference logits) can be closed over. The metric must return
one number (reduce over prompts with ``.mean()``); it must use torch ops to work with attribution patching.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float, Int

Metric = Callable[[torch.Tensor], "torch.Tensor | float"]

DEFAULT_REFUSAL_STARTS: tuple[str, ...] = (
    "I'm sorry", "I am sorry", "I cannot", "I can't", "I apologize", "I won't", "I will not", "Sorry",
    "As an AI", "I must decline", "I'm unable", "I am unable",
)


def call_metric(metric: Metric, logits: Float[torch.Tensor, "n vocab"]) -> torch.Tensor:
    """Call ``metric`` and check it returned one number; returns a 0-d float tensor (graph kept)."""
    if not callable(metric):
        raise TypeError(f"metric must be a callable taking logits [n_prompts, vocab], got {type(metric).__name__}")
    out = metric(logits)
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        return torch.tensor(float(out))
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"metric returned {type(out).__name__}; return a scalar tensor (e.g. `.mean()` over prompts)")
    if out.numel() != 1:
        raise ValueError(f"metric returned a tensor of shape {tuple(out.shape)}; a patching metric must return one "
                         f"number: reduce over prompts, e.g. `return per_prompt.mean()`")
    return out.reshape(()).float()


def _ids(ids: int | Sequence[int] | torch.Tensor, n: int, name: str) -> torch.Tensor:
    t = torch.as_tensor(ids, dtype=torch.long)
    if t.dim() == 0:
        t = t.expand(n)
    if t.dim() != 1 or t.shape[0] != n:
        raise ValueError(f"{name} must be one token id or one per prompt ({n}), got shape {tuple(t.shape)}")
    return t


def logit_diff(correct: int | Sequence[int] | Int[torch.Tensor, "n"],  # noqa: F821
               wrong: int | Sequence[int] | Int[torch.Tensor, "n"]) -> Metric:  # noqa: F821
    """Mean over prompts of ``logit[correct] - logit[wrong]`` (one id for all prompts or one per prompt)."""

    def metric(logits: torch.Tensor) -> torch.Tensor:
        n = logits.shape[0]
        c, w = _ids(correct, n, "correct").to(logits.device), _ids(wrong, n, "wrong").to(logits.device)
        rows = torch.arange(n, device=logits.device)
        return (logits[rows, c] - logits[rows, w]).float().mean()

    metric.__name__ = "logit_diff"
    return metric


def kl_div(reference: Float[torch.Tensor, "n vocab"]) -> Metric:
    """Mean over prompts of ``KL(reference || patched)`` of the next-token distributions (0 when unchanged)."""
    ref = torch.log_softmax(reference.detach().float(), -1)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        if logits.shape != ref.shape:
            raise ValueError(f"kl_div: reference logits have shape {tuple(ref.shape)} but the run gave "
                             f"{tuple(logits.shape)}; take the reference from the same prompts")
        lp = torch.log_softmax(logits.float(), -1)
        r = ref.to(lp.device)
        return (r.exp() * (r - lp)).sum(-1).mean()

    metric.__name__ = "kl_div"
    return metric


def refusal_token_ids(tokenizer, starts: Sequence[str] = DEFAULT_REFUSAL_STARTS) -> list[int]:
    """First token ids of typical refusal openings (with and without a leading space), deduplicated."""
    ids: list[int] = []
    unk = getattr(tokenizer, "unk_token_id", None)
    for s in starts:
        for text in (s, " " + s, s.lower()):
            toks = tokenizer(text, add_special_tokens=False)["input_ids"]
            if toks and toks[0] != unk and toks[0] not in ids:
                ids.append(int(toks[0]))
    if not ids:
        raise ValueError("no refusal opening could be tokenised; pass token ids to refusal_score directly")
    return ids


def refusal_score(token_ids: Sequence[int] | torch.Tensor) -> Metric:
    """Mean over prompts of the log-odds that the answer opens with a refusal token: ``log p / (1 - p)``."""
    ids = torch.as_tensor(list(token_ids) if not isinstance(token_ids, torch.Tensor) else token_ids, dtype=torch.long)
    if ids.numel() == 0:
        raise ValueError("refusal_score needs at least one token id; see refusal_token_ids(tokenizer)")

    def metric(logits: torch.Tensor) -> torch.Tensor:
        lp = torch.log_softmax(logits.float(), -1)
        inside = torch.logsumexp(lp[:, ids.to(lp.device)], -1)
        outside = torch.log1p(-inside.exp().clamp(max=1 - 1e-6))
        return (inside - outside).mean()

    metric.__name__ = "refusal_score"
    return metric


def token_logprob(token_ids: int | Sequence[int] | Int[torch.Tensor, "n"]) -> Metric:  # noqa: F821
    """Mean over prompts of the log-probability of ``token_ids`` (one id for all prompts or one per prompt)."""

    def metric(logits: torch.Tensor) -> torch.Tensor:
        n = logits.shape[0]
        t = _ids(token_ids, n, "token_ids").to(logits.device)
        lp = torch.log_softmax(logits.float(), -1)
        return lp[torch.arange(n, device=lp.device), t].mean()

    metric.__name__ = "token_logprob"
    return metric


def metric_name(metric: Metric) -> str:
    return getattr(metric, "__name__", type(metric).__name__)


__all__ = ["Metric", "call_metric", "logit_diff", "kl_div", "refusal_token_ids", "refusal_score", "token_logprob",
           "metric_name", "DEFAULT_REFUSAL_STARTS"]
