"""The contexts a latent is explained and scored on: activating windows (one per prompt, at its peak) and random
non-activating windows, split into an explaining set and a held-out test set, as delphi does (the explainer sees
the top contexts; the scorers see other activating contexts drawn at random, and other non-activating ones)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from sae.contexts import Context, window_context

VERDICT_MODES = ("text", "logprob")
TEST_FROM = ("random", "quantiles", "top")


@dataclass(frozen=True)
class ExplainConfig:
    """What the explainer and the scorers are shown.

    ``n_explain`` top activating and ``n_explain_random`` non-activating contexts go to the explainer;
    ``n_test`` other activating (drawn at random below the top) and ``n_test_random`` other non-activating
    contexts go to each scorer, ``n_shown`` per prompt. ``window = (tokens before, tokens after)`` the peak.
    ``threshold``: the explainer marks tokens above ``threshold * `` the context's peak (delphi: 0.3); the fuzzing
    scorer marks every active token. ``few_shot``: each prompt carries one worked example as a prior user /
    assistant turn (delphi's habit; a small model may copy it, so it can be turned off).

    ``verdicts``: how a scorer's answer becomes verdicts. ``"text"`` (the default, delphi's): the client writes
    its answer and the first list of 0/1 in it is read (an off-format answer leaves its examples unanswered); any
    chat client does this. ``"logprob"``: no text is generated; the client's log-probabilities of ``"1"`` and
    ``"0"`` as the next token after the prompt and the answer cue ``"["`` are read, the verdict is the likelier
    one and the margin ``log p(1) - log p(0)`` is kept (AUROC); every example is answered. It needs a client
    with ``option_logprobs`` and one example per prompt (``n_shown=1``).

    ``test_from``: which of the activating contexts below the explaining set the scorers get. ``"random"`` (the
    default): drawn uniformly, so they follow the population, mostly weak activations. ``"quantiles"`` (delphi's
    test sampling): those contexts ranked by peak activation and cut into ``n_test`` bins of equal count, one
    drawn from each, so every activation level is represented once. ``"top"``: the ``n_test`` strongest after the
    explaining set (what an explanation of the top contexts describes best).

    ``show_activations``: under each of the explainer's activating examples, its marked tokens with their
    activation on a 0-9 scale of the largest shown (delphi's explainer option; off by default)."""

    n_explain: int = 10
    n_explain_random: int = 5
    n_test: int = 5
    n_test_random: int = 5
    n_shown: int = 5
    window: tuple[int, int] = (12, 4)
    threshold: float = 0.3
    few_shot: bool = True
    seed: int = 0
    batch_size: int = 8
    verdicts: str = "text"
    test_from: str = "random"
    show_activations: bool = False

    def __post_init__(self) -> None:
        if self.verdicts not in VERDICT_MODES:
            raise ValueError(f"ExplainConfig.verdicts must be one of {VERDICT_MODES}, got {self.verdicts!r}")
        if self.test_from not in TEST_FROM:
            raise ValueError(f"ExplainConfig.test_from must be one of {TEST_FROM}, got {self.test_from!r}")
        if self.verdicts == "logprob" and self.n_shown != 1:
            raise ValueError(f"ExplainConfig(verdicts='logprob') reads one verdict per prompt; set n_shown=1 (got "
                             f"{self.n_shown})")
        for name in ("n_explain", "n_test", "n_test_random", "n_shown"):
            if getattr(self, name) < 1:
                raise ValueError(f"ExplainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_explain_random < 0 or not 0 <= self.threshold < 1:
            raise ValueError("n_explain_random must be >= 0 and threshold in [0, 1)")
        if len(self.window) != 2 or min(self.window) < 0:
            raise ValueError(f"window must be (tokens before, tokens after) >= 0, got {self.window!r}")
        object.__setattr__(self, "window", tuple(int(w) for w in self.window))


@dataclass
class LatentExamples:
    """One latent's contexts: ``explain`` / ``explain_random`` for the explainer, ``test`` / ``test_random``
    held out for the scorers (activating / not). ``n_active_prompts``: prompts where the latent fired at all."""

    latent: int
    explain: list[Context]
    explain_random: list[Context]
    test: list[Context]
    test_random: list[Context]
    n_active_prompts: int = 0
    notes: list[str] = field(default_factory=list)


def _quiet_positions(acts: torch.Tensor, cfg: ExplainConfig) -> list[int]:
    """Positions whose whole window has the latent at zero (``acts [T]``)."""
    before, after = cfg.window
    on = torch.cat([torch.zeros(1), (acts > 0).float().cumsum(0)])
    T = acts.numel()
    return [p for p in range(T) if on[min(T, p + after + 1)] == on[max(0, p - before)]]


def _held_out(rest: list[Context], cfg: ExplainConfig, rng: random.Random) -> list[Context]:
    """The scorers' activating contexts from ``rest`` (ranked strongest first) as ``cfg.test_from`` says, in the
    same order."""
    n = min(cfg.n_test, len(rest))
    if cfg.test_from == "top":
        return rest[:n]
    if cfg.test_from == "quantiles":
        return [rng.choice(rest[len(rest) * q // n:len(rest) * (q + 1) // n]) for q in range(n)]
    return sorted(rng.sample(rest, n), key=lambda c: -c.max_act)


def _split_latent(latent: int, col: int, per: Sequence[dict[str, Any]], cfg: ExplainConfig, tok: Any,
                  rng: random.Random) -> LatentExamples:
    peaks = sorted(((float(p["acts"][:, col].max()), i, int(p["acts"][:, col].argmax())) for i, p in enumerate(per)
                    if p["acts"].numel() and float(p["acts"][:, col].max()) > 0), key=lambda t: (-t[0], t[1]))
    active = [window_context(tok, per[i]["ids"], per[i]["acts"][:, col], i, pos, cfg.window) for _, i, pos in peaks]
    explain, rest = active[:cfg.n_explain], active[cfg.n_explain:]
    test = _held_out(rest, cfg, rng)
    quiet = []
    for i in rng.sample(range(len(per)), len(per)):  # one random zero window per prompt, prompts in random order
        spots = _quiet_positions(per[i]["acts"][:, col], cfg)
        if spots:
            c = window_context(tok, per[i]["ids"], per[i]["acts"][:, col], i, rng.choice(spots), cfg.window)
            if max(c.acts, default=0.0) <= 0:  # widened to whole characters, it may reach an active token
                quiet.append(c)
    k = cfg.n_explain_random
    notes = []
    if len(test) < cfg.n_test:
        notes.append(f"only {len(test)} held-out activating contexts (fired on {len(active)} prompts; "
                     f"{cfg.n_explain} went to the explainer): pass more prompts")
    if len(quiet) < k + cfg.n_test_random:
        notes.append(f"only {len(quiet)} non-activating contexts for {k} + {cfg.n_test_random} wanted")
    return LatentExamples(latent, explain, quiet[:k], test, quiet[k:k + cfg.n_test_random], len(active), notes)


def latent_examples(model: Any, sae: Any, latents: Sequence[int], inputs: Any, cfg: ExplainConfig | None = None,
                    site: str | None = None) -> dict[int, LatentExamples]:
    """Contexts of every latent in ``latents`` from one pass over ``inputs`` (prompts or ``Prompts``; the
    SAE's activations via :func:`sae.analysis.latent_acts_on_prompts`), split with ``cfg.seed``."""
    from sae.analysis import latent_acts_on_prompts

    cfg = cfg or ExplainConfig()
    latents = [int(x) for x in latents]
    if not latents or len(set(latents)) != len(latents):
        raise ValueError(f"latents must be distinct latent indices, got {latents!r:.80}")
    bad = [x for x in latents if not 0 <= x < sae.d_sae]
    if bad:
        raise ValueError(f"latents {bad} are out of range; this SAE has latents 0..{sae.d_sae - 1}")
    per = latent_acts_on_prompts(model, sae, inputs, latents, batch_size=cfg.batch_size, site=site)
    out = {}
    for col, latent in enumerate(latents):
        out[latent] = _split_latent(latent, col, per, cfg, model.tokenizer, random.Random(f"{cfg.seed}:{latent}"))
    return out


__all__ = ["TEST_FROM", "ExplainConfig", "LatentExamples", "latent_examples"]
