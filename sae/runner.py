"""Read one site over prompts (or token ids) in padded batches, through the core capture machinery."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from interp.capturing import run_batch
from interp.chat import Batch
from interp.forward import Inputs, batches, encodings
from interp.sites import parse_site


def site_tokens(model: Any, site: str, inputs: Inputs, batch_size: int = 8,
                chat: bool = False) -> Iterator[tuple[torch.Tensor, Batch]]:
    """Per left-padded batch: the activations at ``site`` ``[B, T, d]`` (float32 on the CPU, heads flattened,
    zeros at padding) and the :class:`~interp.chat.Batch`. ``inputs``: prompts (``chat`` applies the chat
    template) or token ids ``[n, T]`` (every token real). The pass stops right after the site."""
    s = parse_site(site, model.n_layers)
    for b in batches(model, encodings(model, inputs, chat), batch_size):
        acts, _, _ = run_batch(model, b, [s], "all", torch.float32)
        x = acts[:, 0]
        yield (x.flatten(-2) if x.dim() == 4 else x), b
