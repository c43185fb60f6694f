"""The parallel multilingual safety prompt set ``multilingual_safety``: harmful requests, harmless requests and
borderline-benign look-alikes, each id written in English, French, German, Spanish and Simplified Chinese, for
multilingual refusal studies (e.g. Gemma 3 270M).

The prompts are our own, authored in ``interp.organisms.multilingual_harmful``, ``interp.organisms.multilingual_harmless`` and
``interp.organisms.multilingual_borderline`` (one tuple per id: number, category, en, fr, de, es, zh; three modules so
that no file passes the house limit of 400 lines). ``python -m interp.organisms.multilingual_data`` writes them to
``interp/data/prompts/multilingual_safety.jsonl``: one row per id and language with ``id``, ``kind``, ``lang``,
``instruction``, ``category`` and ``split``, ordered by kind (harmful, harmless, borderline), id, then language.

Split rule, per id (so every language of an id shares it) and per kind: the ids of a kind are sorted by
``sha256(f"{SPLIT_SALT}:{id}")``; the first ``round(0.25 n)`` are ``test``, the next ``round(0.15 n)`` ``val``
and the rest ``train``. Each kind thus gets 60 / 15 / 25 up to rounding, and adding an id moves only the few
ids at the split boundaries.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from interp.organisms.multilingual_borderline import BORDERLINE
from interp.organisms.multilingual_harmful import HARMFUL
from interp.organisms.multilingual_harmless import HARMLESS

NAME = "multilingual_safety"
OUT = Path(__file__).resolve().parents[1] / "data" / "prompts" / f"{NAME}.jsonl"
LANGS = ("en", "fr", "de", "es", "zh")
KINDS = ("harmful", "harmless", "borderline")
SPLIT_SALT = "multilingual-safety-v1"
SPLITS = (("test", 0.25), ("val", 0.15))  # taken in this order from the hash ranking; the rest is train
HARMFUL_CATEGORIES = ("weapons", "drugs", "cybercrime", "fraud", "violence", "harassment", "self_harm",
                      "privacy", "extremism", "theft")
HARMLESS_CATEGORIES = ("cooking", "travel", "science", "coding", "writing", "health_general", "finance_general",
                       "history", "math", "language", "home_garden")
CATEGORIES = {"harmful": HARMFUL_CATEGORIES, "harmless": HARMLESS_CATEGORIES, "borderline": HARMFUL_CATEGORIES}
Entry = tuple[int, str, str, str, str, str, str]


def entries(kind: str) -> list[Entry]:
    """The authored tuples (number, category, en, fr, de, es, zh) of one ``kind``."""
    table = {"harmful": HARMFUL, "harmless": HARMLESS, "borderline": BORDERLINE}
    if kind not in table:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return table[kind]


def prompt_id(kind: str, number: int) -> str:
    """The id shared by every language of one prompt, e.g. ``harmful-017``."""
    return f"{kind}-{number:03d}"


def assign_splits(ids: list[str], salt: str = SPLIT_SALT) -> dict[str, str]:
    """``train`` / ``val`` / ``test`` for each id of one kind, by its rank under a salted sha256 (module docstring)."""
    ranked = sorted(ids, key=lambda i: hashlib.sha256(f"{salt}:{i}".encode()).hexdigest())
    out: dict[str, str] = {}
    start = 0
    for name, frac in SPLITS:
        stop = start + round(frac * len(ranked))
        out.update({i: name for i in ranked[start:stop]})
        start = stop
    out.update({i: "train" for i in ranked[start:]})
    return out


def _check(kind: str, entry: Entry) -> None:
    """Raise ValueError on a malformed authored tuple."""
    if len(entry) != 2 + len(LANGS):
        raise ValueError(f"{kind} entry {entry[:1]} has {len(entry)} fields; expected number, category, {LANGS}")
    number, category, *texts = entry
    if not isinstance(number, int) or number < 1:
        raise ValueError(f"{kind} entry number must be a positive int, got {number!r}")
    if category not in CATEGORIES[kind]:
        raise ValueError(f"{prompt_id(kind, number)}: category {category!r} is not one of {CATEGORIES[kind]}")
    for lang, text in zip(LANGS, texts):
        if not isinstance(text, str) or not text.strip() or text != text.strip():
            raise ValueError(f"{prompt_id(kind, number)} [{lang}]: empty, or leading/trailing whitespace")


def build_rows() -> list[dict[str, Any]]:
    """Every row of the set, in file order (kind, id, language)."""
    rows: list[dict[str, Any]] = []
    for kind in KINDS:
        table = sorted(entries(kind), key=lambda e: e[0])
        for entry in table:
            _check(kind, entry)
        ids = [prompt_id(kind, e[0]) for e in table]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate {kind} numbers: {sorted(i for i in set(ids) if ids.count(i) > 1)}")
        split = assign_splits(ids)
        for pid, (_, category, *texts) in zip(ids, table):
            rows += [{"id": pid, "kind": kind, "lang": lang, "instruction": text, "category": category,
                      "split": split[pid]} for lang, text in zip(LANGS, texts)]
    return rows


def write(path: str | os.PathLike = OUT) -> int:
    """Write the set as UTF-8 JSONL atomically (:func:`interp.io.atomic_write`); the row count."""
    from interp.io import atomic_write

    rows = build_rows()
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))
    return len(rows)


def main(argv: list[str] | None = None) -> None:
    """CLI: write the set to ``--out`` (default: the committed ``interp/data/prompts/multilingual_safety.jsonl``)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT, help="JSONL file to write (replaced atomically)")
    args = ap.parse_args(argv)
    n = write(args.out)
    print(f"wrote {n} rows ({n // len(LANGS)} ids x {len(LANGS)} languages) to {args.out}")


if __name__ == "__main__":
    main()
