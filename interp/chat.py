"""Chat formatting and batch tokenisation (left padding, ``position_ids`` from the attention mask)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from interp.models import Model

PLAIN_TEMPLATE = "User: {instruction}\nAssistant:"


def has_chat_template(model: Model) -> bool:
    return bool(getattr(model.tokenizer, "chat_template", None))


def format_prompts(model: Model, instructions: list[str], system: str | None = None, chat: bool = True) -> list[str]:
    """Wrap each instruction in the model's chat template (generation prompt appended).

    Without a chat template a plain ``User: ...\\nAssistant:`` fallback is used, with a warning.
    ``chat=False`` returns the instructions unchanged (raw text).
    """
    _check_prompts(instructions)
    if not chat:
        return list(instructions)
    if not has_chat_template(model):
        warnings.warn(f"{model.name} has no chat template; using the plain fallback {PLAIN_TEMPLATE!r}", stacklevel=2)
        return [PLAIN_TEMPLATE.format(instruction=i) for i in instructions]
    out = []
    for inst in instructions:
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": inst}]
        out.append(model.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
    return out


def _check_prompts(prompts: list[str]) -> None:
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of strings, not a single string; wrap it in a list")
    if len(prompts) == 0:
        raise ValueError("the prompt list is empty; give at least one prompt")
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise TypeError(f"prompt {i} is {type(p).__name__}, not str")
        if not p.strip():
            raise ValueError(f"prompt {i} is empty")


@dataclass
class Batch:
    """A left-padded batch. ``post_mask`` marks the post-instruction tokens, ``response_mask`` the response."""

    input_ids: torch.Tensor       # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    position_ids: torch.Tensor    # [B, T]
    post_mask: torch.Tensor       # [B, T] bool
    response_mask: torch.Tensor   # [B, T] bool
    special_mask: torch.Tensor | None = None  # [B, T] bool: the tokenizer's special tokens (BOS, template tokens)

    def to(self, device: torch.device | str) -> Batch:
        sp = None if self.special_mask is None else self.special_mask.to(device)
        return Batch(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.position_ids,
                                               self.post_mask, self.response_mask)), special_mask=sp)

    @property
    def model_inputs(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "position_ids": self.position_ids}


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, so left padding never shifts them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass
class Encoded:
    """Token ids of one text, with the index where the instruction ends and where the response starts."""

    ids: list[int]
    post_start: int     # first post-instruction token
    response_start: int  # first response token (== len(ids) when there is no response)
    special: list[bool] | None = None  # per token: one of the tokenizer's special tokens (None: unknown)


def special_prefix(tokenizer: Any) -> list[int]:
    """The ids the tokenizer itself puts before any text (its BOS, as its template / ``add_bos_token`` says).

    Found by tokenising a probe text with and without special tokens, so it holds for every family (Gemma and
    Llama add a BOS, GPT-2 and Qwen add none). Trailing specials (an EOS) are never taken: prompts go on."""
    probe = "a"
    plain = list(tokenizer(probe, add_special_tokens=False)["input_ids"])
    full = list(tokenizer(probe, add_special_tokens=True)["input_ids"])
    for k in range(len(full) - len(plain) + 1):
        if full[k:k + len(plain)] == plain:
            return full[:k]
    return []


def encode(model: Model, texts: list[str], instructions: list[str] | None = None,
           responses: list[str] | None = None, add_special_tokens: bool = True) -> list[Encoded]:
    """Tokenise formatted prompts (and optional responses) and locate the post-instruction tokens.

    The post-instruction tokens are those starting at or after the end of the instruction text inside
    the formatted prompt (the template's suffix, e.g. ``<|im_end|>\\n<|im_start|>assistant\\n``).
    ``add_special_tokens``: start every text with the tokenizer's own prefix (:func:`special_prefix`, its BOS)
    unless the text already starts with it (a chat template that writes the BOS), so there is never a double BOS.
    """
    tok = model.tokenizer
    if tok is None:
        raise ValueError("this model has no tokenizer; pass token ids or attach a tokenizer with from_hf(..., tokenizer=)")
    prefix = special_prefix(tok) if add_special_tokens else []
    special_ids = set(getattr(tok, "all_special_ids", None) or [])
    full = [t + (responses[i] if responses else "") for i, t in enumerate(texts)]
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=bool(getattr(tok, "is_fast", False)))
    out: list[Encoded] = []
    for i, ids in enumerate(enc["input_ids"]):
        n_prompt_chars = len(texts[i])
        inst_end = n_prompt_chars
        if instructions is not None:
            pos = texts[i].rfind(instructions[i])
            inst_end = pos + len(instructions[i]) if pos >= 0 else n_prompt_chars
        if "offset_mapping" in enc:
            offs = enc["offset_mapping"][i]
            starts = [s if (e > s) else None for s, e in offs]
            post_start = _first_at_or_after(starts, inst_end, len(ids))
            resp_start = _first_at_or_after(starts, n_prompt_chars, len(ids)) if responses else len(ids)
        else:
            n_inst = len(tok(texts[i][:inst_end], add_special_tokens=False)["input_ids"])
            n_prompt = len(tok(texts[i], add_special_tokens=False)["input_ids"])
            post_start, resp_start = n_inst, (n_prompt if responses else len(ids))
        ids = list(ids)
        add = prefix if prefix and ids[:len(prefix)] != prefix else []
        ids = add + ids
        out.append(Encoded(ids, post_start + len(add), resp_start + len(add), [t in special_ids for t in ids]))
    return out


def _first_at_or_after(starts: list[int | None], char: int, default: int) -> int:
    """Index of the first token whose text starts at or after ``char``; ``default`` when none does."""
    for j, s in enumerate(starts):
        if s is not None and s >= char:
            return j
    return default


def collate(items: list[Encoded], pad_id: int, max_length: int | None = None) -> Batch:
    """Left-pad encoded items into a :class:`Batch`."""
    T = max(len(e.ids) for e in items)
    if max_length is not None and T > max_length:
        i = max(range(len(items)), key=lambda k: len(items[k].ids))
        raise ValueError(f"a prompt has {T} tokens but the model's context is {max_length}; shorten prompt "
                         f"{i} of this batch or pass max_length/truncate it yourself")
    B = len(items)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.long)
    post = torch.zeros((B, T), dtype=torch.bool)
    resp = torch.zeros((B, T), dtype=torch.bool)
    special = torch.zeros((B, T), dtype=torch.bool)
    for b, e in enumerate(items):
        n = len(e.ids)
        off = T - n
        ids[b, off:] = torch.tensor(e.ids, dtype=torch.long)
        mask[b, off:] = 1
        post[b, off + e.post_start: off + e.response_start] = True
        resp[b, off + e.response_start:] = True
        if e.special is not None:
            special[b, off:] = torch.tensor(e.special, dtype=torch.bool)
    return Batch(ids, mask, position_ids_from_mask(mask), post, resp, special)
