"""The explainer: one line describing a latent, written by a chat client from the latent's top-activating
contexts (tokens marked by activation) and random non-activating ones (:func:`sae.explain.prompts.explainer_messages`)."""

from __future__ import annotations

from dataclasses import dataclass

from sae.explain.client import ChatClient
from sae.explain.examples import ExplainConfig, LatentExamples
from sae.explain.prompts import explainer_messages, parse_explanation


@dataclass
class Explanation:
    """A latent's ``text`` (one line), whether the answer held the ``[EXPLANATION]:`` tag (``found``; else its last
    line was taken), the raw ``answer`` and the ``explainer`` client's name."""

    latent: int
    text: str
    found: bool
    answer: str
    explainer: str


def explain(client: ChatClient, ex: LatentExamples, cfg: ExplainConfig | None = None) -> Explanation:
    """Ask ``client`` for a one-line explanation of ``ex.latent`` from ``ex.explain`` (marked above
    ``cfg.threshold`` of each context's peak) and ``ex.explain_random`` (unmarked)."""
    cfg = cfg or ExplainConfig()
    answer = client.complete(explainer_messages(ex.explain, ex.explain_random, cfg.threshold, cfg.few_shot))
    text, found = parse_explanation(answer)
    return Explanation(ex.latent, text, found, answer, getattr(client, "name", type(client).__name__))


def reference_explanation(ex: LatentExamples, k: int = 3) -> str:
    """A non-LM reference explanation: the ``k`` most frequent peak tokens of the explainer's top contexts
    (``ex.explain``; never the scorers' held-out ones), as ``the tokens 'x', 'y', 'z'`` (ties: the stronger
    context first). It tells whether a scorer can use an informative explanation at all."""
    if not ex.explain:
        raise ValueError(f"latent {ex.latent} has no top contexts to take tokens from")
    counts: dict[str, int] = {}
    for c in ex.explain:  # strongest context first: dict order breaks ties
        t = c.tokens[c.peak].strip() or repr(c.tokens[c.peak])
        counts[t] = counts.get(t, 0) + 1
    top = sorted(counts, key=lambda t: -counts[t])[:k]
    return "the tokens " + ", ".join(f"'{t}'" for t in top)


__all__ = ["Explanation", "explain", "reference_explanation"]
