"""Activations-or-tensor coercion and the width check, shared by probes, sae and steering.

Fitted objects accept :class:`~interp.activations.Activations` (sites picked by name) or plain tensors;
these helpers turn either into a checked tensor and fail with a message that names the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from interp.activations import Activations

POSITIONS_ERROR = ("these Activations keep several positions per prompt ([n, sites, positions, d]); this needs "
                   "one vector per prompt: capture with positions='last' / 'prompt_mean', or pass "
                   "acts.flat_tokens() with one label per token")


def site_indices(acts: Activations, sites: Sequence[str], what: str = "the fitted object") -> list[int]:
    """Indices into ``acts.sites`` of ``sites`` (by name), or an error naming the missing ones."""
    missing = [s for s in sites if s not in acts.sites]
    if missing:
        raise ValueError(f"the activations lack sites {missing} that {what} was fitted at ({list(sites)}); "
                         f"capture them or select the fitted layers")
    return [acts.sites.index(s) for s in sites]


def layer_tensor(X: Any, sites: Sequence[str] | None = None, *, check_finite: bool = False,
                 what: str = "the fitted object") -> torch.Tensor:
    """``[n, n_layers, d]`` from Activations (one vector per prompt; at ``sites`` when given) or a tensor
    ``[n, n_layers, d]`` / ``[n, d]`` (one layer), whose layer count must match ``sites`` when given."""
    if isinstance(X, Activations):
        if X.has_positions:
            raise ValueError(POSITIONS_ERROR)
        return X.tensor if sites is None else X.tensor[:, site_indices(X, sites, what)]
    if not isinstance(X, (torch.Tensor, np.ndarray)):
        raise TypeError(f"expected Activations or a tensor [n, n_layers, d], got {type(X).__name__}")
    t = torch.as_tensor(X)
    if t.dim() == 2:
        t = t[:, None]
    if t.dim() != 3:
        raise ValueError(f"activations must be [n, n_layers, d] (or [n, d] for one layer), got shape {tuple(t.shape)}")
    if sites is not None and t.shape[1] != len(sites):
        raise ValueError(f"activations must be [n, {len(sites)}, d] to match the {len(sites)} fitted layers, "
                         f"got {tuple(t.shape)}")
    if check_finite and not torch.isfinite(t).all():
        raise ValueError("activations contain NaN or Inf; drop those samples or re-capture in float32")
    return t


def token_rows(x: Any, site: str | None = None) -> torch.Tensor:
    """``[n_tokens, d]``: a tensor ``[..., d]`` flattened, or the real tokens of Activations at ``site``."""
    if isinstance(x, Activations):
        if site is None and len(x.sites) != 1:
            raise ValueError(f"these Activations hold {len(x.sites)} sites; pass site=... (one of {x.sites})")
        x = x.flat_tokens(site or x.sites[0])
    elif not isinstance(x, torch.Tensor):
        raise TypeError(f"expected Activations or a tensor [..., d], got {type(x).__name__}")
    return x.reshape(-1, x.shape[-1])


def check_width(vectors: torch.Tensor, d: int, what: str = "direction", against: str = "the activations have") -> None:
    """Raise unless ``vectors`` (last axis) has width ``d``; ``against`` names what ``d`` is the width of."""
    if vectors.shape[-1] != d:
        raise ValueError(f"{what} has width {vectors.shape[-1]} but {against} width {d}; use a {what} fitted "
                         f"on the same model and site")


__all__ = ["POSITIONS_ERROR", "check_width", "layer_tensor", "site_indices", "token_rows"]
