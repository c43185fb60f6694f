"""The one seeded matched-random sampler: the control draw every study compares its found units with.

A study finds some units (latents, heads, neurons, blocks, components, features) and asks whether they matter more
than units drawn at random *like them* (same layer, same part, similar firing frequency). :func:`matched_random`
draws, for each found unit in order, one unit among the candidates that match it, never a found unit and never one
already drawn, so the control set has the found set's size and composition.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T", bound=Hashable)


def as_rng(seed: int | random.Random) -> random.Random:
    """A ``random.Random`` from a seed (or the generator itself, to draw several sets from one stream)."""
    if isinstance(seed, random.Random):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int or a random.Random, got {seed!r}")
    return random.Random(seed)


def matched_random(chosen: Sequence[T], candidates: Callable[[T], Iterable[T]], seed: int | random.Random,
                   n: int | None = None, what: str = "unit") -> list[T]:
    """``n`` (default ``len(chosen)``) units, the ``i``-th drawn uniformly among ``candidates(chosen[i % len(chosen)])``
    minus the chosen units and those already drawn. Raises ``ValueError`` naming the unit when none is left."""
    if n is None:
        n = len(chosen)
    if n < 0:
        raise ValueError(f"the number of random {what}s must be >= 0, got {n}")
    if n and not chosen:
        raise ValueError(f"no chosen {what}s to match a random control to")
    rng, taken, out = as_rng(seed), set(chosen), []
    drawn: set[T] = set()
    for i in range(n):
        unit = chosen[i % len(chosen)]
        pool = [c for c in dict.fromkeys(candidates(unit)) if c not in taken and c not in drawn]
        if not pool:
            raise ValueError(f"no {what} left to draw a random control matched to {unit!r} ({i} of {n} drawn): "
                             f"widen the candidates or ask for fewer")
        pick = rng.choice(pool)
        drawn.add(pick)
        out.append(pick)
    return out


__all__ = ["as_rng", "matched_random"]
