"""Synthetic activations with a planted sparse dictionary, for tests and benchmarks."""

from __future__ import annotations

import torch
from jaxtyping import Float


def planted_dictionary(n_tokens: int, d: int, n_features: int, k_active: float, seed: int = 0,
                       noise: float = 0.0) -> tuple[Float[torch.Tensor, "n d"], Float[torch.Tensor, "f d"]]:
    """Tokens ``x = c @ D (+ noise)``: ``D`` has unit rows, each token uses ~``k_active`` features
    (Bernoulli) with magnitudes uniform in [0.5, 1.5]. Returns ``(x, D)``."""
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(n_features, d, generator=g)
    D = D / D.norm(dim=1, keepdim=True)
    p = k_active / n_features
    out = torch.empty(n_tokens, d)
    step = 8192
    for a in range(0, n_tokens, step):
        b = min(n_tokens, a + step)
        on = torch.rand(b - a, n_features, generator=g) < p
        mag = 0.5 + torch.rand(b - a, n_features, generator=g)
        out[a:b] = (on * mag) @ D
    if noise:
        out += noise * torch.randn(n_tokens, d, generator=g)
    return out, D


def planted_fixed_k(n_tokens: int, d: int, n_features: int, k_active: int, seed: int = 0,
                    device: str | torch.device = "cpu") -> tuple[Float[torch.Tensor, "n d"], Float[torch.Tensor, "f d"]]:
    """Like :func:`planted_dictionary` with exactly ``k_active`` random features per token, built sparsely
    (``embedding_bag``), so large dictionaries (16k features) stay cheap to sample."""
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(n_features, d, generator=g)
    D = (D / D.norm(dim=1, keepdim=True)).to(device)
    idx = torch.randint(0, n_features, (n_tokens, k_active), generator=g).to(device)
    mag = (0.5 + torch.rand(n_tokens, k_active, generator=g)).to(device)
    offsets = torch.arange(0, n_tokens * k_active, k_active, device=device)
    x = torch.nn.functional.embedding_bag(idx.reshape(-1), D, offsets, mode="sum", per_sample_weights=mag.reshape(-1))
    return x, D
