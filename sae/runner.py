"""Run a model over prompts (or token ids) in padded batches, reading or editing one site."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class TokenBatch:
    """Model inputs of one left-padded batch (on the model's device) and the real-token mask."""

    inputs: dict[str, torch.Tensor]
    mask: torch.Tensor  # [B, T] bool

    @property
    def input_ids(self) -> torch.Tensor:
        return self.inputs["input_ids"]


def token_batches(model: Any, inputs: Sequence[str] | torch.Tensor, batch_size: int = 8,
                  chat: bool = False) -> Iterator[TokenBatch]:
    """``inputs``: prompts (tokenised by the model's tokenizer; ``chat`` applies its template) or token ids
    ``[n, T]`` (every token real)."""
    dev = model.device
    if isinstance(inputs, torch.Tensor):
        if inputs.dim() != 2 or inputs.dtype not in (torch.long, torch.int, torch.int32, torch.int64):
            raise TypeError(f"token ids must be an integer tensor [n, T], got {inputs.dtype} {tuple(inputs.shape)}")
        for a in range(0, inputs.shape[0], batch_size):
            ids = inputs[a:a + batch_size].long().to(dev)
            mask = torch.ones_like(ids)
            pos = torch.arange(ids.shape[1], device=dev).expand_as(ids)
            yield TokenBatch({"input_ids": ids, "attention_mask": mask, "position_ids": pos}, mask.bool())
        return
    from interp.forward import batches, prepare

    _, encs = prepare(model, list(inputs), chat=chat)
    for b in batches(model, encs, batch_size):
        yield TokenBatch({k: v.to(dev) for k, v in b.model_inputs.items()}, b.attention_mask.bool().to(dev))


def forward(model: Any, batch: TokenBatch, hook_fns: dict[str, Callable] | None = None) -> torch.Tensor:
    """Logits ``[B, T, V]`` with ``hook_fns`` attached."""
    from interp.hooks import hooks

    with torch.no_grad(), hooks(model, hook_fns or {}):
        return model.hf(**batch.inputs, use_cache=False).logits


def next_token_ce(logits: torch.Tensor, batch: TokenBatch) -> tuple[float, int]:
    """Summed next-token cross-entropy over real positions, and the count of predictions."""
    ids = batch.input_ids
    valid = batch.mask[:, 1:] & batch.mask[:, :-1]
    lp = torch.log_softmax(logits[:, :-1].float(), -1)
    nll = -lp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return float(nll[valid].sum()), int(valid.sum())


def site_tokens(model: Any, site: str, inputs: Sequence[str] | torch.Tensor, batch_size: int = 8,
                chat: bool = False) -> Iterator[tuple[torch.Tensor, TokenBatch]]:
    """Activations at ``site`` ``[B, T, d]`` (float32, flattened heads) for each batch."""
    from interp.hooks import StopForward

    got: dict[str, torch.Tensor] = {}

    def grab(x: torch.Tensor, ctx: Any) -> None:
        got["x"] = (x.flatten(-2) if x.dim() == 4 else x).detach().float()
        raise StopForward  # nothing after the site is needed

    for b in token_batches(model, inputs, batch_size, chat):
        try:
            forward(model, b, {site: grab})
        except StopForward:
            pass
        yield got.pop("x"), b


def generate(model: Any, prompts: Sequence[str], hook_fns: dict[str, Callable] | None = None, max_new_tokens: int = 16,
             batch_size: int = 32, chat: bool = True) -> list[str]:
    """Greedy completions of ``prompts`` (chat template applied when ``chat``) with ``hook_fns`` attached at
    every step, prompt and generated tokens alike; returns the decoded new text."""
    from interp.chat import format_prompts
    from interp.hooks import hooks

    tok = model.tokenizer
    if tok is None:
        raise ValueError("generation needs a tokenizer; load the model with interp.load_model or pass tokenizer=")
    texts = format_prompts(model, list(prompts), chat=chat)
    out: list[str] = []
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    for a in range(0, len(texts), batch_size):
        enc = tok(texts[a:a + batch_size], return_tensors="pt", padding=True, add_special_tokens=not chat)
        enc = {k: v.to(model.device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
        with torch.no_grad(), hooks(model, hook_fns or {}):
            gen = model.hf.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
        out += tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return out
