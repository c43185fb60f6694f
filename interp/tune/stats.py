"""How concentrated a per-token gain is, and whether a class of tokens is over-represented among the top tokens.

Conventions: the positive gain of a token is ``max(gain, 0)``; the top ``q`` of ``N`` tokens are the
``ceil(q * N)`` largest gains (at least one; ties keep the earlier token); a top share is the positive gain of the
top tokens over the total positive gain of all tokens; the Gini index is that of the positive gains of all tokens
(0: every token gains alike, ``1 - 1/N``: one token holds everything).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from jaxtyping import Float

from interp.evals.rates import fisher_greater


def n_top(n: int, q: float) -> int:
    """How many tokens the top ``q`` of ``n`` holds: ``ceil(q * n)``, at least 1."""
    if not 0 < q <= 1:
        raise ValueError(f"q must be a fraction in (0, 1], got {q}; e.g. 0.1 for the top 10%")
    return max(1, math.ceil(q * n - 1e-9))


def top_order(gain: Float[torch.Tensor, " n"]) -> torch.Tensor:
    """Indices of ``gain`` from largest to smallest (stable: ties keep their order)."""
    return torch.sort(gain.double(), descending=True, stable=True).indices


def cumulative_shares(gain: Float[torch.Tensor, " n"]) -> list[float]:
    """``out[k]``: share of the total positive gain held by the top ``k + 1`` tokens (all zeros when none gains)."""
    pos = gain.double().clamp(min=0)[top_order(gain)]
    total = float(pos.sum())
    return (pos.cumsum(0) / total).tolist() if total > 0 else [0.0] * len(pos)


def top_share(gain: Float[torch.Tensor, " n"], q: float) -> float:
    """Share of the total positive gain held by the top ``q`` of tokens."""
    if gain.numel() == 0:
        raise ValueError("no tokens to measure; give at least one response token")
    return cumulative_shares(gain)[n_top(gain.numel(), q) - 1]


def gini(gain: Float[torch.Tensor, " n"]) -> float:
    """Gini index of the positive gains: ``sum_ij |x_i - x_j| / (2 n^2 mean)`` (0 when nothing gains)."""
    x = gain.double().clamp(min=0).sort().values
    n, total = x.numel(), float(x.sum())
    if n == 0 or total == 0:
        return 0.0
    ranks = torch.arange(1, n + 1, dtype=torch.double)
    return float(((2 * ranks - n - 1) * x).sum() / (n * total))


def concentration(gain: Float[torch.Tensor, " n"], qs: Sequence[float] = (0.01, 0.05, 0.1)) -> dict[str, float]:
    """``{"top_1%": share, "top_5%": ..., "top_10%": ..., "gini": g, "n_tokens": N, "positive_gain": total}``."""
    out = {f"top_{q * 100:g}%": top_share(gain, q) for q in qs}
    return {**out, "gini": gini(gain), "n_tokens": float(gain.numel()),
            "positive_gain": float(gain.double().clamp(min=0).sum())}


def top_flags(gain: Float[torch.Tensor, " n"], q: float) -> torch.Tensor:
    """``[n]`` bool: the top ``q`` of tokens."""
    flags = torch.zeros(gain.numel(), dtype=torch.bool)
    flags[top_order(gain)[:n_top(gain.numel(), q)]] = True
    return flags


def _within_bins(gain: torch.Tensor, bins: torch.Tensor, n_perm: int, gen: torch.Generator) -> torch.Tensor:
    """``[n_perm, n]`` copies of ``gain`` shuffled within each frequency bin."""
    out = gain.double().expand(n_perm, -1).clone()
    for b in bins.unique():
        idx = (bins == b).nonzero()[:, 0]
        perm = torch.rand(n_perm, idx.numel(), generator=gen).argsort(-1)
        out[:, idx] = gain.double()[idx][perm]
    return out


def enrichment(gain: Float[torch.Tensor, " n"], member: torch.Tensor, q: float, bins: torch.Tensor,
               n_perm: int = 1000, seed: int = 0) -> dict[str, float]:
    """Is the class ``member [n]`` over-represented among the top ``q`` tokens? ``ratio``: its share of the top
    over its share of all tokens; ``fisher_p``: one-sided Fisher's exact test (top vs the rest); ``perm_p``: a
    permutation test controlled for frequency (gains shuffled within frequency ``bins``, ``n_perm`` times)."""
    top, member = top_flags(gain, q), member.bool()
    n, k = top.numel(), int(top.sum())
    a, b = int((top & member).sum()), int((~top & member).sum())
    fisher = fisher_greater(a, k, b, n - k) if n - k > 0 else 1.0
    if n_perm > 0:
        perms = _within_bins(gain, bins, n_perm, torch.Generator().manual_seed(seed))
        cut = n_top(n, q)
        top_idx = torch.sort(perms, dim=-1, descending=True, stable=True).indices[:, :cut]
        hits = member[top_idx].sum(-1)
        perm_p = (1 + int((hits >= a).sum())) / (1 + n_perm)
    else:
        perm_p = math.nan
    share = (a + b) / n
    return {"in_top": float(a), "n_class": float(a + b), "ratio": (a / k) / share if share > 0 else math.nan,
            "fisher_p": fisher, "perm_p": perm_p}


__all__ = ["concentration", "cumulative_shares", "enrichment", "gini", "n_top", "top_flags", "top_order",
           "top_share"]
