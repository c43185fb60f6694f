"""Loss masks from an attribution: the top-q% attributed response tokens, and a random mask of equal size.

Both return one bool tensor per example, one flag per response token (``True`` = masked out of the loss), in the
order :func:`tune.fine_tune` takes as ``mask_out`` on the same prompts and responses.
"""

from __future__ import annotations

import torch

from interp.tune.attribution import TokenAttribution
from interp.tune.stats import top_flags


def _split(attr: TokenAttribution, flags: torch.Tensor) -> list[torch.Tensor]:
    return [flags[attr.example == i] for i in range(attr.n_examples)]


def top_mask(attribution: TokenAttribution, q: float) -> list[torch.Tensor]:
    """Per example, ``[k_i]`` bool: the tokens among the top ``q`` (a fraction, e.g. 0.1) of all response tokens by
    gain (``ceil(q * N)`` of them; ties keep the earlier token), to mask out of a fine-tune's loss."""
    if attribution.gain.numel() == 0:
        raise ValueError("the attribution holds no response tokens; score non-empty responses first")
    return _split(attribution, top_flags(attribution.gain, q))


def random_mask(attribution: TokenAttribution, like: list[torch.Tensor], seed: int = 0) -> list[torch.Tensor]:
    """The control of ``like`` (e.g. :func:`top_mask`): in each example as many tokens as ``like`` masks there,
    drawn uniformly at random (seeded) from that example's response tokens."""
    if len(like) != attribution.n_examples:
        raise ValueError(f"{len(like)} masks for {attribution.n_examples} examples; pass the masks built from this "
                         f"attribution")
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, m in enumerate(like):
        n = int((attribution.example == i).sum())
        if m.numel() != n:
            raise ValueError(f"mask {i} has {m.numel()} entries but example {i} has {n} response tokens")
        flags = torch.zeros(n, dtype=torch.bool)
        flags[torch.randperm(n, generator=gen)[:int(m.sum())]] = True
        out.append(flags)
    return out


__all__ = ["random_mask", "top_mask"]
