"""Data of the value and partisan studies: the dilemmas and statements we wrote (``data/values/*.jsonl``), and the
two views the study needs of them: contrastive prompts (one per option, labelled by pole) and forced-choice
probe items ("... Answer A or B.", the pole's letter alternating so half the items put it on each letter).

    dilemmas = load_dilemmas()                               # 81 liberty-vs-welfare dilemmas, English and French
    fit, calib, test = split_groups([d.id for d in dilemmas], (0.5, 0.2, 0.3))
    pairs = dilemma_contrast([d for d in dilemmas if d.id in fit], "en")
    items = dilemma_items([d for d in dilemmas if d.id in test], "fr")
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

LANGS = ("en", "fr")
# per language: how an option is endorsed in a contrastive prompt, the forced-choice question, the answer cue that
# ends a plain (no chat template) prompt
TEMPLATES = {
    "en": {"endorse": "{situation}\nMy choice: {option}", "question": "Which option do you choose? Answer {a} or {b}.",
           "cue": "Answer:", "agree": "Which statement do you agree with more? Answer {a} or {b}."},
    "fr": {"endorse": "{situation}\nMon choix : {option}",
           "question": "Quelle option choisissez-vous ? Répondez {a} ou {b}.", "cue": "Réponse :",
           "agree": "Avec quelle affirmation êtes-vous le plus d'accord ? Répondez {a} ou {b}."},
}


@dataclass(frozen=True)
class Dilemma:
    """A situation with two options, one per pole of ``dimension``; ``text[lang]`` holds situation and options."""

    id: str
    dimension: str
    poles: tuple[str, str]
    text: dict[str, dict[str, str]] = field(repr=False)

    def option(self, lang: str, pole: str) -> str:
        return _lang(self.text, lang, self.id)[pole]

    def situation(self, lang: str) -> str:
        return _lang(self.text, lang, self.id)["situation"]


@dataclass(frozen=True)
class Statement:
    """A platform-style political position, labelled with the party (``"D"`` / ``"R"``) whose platform it follows."""

    id: str
    topic: str
    pair: int
    party: str
    text: str


@dataclass
class Contrast:
    """Contrastive prompts: ``positive[i]`` endorses the pole, ``negative[i]`` the other side, ``groups[i]`` the
    item both come from (held-out folds never split a group)."""

    positive: list[str]
    negative: list[str]
    groups: list[str]
    pole: str = "pole"

    def __post_init__(self) -> None:
        if len(self.positive) != len(self.negative):
            raise ValueError(f"contrastive pairs need as many pole prompts as other-side prompts, got "
                             f"{len(self.positive)} and {len(self.negative)}; give one of each per item")
        if len(self.groups) != len(self.positive):
            raise ValueError(f"{len(self.groups)} groups for {len(self.positive)} pairs; give one group per pair")
        if len(self.positive) < 4:
            raise ValueError(f"need at least 4 contrastive pairs to fit and hold out, got {len(self.positive)}")

    @property
    def prompts(self) -> list[str]:
        return self.positive + self.negative

    @property
    def labels(self) -> list[int]:
        return [1] * len(self.positive) + [0] * len(self.negative)

    @property
    def all_groups(self) -> list[str]:
        return self.groups + self.groups


@dataclass(frozen=True)
class ChoiceItem:
    """One forced-choice probe: ``text`` lists the options under ``letters`` and asks for one; the pole's option
    is under ``letters[pole_index]``. ``cue`` ends the prompt when there is no chat template ("Answer:")."""

    id: str
    group: str
    text: str
    pole_index: int
    letters: tuple[str, str] = ("A", "B")
    cue: str = "Answer:"

    def prompt(self, chat: bool) -> str:
        return self.text if chat else f"{self.text}\n{self.cue}"


def _lang(text: dict[str, Any], lang: str, what: str) -> Any:
    if lang not in text:
        raise ValueError(f"{what} has no {lang!r} text; languages present: {sorted(text)}")
    return text[lang]


def _read_jsonl(name: str) -> list[dict[str, Any]]:
    ref = resources.files("interp.studies.directions").joinpath("data", "values", name)
    return [json.loads(line) for line in ref.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_dilemmas() -> list[Dilemma]:
    """The liberty-vs-collective-welfare dilemmas we wrote (English, and our French translation)."""
    return [Dilemma(r["id"], r["dimension"], tuple(r["poles"]), {k: r[k] for k in LANGS if k in r})
            for r in _read_jsonl("dilemmas.jsonl")]


def load_statements() -> list[Statement]:
    """The party-labelled platform-style statements we wrote: 12 topics x 4 positions x 2 parties."""
    return [Statement(r["id"], r["topic"], int(r["pair"]), r["party"], r["text"]) for r in _read_jsonl("partisan.jsonl")]


def split_groups(groups: Sequence[str], fractions: Sequence[float] = (0.5, 0.2, 0.3), seed: int = 0
                 ) -> list[list[str]]:
    """The distinct ``groups`` shuffled with ``seed`` and cut into consecutive parts of these ``fractions``
    (fit / calibration / test by default); every part gets at least one group."""
    uniq = sorted(set(groups))
    if any(f <= 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise ValueError(f"fractions must be positive and sum to 1, got {tuple(fractions)}")
    if len(uniq) < len(fractions):
        raise ValueError(f"{len(uniq)} groups cannot fill {len(fractions)} parts")
    random.Random(seed).shuffle(uniq)
    cuts, acc = [0], 0.0
    for f in fractions[:-1]:
        acc += f
        cuts.append(min(max(round(acc * len(uniq)), cuts[-1] + 1), len(uniq) - (len(fractions) - len(cuts))))
    cuts.append(len(uniq))
    return [uniq[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def dilemma_contrast(dilemmas: Sequence[Dilemma], lang: str = "en", pole: str | None = None) -> Contrast:
    """Per dilemma, the situation with the ``pole`` option endorsed (positive) and with the other (negative)."""
    if not dilemmas:
        raise ValueError("no dilemmas given")
    pole = pole or dilemmas[0].poles[0]
    tpl = TEMPLATES[_check_lang(lang)]["endorse"]
    pos, neg = [], []
    for d in dilemmas:
        other = _other(d, pole)
        pos.append(tpl.format(situation=d.situation(lang), option=d.option(lang, pole)))
        neg.append(tpl.format(situation=d.situation(lang), option=d.option(lang, other)))
    return Contrast(pos, neg, [d.id for d in dilemmas], pole)


def dilemma_items(dilemmas: Sequence[Dilemma], lang: str = "en", pole: str | None = None,
                  letters: tuple[str, str] = ("A", "B")) -> list[ChoiceItem]:
    """Forced-choice items; item ``i`` puts the ``pole`` option under ``letters[i % 2]`` (balanced letters)."""
    if not dilemmas:
        raise ValueError("no dilemmas given")
    pole = pole or dilemmas[0].poles[0]
    t = TEMPLATES[_check_lang(lang)]
    out = []
    for i, d in enumerate(dilemmas):
        opts = [d.option(lang, pole), d.option(lang, _other(d, pole))]
        k = i % 2
        if k:
            opts.reverse()
        text = (f"{d.situation(lang)}\n{letters[0]}: {opts[0]}\n{letters[1]}: {opts[1]}\n"
                f"{t['question'].format(a=letters[0], b=letters[1])}")
        out.append(ChoiceItem(f"{d.id}-{lang}", d.id, text, k, tuple(letters), t["cue"]))
    return out


def statement_contrast(statements: Sequence[Statement], pole: str = "D") -> Contrast:
    """The ``pole`` party's statement (positive) against the other party's on the same position, per pair."""
    by = _by_pair(statements)
    keys = [k for k in sorted(by) if len(by[k]) == 2]
    if len(keys) != len(by):
        raise ValueError("every (topic, pair) needs one statement of each party")
    pos = [by[k][pole].text for k in keys]
    neg = [next(s.text for p, s in by[k].items() if p != pole) for k in keys]
    return Contrast(pos, neg, [k[0] for k in keys], pole)


def statement_items(statements: Sequence[Statement], pole: str = "D",
                    letters: tuple[str, str] = ("A", "B")) -> list[ChoiceItem]:
    """Forced-choice items within each topic: every ``pole`` statement against every other-party statement of the
    same topic (so topics held out of the fit stay held out); the pole's letter alternates."""
    t = TEMPLATES["en"]
    topics = sorted({s.topic for s in statements})
    out: list[ChoiceItem] = []
    for topic in topics:
        mine = [s for s in statements if s.topic == topic and s.party == pole]
        theirs = [s for s in statements if s.topic == topic and s.party != pole]
        for a in mine:
            for b in theirs:
                k = len(out) % 2
                opts = [b.text, a.text] if k else [a.text, b.text]
                text = (f"{letters[0]}: {opts[0]}\n{letters[1]}: {opts[1]}\n"
                        f"{t['agree'].format(a=letters[0], b=letters[1])}")
                out.append(ChoiceItem(f"{a.id}~{b.id}", topic, text, k, tuple(letters), t["cue"]))
    if not out:
        raise ValueError(f"no statement of party {pole!r} faces another party's statement on one topic")
    return out


def _by_pair(statements: Sequence[Statement]) -> dict[tuple[str, int], dict[str, Statement]]:
    by: dict[tuple[str, int], dict[str, Statement]] = {}
    for s in statements:
        by.setdefault((s.topic, s.pair), {})[s.party] = s
    return by


def _other(d: Dilemma, pole: str) -> str:
    if pole not in d.poles:
        raise ValueError(f"pole {pole!r} is not one of dilemma {d.id}'s poles {d.poles}")
    return d.poles[1] if pole == d.poles[0] else d.poles[0]


def _check_lang(lang: str) -> str:
    if lang not in TEMPLATES:
        raise ValueError(f"language {lang!r} has no templates; choose one of {sorted(TEMPLATES)}")
    return lang


__all__ = ["ChoiceItem", "Contrast", "Dilemma", "Statement", "dilemma_contrast", "dilemma_items", "load_dilemmas",
           "load_statements", "split_groups", "statement_contrast", "statement_items"]
