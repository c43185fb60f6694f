"""What the fine-tune studies share: a fresh fine-tune that leaves its starting model as it was, the base model's
greedy answers, and refusal verdicts by generation.

A LoRA fine-tune (:func:`tune.fine_tune`) injects its adapter into the starting model's modules; :func:`fresh_tune`
takes it out again (peft ``unload``) on exit, so one model in memory serves many fresh fine-tunes. A full
fine-tune changes its model in place, so it trains a deep copy.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch

import steering
from interp.evals.judge import Judge
from interp.evals.rates import Rate
from interp.models import Model
from interp.tune import TuneConfig, fine_tune
from interp.tune.loop import Callback, TuneResult
from interp.values import Prompts, Runtime

Pairs = tuple[list[str], list[str]]  # prompts, responses


def is_peft(model: Model) -> bool:
    return hasattr(model.hf, "disable_adapter") and hasattr(model.hf, "get_base_model")


def refuse_shared_adapter(base: Model, other: Any, what: str) -> None:
    """Refuse a peft model whose adapter sits in ``base``'s own modules: a fine-tune "from the base" would then
    start from the adapted model."""
    if isinstance(other, Model) and is_peft(other) and other.hf.get_base_model() is base.hf:
        raise ValueError(f"the {what} model is a peft adapter injected into this base's own modules, so a fresh "
                         f"fine-tune from the base would carry it; pass the adapter folder, or load the {what} "
                         f"model separately (interp.models.with_adapter(load_model(...), folder, merge=True))")


@contextmanager
def fresh_tune(model: Model, prompts: Sequence[str], responses: Sequence[str], config: TuneConfig,
               mask_out: Sequence[Any] | None = None, callback: Callback | None = None, chat: bool = True,
               system: str | None = None) -> Iterator[TuneResult]:
    """``tune.fine_tune`` from ``model`` (LoRA: ``model`` itself, the adapter unloaded on exit; full: a deep copy),
    yielding its :class:`~tune.loop.TuneResult`; ``model`` is as it was after the block."""
    if is_peft(model):
        raise ValueError("a fresh fine-tune needs a plain model, not a peft-wrapped one; merge its adapter first "
                         "(interp.models.with_adapter(base, folder, merge=True))")
    start = model if config.method == "lora" else replace(model, hf=copy.deepcopy(model.hf))
    res = None
    try:
        res = fine_tune(start, Prompts.of(prompts, chat=chat, system=system), responses, config, mask_out=mask_out,
                        progress=False, callback=callback)
        yield res
    finally:
        if config.method == "lora":
            hf = res.model.hf if res is not None else None
            if hf is not None and hasattr(hf, "unload"):
                hf.unload()


def refusals(model: Model, prompts: Sequence[str], judge: Judge | None, max_new_tokens: int,
             batch_size: int = 32, interventions: Sequence[Any] = ()) -> list[bool]:
    """The judge's verdict on the model's greedy answer to each prompt (``True`` = refused), with
    ``interventions`` applied during generation."""
    return steering.generate_and_judge(model, prompts, *interventions, judge=judge, max_new_tokens=max_new_tokens,
                                       runtime=Runtime(batch_size=batch_size)).flags


def refusal_rate(model: Model, prompts: Sequence[str], judge: Judge | None, max_new_tokens: int,
                 interventions: Sequence[Any] = (), batch_size: int = 16) -> Rate:
    """:func:`steering.generate_and_judge` with the studies' argument order: the studies' validation by generation."""
    return steering.generate_and_judge(model, prompts, *interventions, judge=judge, max_new_tokens=max_new_tokens,
                                       runtime=Runtime(batch_size=batch_size))


def base_answers(base: Model, prompts: Sequence[str], max_new_tokens: int, batch_size: int = 32) -> Pairs:
    """(prompt, the base's greedy answer) pairs; an answer that ended on its own keeps the end-of-turn token, an
    empty answer drops its pair."""
    eos = base.tokenizer.eos_token or ""
    with torch.no_grad():
        g = steering.generate(base, list(prompts), max_new_tokens=max_new_tokens,
                              runtime=Runtime(batch_size=batch_size, progress=False))
    keep = [(p, t + (eos if len(ids) < max_new_tokens else "")) for p, t, ids in zip(prompts, g.texts, g.token_ids)
            if t.strip()]
    return [p for p, _ in keep], [r for _, r in keep]


__all__ = ["base_answers", "fresh_tune", "is_peft", "refusal_rate", "refusals", "refuse_shared_adapter"]
