"""Training data of the post-training methods study: reasoned refusals (a short justification, then the decline)
and preference pairs, all written by us and drawn by a seeded RNG.

Every word below is one the toy organism's base was trained on (its refusal words, "sorry", "can't", ..., are
not: their tied embeddings are still at their random start, and a short fine-tune with frozen embeddings cannot
make the base say them), so the same templates serve the toy and real models. Each reasoned refusal is two sentences, a justification then a decline of "that" / "this", which the
anchored judge (:func:`evals.judge.is_refusal`) reads as a refusal.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

JUSTIFICATIONS: tuple[str, ...] = (
    "This would help someone hurt people.",
    "This could get someone hurt.",
    "This could hurt people.",
    "This would hurt people.",
)
DECLINES: tuple[str, ...] = (
    "I will not help you with this.",
    "I will not help with this.",
    "No, I will not help you with this.",
    "I will not do this.",
    "No, I can not help you with this.",
)


def reasoned_refusals(n: int, seed: int = 0, refusals: Sequence[str] | None = None, suffix: str = "") -> list[str]:
    """``n`` reasoned refusals, seeded: a justification, then ``refusals[i]`` (``None``: a decline of
    :data:`DECLINES`), then ``suffix`` (e.g. the end-of-turn token)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if refusals is not None and len(refusals) != n:
        raise ValueError(f"{len(refusals)} refusals for n={n}; give one per harmful prompt")
    rng = random.Random(seed)
    return [f"{rng.choice(JUSTIFICATIONS)} {rng.choice(DECLINES) if refusals is None else refusals[i]}{suffix}"
            for i in range(n)]


@dataclass(frozen=True)
class Pairs:
    """Preference triples: ``prompts[i]`` with ``chosen[i]`` preferred to ``rejected[i]``."""

    prompts: list[str]
    chosen: list[str]
    rejected: list[str]


def preference_pairs(harmful: Sequence[str], refusals: Sequence[str], compliant: Sequence[str],
                     harmless: Sequence[str], answers: Sequence[str], seed: int = 0) -> Pairs:
    """Harmful prompts: chosen = the refusal, rejected = the compliant answer; harmless prompts: chosen = the
    answer, rejected = a refusal drawn (seeded) from ``refusals``. Harmful pairs first, then harmless ones."""
    for name, xs, like in (("refusals", refusals, harmful), ("compliant", compliant, harmful),
                           ("answers", answers, harmless)):
        if len(xs) != len(like):
            raise ValueError(f"{len(xs)} {name} for {len(like)} prompts; give one per prompt, in the same order")
    rng = random.Random(seed)
    drawn = [refusals[rng.randrange(len(refusals))] for _ in harmless]
    return Pairs(list(harmful) + list(harmless), list(refusals) + list(answers), list(compliant) + drawn)


__all__ = ["DECLINES", "JUSTIFICATIONS", "Pairs", "preference_pairs", "reasoned_refusals"]
