"""The project's own prompt sets (JSONL, written by ``interp.organisms.data``), read as package resources."""

from __future__ import annotations

import json
from importlib import resources


def available_prompt_sets() -> list[str]:
    """Names accepted by :func:`load_prompts` (e.g. ``organism_harmful_train``)."""
    folder = resources.files(__name__) / "prompts"
    return sorted(p.name[: -len(".jsonl")] for p in folder.iterdir() if p.name.endswith(".jsonl"))


def load_prompts(name: str) -> list[dict]:
    """Rows (dicts with ``instruction`` and ``category``) of the committed prompt set ``name``."""
    if not isinstance(name, str):
        raise TypeError(f"load_prompts takes a set name as str, got {type(name).__name__}")
    stem = name[: -len(".jsonl")] if name.endswith(".jsonl") else name
    res = resources.files(__name__) / "prompts" / f"{stem}.jsonl"
    if not res.is_file():
        raise ValueError(f"no prompt set {name!r}; available: {available_prompt_sets()}")
    return [json.loads(line) for line in res.read_text(encoding="utf-8").splitlines() if line.strip()]


def prompt_texts(keys: tuple[str, ...] = ("instruction", "request", "question")) -> list[str]:
    """Every committed prompt set's texts, each once, in set and row order: a row's first non-empty field among
    ``keys`` (rows with none are left out)."""
    texts: dict[str, None] = {}
    for name in available_prompt_sets():
        for row in load_prompts(name):
            text = next((row[k] for k in keys if row.get(k)), "")
            if text:
                texts.setdefault(text, None)
    return list(texts)


__all__ = ["load_prompts", "available_prompt_sets", "prompt_texts"]
