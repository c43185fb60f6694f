"""Read one site over prompts (or token ids) in padded batches, through the core capture machinery."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from interp.capturing import run_batch
from interp.chat import Batch, Encoded
from interp.forward import Inputs, batches, encodings
from interp.sites import parse_site
from interp.values import Prompts, moved_keywords

MOVED = {k: f"inputs=interp.Prompts(texts, {k}=...)" for k in ("chat", "system")}
"""The prompt formatting the SAE functions took as keywords: it travels with the prompts now."""
SINK_MOVED = {"skip_sink": 'sinks="exclude" (skip_sink=True) or sinks="keep" (skip_sink=False)'}
"""The SAE edits' and transcoders' old spelling of leaving each prompt's first token (the sink) alone."""


def sae_encodings(model: Any, inputs: Prompts | Inputs) -> list[Encoded]:
    """Encodings of SAE inputs: prompts (a list of strings or :class:`interp.Prompts`, formatted as it says: a plain
    list gets the chat template, ``interp.Prompts(texts, chat=False)`` is raw text) or token ids ``[n, T]``."""
    items = inputs.tolist() if isinstance(inputs, torch.Tensor) else inputs
    if isinstance(items, Prompts) or (not isinstance(items, str) and len(items) > 0
                                      and all(isinstance(p, str) for p in items)):
        return Prompts.of(items).encode(model)[1]
    return encodings(model, inputs)


@moved_keywords(MOVED)
def site_tokens(model: Any, site: str, inputs: Prompts | Inputs, batch_size: int = 8) -> Iterator[tuple[torch.Tensor, Batch]]:
    """Per left-padded batch: the activations at ``site`` ``[B, T, d]`` (float32 on the CPU, heads flattened,
    zeros at padding) and the :class:`~interp.chat.Batch`. ``inputs``: prompts (:func:`sae_encodings`) or token
    ids ``[n, T]`` (every token real). The pass stops right after the site."""
    s = parse_site(site, model.n_layers)
    for b in batches(model, sae_encodings(model, inputs), batch_size):
        acts, _, _ = run_batch(model, b, [s], "all", torch.float32)
        x = acts[:, 0]
        yield (x.flatten(-2) if x.dim() == 4 else x), b
