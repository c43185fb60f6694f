"""Prompt files: CSV, JSON (a list of strings or objects), JSONL or plain text (one prompt per line).

One reader for every caller (the CLI, the refusal pipeline, notebooks): it returns the prompts and, when the
rows carry one, their category, from the same rows, so the two can never disagree.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROMPT_KEYS = ("instruction", "prompt", "goal", "Goal", "text", "statement", "forbidden_prompt", "Behavior")
CATEGORY_KEYS = ("category", "Category", "SemanticCategory", "type")


@dataclass
class PromptFile:
    """The prompts of one file, with a category per prompt (``"all"`` when the file has none)."""

    prompts: list[str]
    categories: list[str] = field(default_factory=list)
    column: str | None = None


def _rows(p: Path) -> list[Any]:
    suffix = p.suffix.lower()
    if suffix == ".csv":
        with open(p, newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(fh))
    if suffix == ".json":
        rows = json.loads(p.read_text(encoding="utf-8"))
        if isinstance(rows, dict):
            raise ValueError(f"{p}: expected a JSON list of prompts or objects, got an object")
        return rows
    if suffix == ".jsonl":
        return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [line for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


def read_rows(path: str | Path) -> list[Any]:
    """The raw rows of a CSV / JSON / JSONL / text file (dicts or strings), for structured prompt sets."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"prompt file {p} does not exist")
    return _rows(p)


def read_prompt_file(path: str | Path, column: str | None = None) -> PromptFile:
    """Prompts (and categories) from ``path``; ``column`` names the prompt field of CSV/JSON/JSONL rows."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"prompt file {p} does not exist")
    rows = _rows(p)
    if not rows:
        raise ValueError(f"{p} holds no prompts")
    if all(isinstance(r, str) for r in rows):
        if column is not None:
            raise ValueError(f"{p} holds plain prompts with no columns; drop --column {column!r}")
        return PromptFile(list(rows), ["all"] * len(rows))
    keys = list(rows[0].keys())
    col = column or next((k for k in PROMPT_KEYS if k in keys), None)
    if col is None or col not in keys:
        raise ValueError(f"{p}: column {column!r} does not exist; available columns: {keys} (choose one with --column)"
                         if column else f"{p}: no prompt column found among {keys}; choose one with --column")
    cat_key = next((k for k in CATEGORY_KEYS if k in keys), None)
    kept = [r for r in rows if str(r.get(col) or "").strip()]
    if not kept:
        raise ValueError(f"{p}: column {col!r} is empty")
    cats = [str(r.get(cat_key) or "all") if cat_key else "all" for r in kept]
    return PromptFile([str(r[col]) for r in kept], cats, col)


def read_prompts(path: str | Path, column: str | None = None) -> list[str]:
    """Just the prompts of :func:`read_prompt_file`."""
    return read_prompt_file(path, column).prompts


def read_parallel(path: str | Path, kind: str | None = None, split: str | None = None,
                  langs: tuple[str, ...] | None = None) -> dict[str, list[str]]:
    """A parallel prompt file (JSONL rows with ``id``, ``lang`` and ``instruction``, optionally ``kind`` and
    ``split``, e.g. ``interp/data/prompts/multilingual_safety.jsonl``) as ``{lang: prompts}``, the lists aligned by
    id (item i of every language is the same prompt), keeping only ids present in every language asked for."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"parallel prompt file {p} does not exist")
    rows = [r for r in _rows(p) if (kind is None or r.get("kind") == kind) and (split is None or r.get("split") == split)]
    if rows and not all(isinstance(r, dict) and {"id", "lang", "instruction"} <= r.keys() for r in rows):
        raise ValueError(f"{p}: a parallel prompt file has JSONL rows with 'id', 'lang' and 'instruction'")
    have = sorted({r["lang"] for r in rows})
    langs = tuple(langs) if langs is not None else tuple(dict.fromkeys(r["lang"] for r in rows))
    missing = [lang for lang in langs if lang not in have]
    if missing or not rows:
        raise ValueError(f"{p}: no rows for language(s) {missing or list(langs)} with kind={kind!r} split={split!r}; "
                         f"languages present: {have}")
    by = {lang: {r["id"]: r["instruction"] for r in rows if r["lang"] == lang} for lang in langs}
    ids = [i for i in dict.fromkeys(r["id"] for r in rows) if all(i in by[lang] for lang in langs)]
    return {lang: [by[lang][i] for i in ids] for lang in langs}


__all__ = ["PromptFile", "read_parallel", "read_prompt_file", "read_prompts", "read_rows"]
