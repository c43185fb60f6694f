"""Prompt sets for the refusal pipeline: the project's own organism sets by default, or user files split
deterministically into train / val / test."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from interp.io import content_hash
from interp.prompts import read_prompt_file


@dataclass
class PromptSplit:
    instructions: list[str]
    categories: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.instructions)

    def head(self, n: int | None) -> PromptSplit:
        if n is None:
            return self
        return PromptSplit(self.instructions[:n], self.categories[:n])


@dataclass
class RefusalData:
    harmful: dict[str, PromptSplit]
    harmless: dict[str, PromptSplit]
    source: dict[str, str]

    def digest(self, part: str) -> str:
        """Hash of both classes' ``part`` split (instructions and categories): a stage's data identity."""
        blob = {what: [split.instructions, split.categories]
                for what, split in (("harmful", self.harmful[part]), ("harmless", self.harmless[part]))}
        return content_hash(blob)

    def check(self) -> None:
        """Every split of both classes needs at least 2 prompts (a mean difference and a val/test score)."""
        for what, parts in (("harmful", self.harmful), ("harmless", self.harmless)):
            for part, ps in parts.items():
                if len(ps) < 2:
                    raise ValueError(f"the {what} {part} split has {len(ps)} prompts; at least 2 are needed per "
                                     f"class (add prompts or raise --n-{part})")


def _load_file(path: str | Path, column: str | None, what: str) -> PromptSplit:
    try:
        f = read_prompt_file(path, column)
    except ValueError as e:
        msg = str(e) if what == "harmful" else str(e).replace("--column", "--harmless-column")
        raise ValueError(f"{what} prompts: {msg}") from None
    return PromptSplit(f.prompts, f.categories)


def split(data: PromptSplit, n_train: int, n_val: int, n_test: int, seed: int, what: str) -> dict[str, PromptSplit]:
    """Shuffle with ``seed`` and cut train / val / test (val and test shrink first when data is short)."""
    n = len(data)
    if n < 6:
        raise ValueError(f"{what} set has {n} prompts; the pipeline needs at least 6 (2 each for train, val and "
                         f"test) — add prompts or point --{what} at a bigger file")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    n_tr = min(n_train, max(2, n // 2))
    n_va = min(n_val, max(2, (n - n_tr) // 2))
    n_te = min(n_test, n - n_tr - n_va)
    cuts = {"train": order[:n_tr], "val": order[n_tr:n_tr + n_va], "test": order[n_tr + n_va:n_tr + n_va + n_te]}
    return {k: PromptSplit([data.instructions[i] for i in idx], [data.categories[i] for i in idx])
            for k, idx in cuts.items()}


def load_refusal_data(harmful: str | None = None, harmless: str | None = None, column: str | None = None,
                      harmless_column: str | None = None, n_train: int = 64, n_val: int = 32, n_test: int = 64,
                      seed: int = 0) -> RefusalData:
    """Both classes split into train / val / test; defaults are the project's own organism prompt sets.

    ``column`` names the harmful file's prompt field and ``harmless_column`` the harmless file's; each is
    detected from its own file when ``None`` (two files rarely share a column name, e.g. AdvBench's ``goal``).
    """
    from interp.data import load_prompts

    out: dict[str, dict[str, PromptSplit]] = {}
    source = {}
    for what, path, col in (("harmful", harmful, column), ("harmless", harmless, harmless_column)):
        if path is None:
            parts = {}
            for part, n in (("train", n_train), ("val", n_val), ("test", n_test)):
                rows = load_prompts(f"organism_{what}_{part}")
                parts[part] = PromptSplit([r["instruction"] for r in rows], [r.get("category", "all") for r in rows]).head(n)
            out[what] = parts
            source[what] = f"interp/data/prompts/organism_{what}_*.jsonl"
        else:
            out[what] = split(_load_file(path, col, what), n_train, n_val, n_test, seed, what)
            source[what] = str(path)
    return RefusalData(out["harmful"], out["harmless"], source)
