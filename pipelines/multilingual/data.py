"""The parallel safety prompts of the multilingual studies: harmful, harmless and borderline-benign requests, each
in English and four other languages, with train / val / test splits by prompt id (every language of an id in the
same split), read from ``interp/data/prompts/multilingual_safety.jsonl`` (or any file of the same shape)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from interp.prompts import read_parallel

DEFAULT_FILE = Path(__file__).resolve().parents[2] / "interp" / "data" / "prompts" / "multilingual_safety.jsonl"
LANGS = ("en", "fr", "de", "es", "zh")
SPLITS = ("train", "val", "test")


@dataclass
class ParallelSafety:
    """``prompts[kind][split][lang]``: lists aligned by prompt id across languages (item i of every language is
    the same request); ``langs[0]`` is the source language (English) the directions are fitted in."""

    prompts: dict[str, dict[str, dict[str, list[str]]]]
    langs: tuple[str, ...]
    source: str

    def get(self, kind: str, split: str, lang: str) -> list[str]:
        try:
            return self.prompts[kind][split][lang]
        except KeyError:
            raise KeyError(f"no {kind!r} prompts in split {split!r} for language {lang!r}; this set holds kinds "
                           f"{sorted(self.prompts)}, languages {list(self.langs)}") from None

    def sizes(self) -> dict[str, dict[str, int]]:
        """Prompts per language, by ``kind/split``."""
        return {f"{k}/{s}": len(next(iter(by_lang.values()))) for k, by_split in self.prompts.items()
                for s, by_lang in by_split.items()}


def load_parallel_safety(path: str | Path = DEFAULT_FILE, langs: Sequence[str] = LANGS,
                         kinds: Sequence[str] = ("harmful", "harmless", "borderline"), n: int | None = None
                         ) -> ParallelSafety:
    """The parallel set for ``langs`` (the first is the source language), ``n`` prompts per kind and split at most
    (the first ``n`` in file order, the same ids in every language)."""
    langs = tuple(langs)
    if len(langs) < 2:
        raise ValueError(f"the multilingual studies compare a source language with others; got langs={langs}")
    if n is not None and n < 2:
        raise ValueError(f"n must be >= 2 prompts per kind and split (or None for all), got {n}")
    out: dict[str, dict[str, dict[str, list[str]]]] = {}
    for kind in kinds:
        out[kind] = {}
        for split in SPLITS:
            by = read_parallel(path, kind=kind, split=split, langs=langs)
            out[kind][split] = {lang: v[:n] if n is not None else v for lang, v in by.items()}
    return ParallelSafety(out, langs, langs[0])


__all__ = ["DEFAULT_FILE", "LANGS", "ParallelSafety", "load_parallel_safety"]
