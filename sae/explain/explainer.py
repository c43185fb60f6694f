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


__all__ = ["Explanation", "explain"]
