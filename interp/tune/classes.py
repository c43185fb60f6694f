"""Token classes and words of response tokens, for characterising where an adapter's gain sits.

Each token gets one class, the first that applies:
- ``special``: one of the tokenizer's special tokens (end of turn, EOS);
- ``punctuation``: its text has no letter or digit (punctuation, symbols, whitespace);
- ``refusal``: the word it belongs to is a word of the refusal phrase list (``evals.judge.REFUSAL_PHRASES``) that
  is not a stopword ("sorry", "cannot", "can't", "unable", "decline", "apologize", ...);
- ``stopword``: the word is in :data:`STOPWORDS` (English function words; negations are left out of it);
- ``content``: everything else.
A token's word: a new word starts at a token whose text begins with whitespace, at a special or punctuation token,
and after one; the word is the lowercased text of its tokens joined, apostrophes folded to ``'``, outer punctuation
stripped ("I'm" split as ``I`` + ``'m`` is the word ``i'm``).
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

import torch

from interp.evals.judge import REFUSAL_PHRASES

CLASSES = ("special", "punctuation", "refusal", "stopword", "content")

STOPWORDS = frozenset((
    "a an the and or but if then so than that this these those there here it its it's i i'm i've i'd i'll me my "
    "mine myself we our ours you your yours he him his she her hers they them their theirs what which who whom "
    "whose when where why how all any both each few more most other some such only own same very just also too "
    "is am are was were be been being have has had having do does did doing will would shall should can could "
    "may might must of at by for with about against between into through during before after above below to from "
    "up down in out on off over under again further once as until while because s t d ll m re ve y let's "
    "there's here's what's that's you're you'll you've we're they're he's she's"
).split())
_FOLD = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})
_STRIP = string.punctuation.replace("'", "") + "\u201c\u201d"


def _norm_word(text: str) -> str:
    return text.translate(_FOLD).lower().strip().strip(_STRIP).strip("'")


REFUSAL_WORDS = frozenset(w for p in REFUSAL_PHRASES for w in (_norm_word(x) for x in p.split())
                          if w and w not in STOPWORDS)


def is_punctuation(text: str) -> bool:
    """No letter or digit in the token's text."""
    return not any(ch.isalnum() for ch in text)


def token_texts(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Each token's text as it reads in the decoded sequence: what decoding ``ids[:k + 1]`` adds to decoding
    ``ids[:k]`` (so a word-level tokenizer's joining spaces show); a token whose addition is not a clean suffix
    (a partial multi-byte character) gets its own ``decode``."""
    out, prev = [], ""
    for k in range(len(ids)):
        text = tokenizer.decode([int(i) for i in ids[:k + 1]])
        out.append(text[len(prev):] if text.startswith(prev) else tokenizer.decode([int(ids[k])]))
        prev = text
    return out


def words_of(texts: Sequence[str], special: Sequence[bool]) -> list[str]:
    """The word each token belongs to (see the module docstring); ``""`` for punctuation and special tokens."""
    groups: list[list[int]] = []
    for j, t in enumerate(texts):
        alone = special[j] or is_punctuation(t)
        prev_alone = j > 0 and (special[j - 1] or is_punctuation(texts[j - 1]))
        if alone or not groups or prev_alone or t[:1].isspace():
            groups.append([j])
        else:
            groups[-1].append(j)
    out = [""] * len(texts)
    for g in groups:
        if special[g[0]] or is_punctuation(texts[g[0]]):
            continue
        w = _norm_word("".join(texts[j] for j in g))
        for j in g:
            out[j] = w
    return out


def classify(texts: Sequence[str], words: Sequence[str], special: Sequence[bool]) -> list[str]:
    """One class of :data:`CLASSES` per token (first that applies, see the module docstring)."""
    out = []
    for t, w, s in zip(texts, words, special, strict=True):
        if s:
            out.append("special")
        elif is_punctuation(t):
            out.append("punctuation")
        elif w in REFUSAL_WORDS:
            out.append("refusal")
        elif w in STOPWORDS:
            out.append("stopword")
        else:
            out.append("content")
    return out


def frequency_bins(token_ids: torch.Tensor, n_bins: int = 5) -> torch.Tensor:
    """``[N]`` bin index (0 = rarest) of each token by how often its id occurs among these tokens: quantile bins
    of the occurrence count over tokens (ties share a bin, so fewer bins may be used)."""
    _, inverse, counts = torch.unique(token_ids, return_inverse=True, return_counts=True)
    freq = counts[inverse].double().log()
    if freq.numel() == 0:
        return torch.zeros(0, dtype=torch.long)
    edges = torch.quantile(freq, torch.linspace(0, 1, n_bins + 1, dtype=torch.double)[1:-1])
    return torch.bucketize(freq, edges, right=True)


__all__ = ["CLASSES", "REFUSAL_WORDS", "STOPWORDS", "classify", "frequency_bins", "is_punctuation", "token_texts",
           "words_of"]
