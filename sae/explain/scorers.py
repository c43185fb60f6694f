"""Detection and fuzzing scores of an explanation (delphi's definitions) and their metrics.

Detection: the client reads the explanation and a shuffled mix of held-out activating and non-activating
contexts (no marks) and says which contain the feature. Fuzzing: activating contexts marked at their active
tokens (label 1) and non-activating contexts marked at positions borrowed from an activating one (label 0, so
the marks' count and place tell nothing); the client says which marks fit the explanation. Each prompt shows
``n_shown`` examples; an answer that is not a list of ``n_shown`` 0/1 leaves those examples unanswered.

Metrics over the answered examples: accuracy, recall (activating said 1), specificity (non-activating said 0) and
precision as :class:`interp.evals.rates.Rate` (Wilson 95% intervals); balanced accuracy and F1 are not binomial
proportions, so their 95% intervals are percentile bootstraps over examples, resampled within each class.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from interp.evals.bootstrap import percentile_interval, resample_ids
from interp.evals.rates import Rate
from sae.explain.client import ChatClient
from sae.explain.examples import ExplainConfig, LatentExamples
from sae.explain.prompts import mark, parse_verdicts, plain, scorer_messages

SCORERS = ("detection", "fuzzing")


@dataclass
class Verdicts:
    """One scorer's run on one latent: per example shown, its ``label`` (1 = activating / correctly marked), the
    client's ``pred`` (1 / 0, or ``None`` when its answer did not parse) and the ``text`` shown; the raw
    ``answers`` per prompt; the ``explanation`` scored and whose it was (``explanation_of``)."""

    kind: str
    explanation: str
    explanation_of: int
    labels: list[int]
    preds: list[int | None]
    texts: list[str]
    answers: list[str]

    def metrics(self, n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
        """See :func:`verdict_metrics`."""
        return verdict_metrics(self.labels, self.preds, n_boot=n_boot, seed=seed)


def _counts(y: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(tp, fp, tn, fn)`` along the last dim of labels / predictions ``[..., n]`` (0/1)."""
    return ((y == 1) & (p == 1)).sum(-1), ((y == 0) & (p == 1)).sum(-1), ((y == 0) & (p == 0)).sum(-1), \
        ((y == 1) & (p == 0)).sum(-1)


def _balanced_f1(y: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    tp, fp, tn, fn = (c.double() for c in _counts(y, p))
    bal = (tp / (tp + fn) + tn / (tn + fp)) / 2  # NaN when a class is absent
    f1 = 2 * tp / (2 * tp + fp + fn)
    return bal, f1


def verdict_metrics(labels: Sequence[int], preds: Sequence[int | None], n_boot: int = 1000, seed: int = 0
                    ) -> dict[str, Any]:
    """``accuracy``, ``recall``, ``specificity``, ``precision``, ``answered`` (Rates with Wilson intervals),
    ``balanced_accuracy`` and ``f1`` (values) with bootstrap ``*_ci95``; over the answered examples."""
    if len(labels) != len(preds):
        raise ValueError(f"{len(labels)} labels but {len(preds)} predictions")
    kept = [(int(y), int(q)) for y, q in zip(labels, preds) if q is not None]
    y = torch.tensor([k[0] for k in kept], dtype=torch.long)
    p = torch.tensor([k[1] for k in kept], dtype=torch.long)
    tp, fp, tn, fn = (int(c) for c in _counts(y, p))
    out: dict[str, Any] = {"accuracy": Rate(tp + tn, len(kept)), "recall": Rate(tp, tp + fn),
                           "specificity": Rate(tn, tn + fp), "precision": Rate(tp, tp + fp),
                           "answered": Rate(len(kept), len(labels))}
    bal, f1 = _balanced_f1(y, p) if kept else (torch.tensor(math.nan), torch.tensor(math.nan))
    out["balanced_accuracy"], out["f1"] = float(bal), float(f1)
    for name, value in (("balanced_accuracy", bal), ("f1", f1)):
        out[f"{name}_ci95"] = [math.nan, math.nan]
        if kept and not math.isnan(float(value)):
            idx = resample_ids(len(kept), n_boot, seed, groups=y)
            b = _balanced_f1(y[idx], p[idx])[0 if name == "balanced_accuracy" else 1]
            out[f"{name}_ci95"] = [round(float(v), 4) for v in percentile_interval(b)]
    return out


def _fuzz_items(ex: LatentExamples, rng: random.Random) -> list[tuple[int, str]]:
    """Fuzzing's examples: activating contexts marked where active (1); non-activating ones marked at the
    active positions of a random activating context, clipped to their length (0)."""
    spots = [[i for i, a in enumerate(c.acts) if a > 0] for c in ex.test]
    items = [(1, mark(c.tokens, [a > 0 for a in c.acts])) for c in ex.test]
    for c in ex.test_random:
        borrowed = [i for i in rng.choice(spots) if i < len(c.tokens)] if spots else []
        if not borrowed:
            borrowed = [rng.randrange(len(c.tokens))]
        items.append((0, mark(c.tokens, [i in borrowed for i in range(len(c.tokens))])))
    return items


def _detect_items(ex: LatentExamples) -> list[tuple[int, str]]:
    return [(1, plain(c)) for c in ex.test] + [(0, plain(c)) for c in ex.test_random]


def score(kind: str, client: ChatClient, explanation: str, ex: LatentExamples, cfg: ExplainConfig,
          explanation_of: int | None = None) -> Verdicts:
    """Run scorer ``kind`` (``"detection"`` or ``"fuzzing"``) on one latent's held-out contexts with
    ``explanation`` (its own, or another latent's for the shuffled control: ``explanation_of``)."""
    if kind not in SCORERS:
        raise ValueError(f"scorer must be one of {SCORERS}, got {kind!r}")
    if not ex.test or not ex.test_random:
        raise ValueError(f"latent {ex.latent} has {len(ex.test)} held-out activating and {len(ex.test_random)} "
                         f"non-activating contexts; both are needed: pass more prompts or lower ExplainConfig.n_explain")
    rng = random.Random(f"{cfg.seed}:{kind}:{ex.latent}")  # the same examples and order for the control
    items = _fuzz_items(ex, rng) if kind == "fuzzing" else _detect_items(ex)
    rng.shuffle(items)
    chunks = [items[a:a + cfg.n_shown] for a in range(0, len(items), cfg.n_shown)]
    prompts = [scorer_messages(kind, explanation, [t for _, t in chunk], cfg.few_shot) for chunk in chunks]
    many = getattr(client, "complete_many", None)  # a batched client answers all prompts in one go
    replies = many(prompts) if callable(many) else [client.complete(m) for m in prompts]
    labels, preds, texts, answers = [], [], [], []
    for chunk, answer in zip(chunks, replies):
        got = parse_verdicts(answer, len(chunk))
        labels += [y for y, _ in chunk]
        preds += got if got is not None else [None] * len(chunk)
        texts += [t for _, t in chunk]
        answers.append(answer)
    return Verdicts(kind, explanation, ex.latent if explanation_of is None else int(explanation_of), labels, preds,
                    texts, answers)


def pooled(verdicts: Sequence[Verdicts], n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """:func:`verdict_metrics` over every example of several latents' verdicts pooled."""
    return verdict_metrics([y for v in verdicts for y in v.labels], [q for v in verdicts for q in v.preds],
                           n_boot=n_boot, seed=seed)


__all__ = ["SCORERS", "Verdicts", "pooled", "score", "verdict_metrics"]
