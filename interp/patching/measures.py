"""Metrics for patching: callables ``metric(logits [n_prompts, vocab]) -> scalar`` read at the last prompt token.

Every patching function calls the metric on the last-position logits of one prompt set (rows in the order of
the prompts), so per-prompt data (answer tokens, reference logits) can be closed over. The metric must return
one number (reduce over prompts with ``.mean()``); it must use torch ops to work with attribution patching.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Float, Int

from interp import evals
from interp.evals.judge import refusal_openings

Metric = Callable[[torch.Tensor], "torch.Tensor | float"]


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


def _mean_over_prompts(name: str, doc: str, bind: Callable[..., Callable[[torch.Tensor], torch.Tensor]]
                       ) -> Callable[..., Metric]:
    """A metric factory from an ``evals.logits`` function: ``factory(*args)`` closes over the per-prompt
    arguments (``bind(*args)`` -> a per-row function of the logits) and returns ``logits -> per_row.mean()``."""

    def factory(*args: Any, **kwargs: Any) -> Metric:
        per_row = bind(*args, **kwargs)

        def metric(logits: torch.Tensor) -> torch.Tensor:
            return per_row(logits).mean()

        metric.__name__ = name
        return metric

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = doc
    factory.__signature__ = inspect.signature(bind).replace(return_annotation=Metric)  # type: ignore[attr-defined]
    return factory


def _bind_logit_diff(correct: int | Sequence[int] | Int[torch.Tensor, "n"],  # noqa: F821
                     wrong: int | Sequence[int] | Int[torch.Tensor, "n"]) -> Callable:  # noqa: F821
    return lambda logits: evals.logit_diff(logits, correct, wrong)


def _bind_kl_div(reference: Float[torch.Tensor, "n vocab"]) -> Callable:
    ref = reference.detach().float()

    def per_row(logits: torch.Tensor) -> torch.Tensor:
        if logits.shape != ref.shape:
            raise ValueError(f"kl_div: reference logits have shape {tuple(ref.shape)} but the run gave "
                             f"{tuple(logits.shape)}; take the reference from the same prompts")
        return evals.kl_div(ref.to(logits.device), logits)

    return per_row


def _bind_refusal_score(token_ids: Sequence[int] | torch.Tensor) -> Callable:
    ids = torch.as_tensor(list(token_ids) if not isinstance(token_ids, torch.Tensor) else token_ids, dtype=torch.long)
    if ids.numel() == 0:
        raise ValueError("refusal_score needs at least one token id; see refusal_token_ids(tokenizer)")
    return lambda logits: evals.refusal_score(logits, ids)


def _bind_token_logprob(token_ids: int | Sequence[int] | Int[torch.Tensor, "n"]) -> Callable:  # noqa: F821
    return lambda logits: evals.token_logprob(logits, token_ids)


logit_diff = _mean_over_prompts(
    "logit_diff", "Mean over prompts of ``logit[correct] - logit[wrong]`` (one id for all prompts or one per "
    "prompt); ``evals.logit_diff`` reduced by mean.", _bind_logit_diff)
kl_div = _mean_over_prompts(
    "kl_div", "Mean over prompts of ``KL(reference || patched)`` of the next-token distributions (0 when "
    "unchanged); ``evals.kl_div`` reduced by mean.", _bind_kl_div)
refusal_score = _mean_over_prompts(
    "refusal_score", "Mean over prompts of the log-odds that the answer opens with a refusal token "
    "(``log p / (1 - p)``); ``evals.refusal_score`` reduced by mean.", _bind_refusal_score)
token_logprob = _mean_over_prompts(
    "token_logprob", "Mean over prompts of the log-probability of ``token_ids`` (one id for all prompts or one "
    "per prompt); ``evals.token_logprob`` reduced by mean.", _bind_token_logprob)


def refusal_token_ids(tokenizer: Any, starts: Sequence[str] | None = None) -> list[int]:
    """First token ids of refusal openings (with and without a leading space, and lower-cased), deduplicated.

    ``starts`` defaults to ``evals.judge.refusal_openings()``: the judge's phrases that can open an answer."""
    ids: list[int] = []
    unk = getattr(tokenizer, "unk_token_id", None)
    for s in refusal_openings() if starts is None else starts:
        for text in (s, " " + s, s.lower()):
            toks = tokenizer(text, add_special_tokens=False)["input_ids"]
            if toks and toks[0] != unk and toks[0] not in ids:
                ids.append(int(toks[0]))
    if not ids:
        raise ValueError("no refusal opening could be tokenised; pass token ids to refusal_score directly")
    return ids


def metric_name(metric: Metric) -> str:
    """The metric's ``__name__`` (for tables and plots), or its type's name."""
    return getattr(metric, "__name__", type(metric).__name__)


__all__ = ["Metric", "call_metric", "logit_diff", "kl_div", "refusal_token_ids", "refusal_score", "token_logprob",
           "metric_name"]
