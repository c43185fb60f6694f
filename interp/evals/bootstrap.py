"""Bootstrap resampling and percentile intervals: the one place the studies resample prompts or items.

:func:`resample_ids` draws ``[n_boot, n]`` indices with replacement (optionally inside groups, keeping each group's
size); :func:`percentile_interval` reads the 95% (or any level) percentile interval off the resampled statistics,
ignoring NaN resamples.
"""

from __future__ import annotations

import torch


def _generator(seed: int | torch.Generator) -> torch.Generator:
    return seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(int(seed))


def resample_ids(n: int, n_boot: int, seed: int | torch.Generator = 0,
                 groups: torch.Tensor | None = None) -> torch.Tensor:
    """``[n_boot, n]`` indices into ``n`` items drawn with replacement; with ``groups [n]`` (a group id per item),
    each item is replaced by a member of its own group, so group sizes are kept."""
    if n < 1 or n_boot < 1:
        raise ValueError(f"bootstrap needs n >= 1 items and n_boot >= 1 resamples, got n={n}, n_boot={n_boot}")
    gen = _generator(seed)
    if groups is None:
        return torch.randint(0, n, (n_boot, n), generator=gen)
    if groups.shape != (n,):
        raise ValueError(f"groups must hold one id per item, shape ({n},), got {tuple(groups.shape)}")
    idx = torch.empty(n_boot, n, dtype=torch.long)
    for k in groups.unique():
        members = (groups == k).nonzero()[:, 0]
        idx[:, members] = members[torch.randint(len(members), (n_boot, len(members)), generator=gen)]
    return idx


def percentile_interval(samples: torch.Tensor, level: float = 0.95, dim: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lo, hi)``: the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of ``samples`` along ``dim`` (NaN
    resamples ignored), in ``samples``' dtype (computed in float64)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    s = samples.double()
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.double)
    lo, hi = torch.nanquantile(s, q, dim=dim)
    dtype = samples.dtype if samples.dtype.is_floating_point else torch.double
    return lo.to(dtype), hi.to(dtype)


def mean_interval(values: torch.Tensor, n_boot: int = 2000, seed: int | torch.Generator = 0,
                  level: float = 0.95) -> dict[str, float]:
    """The mean of per-item ``values [n]`` with its bootstrap percentile interval over items and the one-sided
    bootstrap p-value of ``mean <= 0`` (floored at ``1 / n_boot``): ``{"mean", "lo", "hi", "p"}``."""
    v = torch.as_tensor(values, dtype=torch.double).flatten()
    boot = v[resample_ids(len(v), n_boot, seed)].mean(1)
    lo, hi = percentile_interval(boot, level)
    p = float((boot <= 0).double().mean().clamp_min(1 / n_boot))
    return {"mean": float(v.mean()), "lo": float(lo), "hi": float(hi), "p": p}


__all__ = ["mean_interval", "percentile_interval", "resample_ids"]
