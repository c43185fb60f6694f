"""The entrainment prompt set and its present / absent pairs.

Each item is a question with a one-token answer (``"The capital of France is"`` -> ``" Paris"``) and one distracting
context sentence per kind (:data:`KINDS`), each holding a tracked word. A pair puts the item's context before its
question (the word *present*) or another item's context of the same kind (the word *absent*), so the gain of the
word's logit is measured against the same form of context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from interp.models import Model
from interp.prompts import read_rows

KINDS = ("random", "irrelevant", "counterfactual", "factual")
DEFAULT_PATH = Path(__file__).resolve().parents[2] / "data" / "prompts" / "entrainment.jsonl"


@dataclass
class EntrainmentSet:
    """``questions [n]``, ``answers [n]`` (words; the first token of ``" " + word`` is scored), and per kind the
    ``contexts[kind] [n]`` sentences and their tracked ``words[kind] [n]``."""

    ids: list[str]
    questions: list[str]
    answers: list[str]
    contexts: dict[str, list[str]]
    words: dict[str, list[str]]

    def __len__(self) -> int:
        return len(self.ids)

    def subset(self, n: int | None) -> EntrainmentSet:
        """The first ``n`` items (all with ``None``)."""
        if n is None:
            return self
        if n < 2:
            raise ValueError(f"an entrainment set needs at least 2 items (absent contexts come from others), got n={n}")
        return EntrainmentSet(self.ids[:n], self.questions[:n], self.answers[:n],
                              {k: v[:n] for k, v in self.contexts.items()}, {k: v[:n] for k, v in self.words.items()})


def from_rows(rows: list[Any], where: str = "rows") -> EntrainmentSet:
    """An :class:`EntrainmentSet` from dict rows ``{id, question, answer, <kind>: {context, word}}``."""
    need = {"id", "question", "answer", *KINDS}
    bad = [i for i, r in enumerate(rows) if not isinstance(r, dict) or not need <= r.keys()
           or not all(isinstance(r[k], dict) and {"context", "word"} <= r[k].keys() for k in KINDS)]
    if bad or len(rows) < 2:
        raise ValueError(f"{where}: an entrainment set needs >= 2 rows with {sorted(need)}, each kind a "
                         f"{{'context', 'word'}} object; rows {bad[:5]} are not")
    return EntrainmentSet([str(r["id"]) for r in rows], [r["question"] for r in rows], [r["answer"] for r in rows],
                          {k: [r[k]["context"] for r in rows] for k in KINDS},
                          {k: [r[k]["word"] for r in rows] for k in KINDS})


def load_entrainment(path: str | Path | None = None, n: int | None = None) -> EntrainmentSet:
    """Our prompt set (``interp/data/prompts/entrainment.jsonl``, 68 items) or another file of the same rows."""
    p = Path(path) if path is not None else DEFAULT_PATH
    return from_rows(read_rows(p), str(p)).subset(n)


def first_token(model: Model, word: str) -> int:
    """The id of the first token of ``" " + word`` (the word as it follows a space in a sentence)."""
    ids = model.tokenizer.encode(" " + word, add_special_tokens=False)
    if not ids:
        raise ValueError(f"{word!r} encodes to no tokens")
    return int(ids[0])


@dataclass
class ContextPairs:
    """One kind's pairs: ``present`` / ``absent`` prompts ``[m]``, the tracked ``token [m]`` and the item's
    ``answer [m]`` token, ``items [m]`` (indices into the set; items whose word is unknown to the tokenizer or
    found in every other context are left out)."""

    kind: str
    present: list[str]
    absent: list[str]
    token: torch.Tensor
    answer: torch.Tensor
    items: list[int] = field(default_factory=list)


def prompt(context: str, question: str) -> str:
    return f"{context} {question}"


def make_pairs(model: Model, data: EntrainmentSet, kind: str) -> ContextPairs:
    """Present / absent prompts of ``kind``: the absent context is the next item's (cyclically) whose tokens do not
    hold the tracked token."""
    if kind not in KINDS:
        raise ValueError(f"unknown context kind {kind!r}; choose from {KINDS}")
    tok = model.tokenizer
    unk = getattr(tok, "unk_token_id", None)
    n, out = len(data), ([], [], [], [], [])
    for i in range(n):
        t = first_token(model, data.words[kind][i])
        if t == unk:
            continue
        for step in range(1, n):
            j = (i + step) % n
            absent = prompt(data.contexts[kind][j], data.questions[i])
            if t not in tok.encode(absent, add_special_tokens=False):
                break
        else:
            continue
        for lst, v in zip(out, (prompt(data.contexts[kind][i], data.questions[i]), absent, t,
                                first_token(model, data.answers[i]), i), strict=True):
            lst.append(v)
    if len(out[0]) < 2:
        raise ValueError(f"only {len(out[0])} usable {kind} pairs for {model.name}: the tracked words are unknown to "
                         f"its tokenizer or appear in every other context; use words of its vocabulary")
    return ContextPairs(kind, out[0], out[1], torch.tensor(out[2]), torch.tensor(out[3]), out[4])


__all__ = ["DEFAULT_PATH", "EntrainmentSet", "KINDS", "ContextPairs", "first_token", "from_rows", "load_entrainment",
           "make_pairs", "prompt"]
