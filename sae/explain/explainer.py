"""The explainer: one line describing a latent, written by a chat client from the latent's top-activating
contexts (tokens marked by activation) and random non-activating ones (:func:`sae.explain.prompts.explainer_messages`)."""

from __future__ import annotations

from dataclasses import dataclass

from sae.explain.client import ChatClient
from sae.explain.examples import ExplainConfig, LatentExamples
from sae.explain.prompts import explainer_messages, parse_explanation, token_key


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
    answer = client.complete(explainer_messages(ex.explain, ex.explain_random, cfg.threshold, cfg.few_shot,
                                                cfg.show_activations))
    text, found = parse_explanation(answer)
    return Explanation(ex.latent, text, found, answer, getattr(client, "name", type(client).__name__))


def reference_tokens(ex: LatentExamples, k: int = 3) -> list[str]:
    """The ``k`` most frequent peak tokens of the explainer's top contexts (``ex.explain``; never the scorers'
    held-out ones), stripped (ties: the stronger context first). A peak on the first bytes of a split character
    (an empty piece) counts as the token that completes it, the one a reader sees marked."""
    if not ex.explain:
        raise ValueError(f"latent {ex.latent} has no top contexts to take tokens from")
    counts: dict[str, int] = {}
    for c in ex.explain:  # strongest context first: dict order breaks ties
        at = next((i for i in range(c.peak, len(c.tokens)) if c.tokens[i] != ""), c.peak)
        t = token_key(c.tokens[at])
        counts[t] = counts.get(t, 0) + 1
    return sorted(counts, key=lambda t: -counts[t])[:k]


def reference_explanation(ex: LatentExamples, k: int = 3) -> str:
    """A non-LM reference explanation, :func:`reference_tokens` as ``the tokens 'x', 'y', 'z'`` (whitespace
    tokens by their ``repr``). It tells whether a scorer can use an informative explanation at all."""
    return "the tokens " + ", ".join(f"'{t}'" if t.strip() else repr(t) for t in reference_tokens(ex, k))


__all__ = ["Explanation", "explain", "reference_explanation", "reference_tokens"]
