"""Prompt sets for the refusal pipeline: user files split deterministically into train / val / test, or
the project's own sets: the toy organism's synthetic sets for the toy organism, and the realistic sets we
wrote (harmful and harmless requests, and borderline-benign look-alikes for over-refusal) for any other model.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from interp.io import content_hash
from interp.prompts import read_prompt_file
from interp.studies.kit.config import DataConfig
from interp.studies.kit.moved import moved
from interp.values import Runtime, moved_keywords


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


TOY_MODELS = ("organism", "organism-base")  # the toy organism's own synthetic sets are their default data
REALISTIC = {"harmful": "harmful_realistic", "harmless": "harmless_realistic"}
BORDERLINE = "borderline_realistic"


@dataclass
class RefusalData:
    """Harmful and harmless train / val / test splits, an optional over-refusal (borderline-benign) test set,
    and where each came from."""

    harmful: dict[str, PromptSplit]
    harmless: dict[str, PromptSplit]
    source: dict[str, str]
    borderline: PromptSplit | None = None

    def digest(self, part: str) -> str:
        """Hash of both classes' ``part`` split (instructions and categories): a stage's data identity.
        The test digest covers the borderline set too."""
        blob: dict[str, list] = {what: [split.instructions, split.categories]
                                 for what, split in (("harmful", self.harmful[part]), ("harmless", self.harmless[part]))}
        if part == "test" and self.borderline is not None:
            blob["borderline"] = [self.borderline.instructions, self.borderline.categories]
        return content_hash(blob)

    def sizes(self) -> dict[str, dict[str, int]]:
        """Prompts per class and split (the report's sample sizes)."""
        out = {what: {part: len(ps) for part, ps in parts.items()}
               for what, parts in (("harmful", self.harmful), ("harmless", self.harmless))}
        if self.borderline is not None:
            out["borderline"] = {"test": len(self.borderline)}
        return out

    def check(self) -> None:
        """Every split of both classes needs at least 2 prompts (a mean difference and a val/test score)."""
        for what, parts in (("harmful", self.harmful), ("harmless", self.harmless)):
            for part, ps in parts.items():
                if len(ps) < 2:
                    raise ValueError(f"the {what} {part} split has {len(ps)} prompts; at least 2 are needed per "
                                     f"class (add prompts or raise --n-{part})")
        if self.borderline is not None and len(self.borderline) < 2:
            raise ValueError(f"the borderline (over-refusal) set has {len(self.borderline)} prompts; at least 2 are "
                             f"needed (point --borderline at a bigger file, or pass --borderline none)")


def _load_file(path: str | Path, column: str | None, what: str) -> PromptSplit:
    try:
        f = read_prompt_file(path, column)
    except ValueError as e:
        msg = str(e)
        flag = {"harmful": "--column", "harmless": "--harmless-column", "borderline": "--borderline-column"}[what]
        raise ValueError(f"{what} prompts: {msg.replace('--column', flag)}") from None
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


def _committed(name: str, part: str, n: int) -> PromptSplit:
    """Split ``part`` of a committed set: its own ``split`` field, or the ``{name}_{part}`` file (organism sets)."""
    from interp.data import load_prompts

    if name.startswith("organism_"):
        rows = load_prompts(f"{name}_{part}")
    else:
        rows = [r for r in load_prompts(name) if r.get("split") == part]
    return PromptSplit([r["instruction"] for r in rows], [r.get("category", "all") for r in rows]).head(n)


_DATA_KNOBS = ("harmful", "harmless", "column", "harmless_column", "n_train", "n_val", "n_test", "borderline",
               "borderline_column", "n_borderline")


@moved_keywords(moved(runtime=("seed",), config="DataConfig", knobs=_DATA_KNOBS))
def load_refusal_data(model: str = "organism", config: DataConfig | None = None,
                      runtime: Runtime | None = None) -> RefusalData:
    """Both classes split into train / val / test, and the over-refusal set (its first ``config.n_borderline``).

    ``config`` (:class:`DataConfig`): files, columns and split sizes. Defaults: the toy organism's synthetic sets
    when ``model`` is the toy organism, the realistic sets we wrote (``interp/data/prompts/*_realistic.jsonl``) for
    any other model. ``column`` names the harmful file's prompt field and ``harmless_column`` the harmless file's;
    each is detected from its own file when ``None`` (two files rarely share a column name, e.g. AdvBench's
    ``goal``). ``borderline`` (a file of benign look-alikes of harmful requests, all used as test prompts) defaults
    to our own borderline set for real models and to none for the toy organism; ``"none"`` leaves it out. The
    split of a file is drawn with ``runtime.seed`` (default: ``config.seed``).
    """
    c = config if config is not None else DataConfig()
    seed = runtime.seed if runtime is not None else c.seed
    harmful, harmless, column, harmless_column = c.harmful, c.harmless, c.column, c.harmless_column
    n_train, n_val, n_test, borderline = c.n_train, c.n_val, c.n_test, c.borderline
    borderline_column, n_borderline = c.borderline_column, c.n_borderline
    toy = model in TOY_MODELS
    out: dict[str, dict[str, PromptSplit]] = {}
    source = {}
    for what, path, col in (("harmful", harmful, column), ("harmless", harmless, harmless_column)):
        if path is None:
            name = f"organism_{what}" if toy else REALISTIC[what]
            out[what] = {part: _committed(name, part, n) for part, n in (("train", n_train), ("val", n_val),
                                                                       ("test", n_test))}
            source[what] = f"interp/data/prompts/{name}{'_*' if toy else ''}.jsonl"
        else:
            out[what] = split(_load_file(path, col, what), n_train, n_val, n_test, seed, what)
            source[what] = str(path)
    over = None
    if borderline is None and not toy:
        over = _committed(BORDERLINE, "test", n_borderline)
        source["borderline"] = f"interp/data/prompts/{BORDERLINE}.jsonl (test split)"
    elif borderline not in (None, "none"):
        over = _load_file(borderline, borderline_column, "borderline").head(n_borderline)
        source["borderline"] = str(borderline)
    return RefusalData(out["harmful"], out["harmless"], source, over)
