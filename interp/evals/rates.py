"""Rates of judged events (refusals) with their uncertainty: Wilson intervals and Fisher's exact test.

Every rate the refusal job reports goes through :func:`rate`, so each carries its count, its sample size
and a 95% interval; :func:`fisher_greater` is the one-sided test the job uses to decide whether a model
refuses harmful prompts more often than harmless ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a rate ``k / n`` (95% for ``z = 1.96``); ``(0, 1)`` when ``n == 0``."""
    if n < 0 or not 0 <= k <= max(n, 0):
        raise ValueError(f"a rate needs 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def rate(flags: Sequence[bool]) -> dict[str, Any]:
    """``{"rate", "k", "n", "ci95"}`` of boolean outcomes (e.g. one judge verdict per generation)."""
    k, n = int(sum(bool(f) for f in flags)), len(flags)
    lo, hi = wilson(k, n)
    return {"rate": k / n if n else math.nan, "k": k, "n": n, "ci95": [round(lo, 4), round(hi, 4)]}


def fisher_greater(k1: int, n1: int, k2: int, n2: int) -> float:
    """One-sided p-value of Fisher's exact test that rate ``k1/n1`` exceeds rate ``k2/n2``.

    The probability, under equal rates and fixed margins, of a first-group count of ``k1`` or more
    (the hypergeometric upper tail)."""
    for k, n in ((k1, n1), (k2, n2)):
        if n < 1 or not 0 <= k <= n:
            raise ValueError(f"each group needs n >= 1 and 0 <= k <= n, got k={k}, n={n}")
    total_k, total = k1 + k2, n1 + n2
    denom = math.comb(total, total_k)
    top = min(n1, total_k)
    return min(1.0, sum(math.comb(n1, j) * math.comb(n2, total_k - j) for j in range(k1, top + 1)) / denom)


__all__ = ["fisher_greater", "rate", "wilson"]
