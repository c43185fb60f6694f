"""Rates of judged events (refusals) with their uncertainty: Wilson intervals and Fisher's exact test.

Every judged rate goes through :class:`Rate` (:func:`rate` from verdicts), so each carries its count, its sample
size and a 95% interval; :func:`fisher_greater` is the one-sided test the job uses to decide whether a model
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


class Rate(dict):
    """The one record of a judged rate: ``k`` of ``n`` events, ``rate = k / n`` and its 95% Wilson interval ``ci95``.

    A ``dict`` with exactly the keys ``rate``, ``k``, ``n``, ``ci95`` (so it unpacks into table rows and writes as
    JSON as it is) and the same fields as attributes. :func:`steering.generate_and_judge` returns it with the
    verdicts (``flags``) and the answers (``texts``) it was computed from as attributes (not keys)."""

    def __init__(self, k: int, n: int, flags: Sequence[bool] | None = None, texts: Sequence[str] | None = None):
        if isinstance(k, bool) or isinstance(n, bool):
            raise TypeError(f"a rate needs integer counts, got k={k!r}, n={n!r}")
        k, n = int(k), int(n)
        lo, hi = wilson(k, n)
        super().__init__(rate=k / n if n else math.nan, k=k, n=n, ci95=[round(lo, 4), round(hi, 4)])
        self.flags = None if flags is None else [bool(f) for f in flags]
        self.texts = None if texts is None else list(texts)

    @property
    def k(self) -> int:
        return self["k"]

    @property
    def n(self) -> int:
        return self["n"]

    @property
    def rate(self) -> float:
        return self["rate"]

    @property
    def ci95(self) -> tuple[float, float]:
        return tuple(self["ci95"])

    def columns(self) -> dict[str, Any]:
        """The record as flat table columns: ``rate``, ``k``, ``n``, ``low``, ``high`` (the interval's ends)."""
        return {"rate": self.rate, "k": self.k, "n": self.n, "low": self["ci95"][0], "high": self["ci95"][1]}

    def __repr__(self) -> str:
        lo, hi = self.ci95
        return f"Rate({self.k}/{self.n} = {self.rate:.3f}, 95% CI [{lo:.3f}, {hi:.3f}])"


def rate(flags: Sequence[bool], texts: Sequence[str] | None = None) -> Rate:
    """The :class:`Rate` of boolean outcomes (e.g. one judge verdict per generation)."""
    flags = [bool(f) for f in flags]
    return Rate(sum(flags), len(flags), flags, texts)


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


def rate_cells(rows: Sequence[dict[str, Any]], by: Sequence[str] = ("condition",)) -> dict[str, dict[str, Any]]:
    """A results table's rate rows (each with ``rate, k, n, ci95``) keyed by their ``by`` columns joined with
    ``/``: the rates of a result's summary, JSON-ready."""
    return {"/".join(str(r[b]) for b in by): {"rate": r["rate"], "k": r["k"], "n": r["n"],
                                             "ci95": [float(x) for x in r["ci95"]]} for r in rows}


__all__ = ["Rate", "fisher_greater", "rate", "rate_cells", "wilson"]
