"""Explanations of SAE latents with scores, after delphi's definitions.

``explain_latents(model, sae, latents, prompts, explainer)`` writes a one-line explanation of each latent from its
top-activating and random non-activating contexts, then scores it by detection and fuzzing, each beside the same
scorer given a shuffled explanation (another latent's) as the control; the result (:class:`LatentExplanations`)
has ``.summary()``, ``.to_frame()``, ``.plot()`` and saves / loads. Clients: :class:`LocalChatClient` (a local HF
chat model through ``steering.generate``, passed in) and :class:`HTTPChatClient` (an OpenAI-compatible endpoint).

Scorer verdicts (``ExplainConfig.verdicts``): ``"text"`` (default; delphi's: the answer's list of 0/1 is parsed,
any chat client) or ``"logprob"`` (constrained: the scorer model's log p("1") vs log p("0") after the answer cue,
read by the client's ``option_logprobs``; every example answered, margins and AUROC recorded). Small models write
off-format answers, so their scores need ``"logprob"``; text stays the default because any endpoint can serve it.
The no-model baselines: :func:`reference_explanation` (the top contexts' peak tokens as an explanation, scored like
any other) and :func:`lexical_score` (those tokens matched literally in the same examples: the ceiling for it).
"""

from sae.explain.client import ChatClient, ChatClientError, HTTPChatClient, LocalChatClient
from sae.explain.examples import ExplainConfig, LatentExamples, latent_examples
from sae.explain.explainer import Explanation, explain, reference_explanation, reference_tokens
from sae.explain.result import LatentExplanations
from sae.explain.run import explain_latents, shuffled_assignment
from sae.explain.scorers import Verdicts, lexical_score, score, verdict_metrics

__all__ = ["ChatClient", "ChatClientError", "ExplainConfig", "Explanation", "HTTPChatClient", "LatentExamples",
           "LatentExplanations", "LocalChatClient", "Verdicts", "explain", "explain_latents", "latent_examples",
           "lexical_score", "reference_explanation", "reference_tokens", "score", "shuffled_assignment",
           "verdict_metrics"]
