"""The messages of the explainer and the two scorers, and the parsers of their answers.

The format follows delphi's definitions (written here in our own words): marked tokens sit between ``<<`` and
``>>`` (a run of consecutive marked tokens inside one pair), examples are numbered lines ``Example i: ...``, the
explainer ends with ``[EXPLANATION]: ...``, and a scorer answers with a Python list of 1s and 0s, one per example
shown, in order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from sae.contexts import Context

OPEN, CLOSE = "<<", ">>"
EXPLANATION_TAG = "[EXPLANATION]:"
VERDICT_OPTIONS = ("1", "0")  # the constrained verdicts' answers, read after the cue that opens the answer's list
ANSWER_CUE = "["

EXPLAINER_SYSTEM = (
    "You study one feature of a language model's internals. You are shown text examples where the feature is "
    f"active; the tokens where it is strongest are marked between {OPEN} and {CLOSE}. You may also be shown "
    "examples where it is not active at all. Find what the marked tokens have in common (the words themselves, "
    "their meaning, or the context just before them) and what sets them apart from the inactive examples.\n"
    "Keep the explanation short: one line, a specific description, no list of alternatives.\n"
    f"The last line of your answer must be {EXPLANATION_TAG} followed by the explanation.")
EXPLAINER_SHOT = (
    "Examples where the feature is active:\n"
    f"Example 1: she walked slow{OPEN}ly{CLOSE} to the door\n"
    f"Example 2: he answered quick{OPEN}ly{CLOSE} and left\n"
    f"Example 3: the water rose steadi{OPEN}ly{CLOSE} all night\n"
    "Examples where the feature is not active:\n"
    "Example 1: the cat sat on the mat\n",
    f"{EXPLANATION_TAG} the suffix \"ly\" that ends an adverb of manner")

ACTIVATIONS_NOTE = (
    "\nUnder each active example, a line lists its marked tokens with how strongly the feature fires on each, "
    "from 0 (weak) to 9 (strongest).")
EXPLAINER_SHOT_ACTIVATIONS = (
    "Examples where the feature is active:\n"
    f"Example 1: she walked slow{OPEN}ly{CLOSE} to the door\n"
    "Marked tokens: 'ly' (9)\n"
    f"Example 2: he answered quick{OPEN}ly{CLOSE} and left\n"
    "Marked tokens: 'ly' (7)\n"
    "Examples where the feature is not active:\n"
    "Example 1: the cat sat on the mat\n",
    EXPLAINER_SHOT[1])

DETECTION_SYSTEM = (
    "You are a careful linguist. You are given an explanation of a feature of text, such as \"words about the "
    "weather\" or \"a verb right after a pronoun\", then several numbered text examples. Decide, for each example "
    "in order, whether the feature described is present in it.\n"
    "Answer with a Python list with one entry per example: 1 if the example contains the feature, 0 if it does "
    "not. Answer with the list only.")
DETECTION_SHOT = (
    "Feature explanation: words about the weather.\n\nTest examples:\n\n"
    "Example 0: we stayed in because of the rain\n"
    "Example 1: please pass me the salt\n"
    "Example 2: a cold wind blew from the north\n",
    "[1, 0, 1]")

FUZZING_SYSTEM = (
    "You are a careful linguist. You are given an explanation of a feature of text, then several numbered text "
    f"examples in which some tokens are marked between {OPEN} and {CLOSE}. Some examples are marked correctly, "
    "others are marked at the wrong tokens: all, none or some may be correct. An example is correct only if "
    "every marked token fits the explanation.\n"
    "Answer with a Python list with one entry per example: 1 if its marks are correct, 0 if not. Answer with "
    "the list only.")
FUZZING_SHOT = (
    "Feature explanation: words about the weather.\n\nTest examples:\n\n"
    f"Example 0: we stayed in because of the {OPEN}rain{CLOSE}\n"
    f"Example 1: please {OPEN}pass{CLOSE} me the salt\n"
    f"Example 2: a cold {OPEN}wind{CLOSE} blew from the north\n",
    "[1, 0, 1]")


def _clean(token: str) -> str:
    return token.replace("\r", "\\r").replace("\n", "\\n")


def token_key(piece: str) -> str:
    """A token's text as explanations name it and the lexical baseline matches it: stripped, unless it is only
    whitespace."""
    return piece.strip() or piece


def carried_marks(tokens: Sequence[str], marked: Sequence[bool]) -> list[bool]:
    """``marked`` with the mark of each empty token (the first bytes of a character that a later token completes,
    :func:`sae.contexts.pieces`) passed on to the next token: the tokens a reader sees marked."""
    if len(tokens) != len(marked):
        raise ValueError(f"{len(tokens)} tokens but {len(marked)} marks")
    marked = [bool(m) for m in marked]
    for i in range(len(tokens) - 1):
        if tokens[i] == "" and marked[i]:
            marked[i + 1] = True
    return marked


def mark(tokens: Sequence[str], marked: Sequence[bool]) -> str:
    """The text of ``tokens`` with each run of marked tokens between ``<<`` and ``>>`` (newlines shown as ``\\n``,
    so one context stays one line). An empty token (the first bytes of a character that a later token completes,
    :func:`sae.contexts.pieces`) passes its mark on to the next token (:func:`carried_marks`)."""
    marked = carried_marks(tokens, marked)
    out, inside = [], False
    for t, m in ((t, m) for t, m in zip(tokens, marked) if t != ""):
        if m and not inside:
            out.append(OPEN)
        elif inside and not m:
            out.append(CLOSE)
        inside = bool(m)
        out.append(_clean(t))
    return "".join(out) + (CLOSE if inside else "")


def plain(c: Context) -> str:
    """A context's text with no marks."""
    return "".join(_clean(t) for t in c.tokens)


def explainer_marks(c: Context, threshold: float) -> list[bool]:
    """Tokens the explainer sees marked: activation above ``threshold`` times the context's peak (and > 0)."""
    top = max(c.acts, default=0.0)
    return [a > 0 and a > threshold * top for a in c.acts]


def _numbered(texts: Sequence[str], start: int) -> str:
    return "".join(f"Example {i + start}: {t}\n" for i, t in enumerate(texts))


def _chat(system: str, shot: tuple[str, str] | None, user: str) -> list[dict[str, str]]:
    turns = [{"role": "user", "content": shot[0]}, {"role": "assistant", "content": shot[1]}] if shot else []
    return [{"role": "system", "content": system}, *turns, {"role": "user", "content": user}]


def activation_line(c: Context, marked: Sequence[bool], scale: float) -> str:
    """``Marked tokens: 'x' (9), 'y' (4)``: a context's marked tokens (empty pieces' marks carried to the token
    that completes them) with the activation on a 0-9 scale of ``scale`` (the largest activation shown for the
    latent), as delphi's explainer can show them."""
    seen = carried_marks(c.tokens, marked)
    acts = list(c.acts)
    for i in range(len(acts) - 1):  # the first bytes of a character pass their activation on with their mark
        if c.tokens[i] == "" and marked[i]:
            acts[i + 1] = max(acts[i + 1], acts[i])
    items = [f"'{token_key(_clean(t))}' ({min(9, round(9 * a / scale)) if scale > 0 else 0})"
             for t, a, on in zip(c.tokens, acts, seen) if on and t != ""]
    return "Marked tokens: " + ", ".join(items)


def explainer_messages(active: Sequence[Context], quiet: Sequence[Context], threshold: float = 0.3,
                       few_shot: bool = True, show_activations: bool = False) -> list[dict[str, str]]:
    """The explainer's messages: the activating contexts marked (:func:`explainer_marks`), then the
    non-activating ones unmarked, numbered from 1 (after one worked example when ``few_shot``).
    ``show_activations``: under each activating example, its marked tokens with their activation on a 0-9 scale
    (:func:`activation_line`)."""
    if not active:
        raise ValueError("no activating contexts to explain: the latent never fired on these prompts")
    lines = []
    scale = max((max(c.acts, default=0.0) for c in active), default=0.0)
    for i, c in enumerate(active, 1):
        m = explainer_marks(c, threshold)
        lines.append(f"Example {i}: {mark(c.tokens, m)}\n")
        if show_activations:
            lines.append(activation_line(c, m, scale) + "\n")
    user = "Examples where the feature is active:\n" + "".join(lines)
    if quiet:
        user += "Examples where the feature is not active:\n" + _numbered([plain(c) for c in quiet], 1)
    system = EXPLAINER_SYSTEM + (ACTIVATIONS_NOTE if show_activations else "")
    shot = (EXPLAINER_SHOT_ACTIVATIONS if show_activations else EXPLAINER_SHOT) if few_shot else None
    return _chat(system, shot, user)


def scorer_messages(kind: str, explanation: str, texts: Sequence[str], few_shot: bool = True
                    ) -> list[dict[str, str]]:
    """A detection (``texts`` unmarked) or fuzzing (``texts`` marked) prompt: the explanation, then the
    examples numbered from 0 (after one worked example when ``few_shot``)."""
    system, shot = {"detection": (DETECTION_SYSTEM, DETECTION_SHOT), "fuzzing": (FUZZING_SYSTEM, FUZZING_SHOT)}[kind]
    user = f"Feature explanation: {explanation.strip()}\n\nTest examples:\n\n" + _numbered(texts, 0)
    return _chat(system, shot if few_shot else None, user)


def parse_explanation(answer: str) -> tuple[str, bool]:
    """``(explanation, found)``: the text after the last ``[EXPLANATION]:``, else the last non-empty line
    (``found=False``); one line, at most 300 characters."""
    at = answer.rfind(EXPLANATION_TAG)
    if at >= 0:
        text, found = answer[at + len(EXPLANATION_TAG):], True
    else:
        lines = [ln for ln in answer.splitlines() if ln.strip()]
        text, found = (lines[-1] if lines else ""), False
    text = " ".join(text.split())
    return text[:300], found and bool(text)


def parse_verdicts(answer: str, n: int) -> list[int] | None:
    """The first bracketed list of ``n`` zeros and ones in ``answer`` (delphi's rule), else ``None``. One
    example shown (``n == 1``): an answer that starts with a bare ``0`` or ``1`` counts too (our one leniency,
    for small models that drop the brackets)."""
    m = re.search(r"\[[^\[\]]*\]", answer)
    if m is None:
        bare = re.match(r"\s*([01])(?![0-9.])", answer) if n == 1 else None
        return [int(bare.group(1))] if bare else None
    try:
        got = json.loads(m.group(0))
    except ValueError:
        return None
    if not isinstance(got, list) or len(got) != n or any(x not in (0, 1) or isinstance(x, float) for x in got):
        return None
    return [int(x) for x in got]


__all__ = ["ANSWER_CUE", "CLOSE", "activation_line", "carried_marks", "token_key", "EXPLANATION_TAG", "VERDICT_OPTIONS", "OPEN", "explainer_marks", "explainer_messages", "mark", "parse_explanation",
           "parse_verdicts", "plain", "scorer_messages"]
