"""Detection and fuzzing scores of an explanation (delphi's definitions) and their metrics.

Detection: the client reads the explanation and a shuffled mix of held-out activating and non-activating
contexts (no marks) and says which contain the feature. Fuzzing: activating contexts marked at their active
tokens (label 1) and non-activating contexts marked at positions borrowed from an activating one (label 0, so
the marks' count and place tell nothing); the client says which marks fit the explanation. Each prompt shows
``n_shown`` examples; an answer that is not a list of ``n_shown`` 0/1 leaves those examples unanswered.

Verdicts come from the client's text (``ExplainConfig(verdicts="text")``, delphi's default) or, constrained, from
its log-probabilities of ``"1"`` vs ``"0"`` as the next token after the prompt and the answer cue ``"["``
(``verdicts="logprob"``, one example per prompt): the verdict is the likelier answer, and the margin
``log p("1") - log p("0")`` is kept. delphi's log-prob option reads the same quantity, as the normalised
probability ``p(1) / (p(0) + p(1)) = sigmoid(margin)``, from the tokens it generated; here nothing is generated,
so every example has a verdict.

Metrics over the answered examples: accuracy, recall (activating said 1), specificity (non-activating said 0) and
precision as :class:`interp.evals.rates.Rate` (Wilson 95% intervals); balanced accuracy and F1 are not binomial
proportions, so their 95% intervals are percentile bootstraps over examples, resampled within each class; with
margins, the AUROC of the margin against the labels (threshold-free: a scorer that leans to one answer can still
rank the activating examples first), bootstrapped the same way.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from interp.evals.bootstrap import percentile_interval, resample_ids
from interp.evals.metrics import auroc
from interp.evals.rates import Rate
from sae.explain.client import ChatClient
from sae.explain.examples import ExplainConfig, LatentExamples
from sae.explain.prompts import (
    ANSWER_CUE,
    VERDICT_OPTIONS,
    carried_marks,
    mark,
    parse_verdicts,
    plain,
    scorer_messages,
    token_key,
)

SCORERS = ("detection", "fuzzing")


@dataclass
class Verdicts:
    """One scorer's run on one latent: per example shown, its ``label`` (1 = activating / correctly marked), the
    client's ``pred`` (1 / 0, or ``None`` when its answer did not parse) and the ``text`` shown; the raw
    ``answers`` per prompt; the ``explanation`` scored and whose it was (``explanation_of``); the verdict
    ``mode`` (``"text"``, ``"logprob"``, or ``"lexical"`` for the no-model baseline :func:`lexical_score`) and,
    in ``"logprob"`` and ``"lexical"`` mode, each example's ``margins`` (``log p("1") - log p("0")``; lexical: the
    match count or fraction)."""

    kind: str
    explanation: str
    explanation_of: int
    labels: list[int]
    preds: list[int | None]
    texts: list[str]
    answers: list[str]
    mode: str = "text"
    margins: list[float | None] = field(default_factory=list)

    def metrics(self, n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
        """See :func:`verdict_metrics`."""
        return verdict_metrics(self.labels, self.preds, n_boot=n_boot, seed=seed, margins=self.margins or None)


def _counts(y: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(tp, fp, tn, fn)`` along the last dim of labels / predictions ``[..., n]`` (0/1)."""
    return ((y == 1) & (p == 1)).sum(-1), ((y == 0) & (p == 1)).sum(-1), ((y == 0) & (p == 0)).sum(-1), \
        ((y == 1) & (p == 0)).sum(-1)


def _balanced_f1(y: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    tp, fp, tn, fn = (c.double() for c in _counts(y, p))
    bal = (tp / (tp + fn) + tn / (tn + fp)) / 2  # NaN when a class is absent
    f1 = 2 * tp / (2 * tp + fp + fn)
    return bal, f1


def _auroc(labels: Sequence[int], margins: Sequence[float | None], n_boot: int, seed: int
           ) -> tuple[float, list[float]]:
    """AUROC of the ``margins`` (``None``: unanswered, left out) with its class-stratified bootstrap 95%
    interval; NaN when a class is missing."""
    kept = [(int(y), float(m)) for y, m in zip(labels, margins) if m is not None and not math.isnan(m)]
    y = torch.tensor([k[0] for k in kept], dtype=torch.long)
    if not kept or int(y.sum()) in (0, len(kept)):
        return math.nan, [math.nan, math.nan]
    s = torch.tensor([k[1] for k in kept], dtype=torch.float64)
    idx = resample_ids(len(kept), n_boot, seed, groups=y)  # within class: every resample keeps y's layout
    lo, hi = percentile_interval(auroc(s[idx], y))
    return float(auroc(s, y)), [round(float(lo), 4), round(float(hi), 4)]


def verdict_metrics(labels: Sequence[int], preds: Sequence[int | None], n_boot: int = 1000, seed: int = 0,
                    margins: Sequence[float | None] | None = None) -> dict[str, Any]:
    """``accuracy``, ``recall``, ``specificity``, ``precision``, ``answered`` (Rates with Wilson intervals),
    ``balanced_accuracy`` and ``f1`` (values) with bootstrap ``*_ci95``; over the answered examples. With
    ``margins`` (one per example, larger = more "1"), also ``auroc`` with its bootstrap ``auroc_ci95``."""
    if len(labels) != len(preds) or (margins is not None and len(margins) != len(labels)):
        raise ValueError(f"{len(labels)} labels but {len(preds)} predictions"
                         + ("" if margins is None else f" and {len(margins)} margins"))
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
    if margins is not None:
        out["auroc"], out["auroc_ci95"] = _auroc(labels, margins, n_boot, seed)
    return out


def _fuzz_items(ex: LatentExamples, rng: random.Random) -> list[tuple[int, str, list[str]]]:
    """Fuzzing's examples ``(label, marked text, the marked tokens)``: activating contexts marked where active
    (1); non-activating ones marked at the active positions of a random activating context, clipped to their
    length (0)."""
    spots = [[i for i, a in enumerate(c.acts) if a > 0] for c in ex.test]
    marks = [[a > 0 for a in c.acts] for c in ex.test]
    for c in ex.test_random:
        borrowed = [i for i in rng.choice(spots) if i < len(c.tokens)] if spots else []
        if not borrowed:
            borrowed = [rng.randrange(len(c.tokens))]
        marks.append([i in borrowed for i in range(len(c.tokens))])
    out = []
    for y, c, m in zip([1] * len(ex.test) + [0] * len(ex.test_random), [*ex.test, *ex.test_random], marks):
        seen = carried_marks(c.tokens, m)
        out.append((y, mark(c.tokens, m), [t for t, on in zip(c.tokens, seen) if on and t != ""]))
    return out


def _detect_items(ex: LatentExamples) -> list[tuple[int, str, list[str]]]:
    """Detection's examples ``(label, plain text, its tokens)``."""
    return [(1, plain(c), list(c.tokens)) for c in ex.test] + [(0, plain(c), list(c.tokens)) for c in ex.test_random]


def scorer_chunks(kind: str, ex: LatentExamples, cfg: ExplainConfig) -> list[list[tuple[int, str, list[str]]]]:
    """Scorer ``kind``'s examples in the order shown, ``cfg.n_shown`` per prompt; the same for every explanation
    of the latent (the control sees the same examples in the same order)."""
    if kind not in SCORERS:
        raise ValueError(f"scorer must be one of {SCORERS}, got {kind!r}")
    if not ex.test or not ex.test_random:
        raise ValueError(f"latent {ex.latent} has {len(ex.test)} held-out activating and {len(ex.test_random)} "
                         f"non-activating contexts; both are needed: pass more prompts or lower ExplainConfig.n_explain")
    rng = random.Random(f"{cfg.seed}:{kind}:{ex.latent}")
    items = _fuzz_items(ex, rng) if kind == "fuzzing" else _detect_items(ex)
    rng.shuffle(items)
    return [items[a:a + cfg.n_shown] for a in range(0, len(items), cfg.n_shown)]


def score(kind: str, client: ChatClient, explanation: str, ex: LatentExamples, cfg: ExplainConfig,
          explanation_of: int | None = None) -> Verdicts:
    """Run scorer ``kind`` (``"detection"`` or ``"fuzzing"``) on one latent's held-out contexts with
    ``explanation`` (its own, or another latent's for the shuffled control: ``explanation_of``)."""
    chunks = scorer_chunks(kind, ex, cfg)
    prompts = [scorer_messages(kind, explanation, [t for _, t, _ in chunk], cfg.few_shot) for chunk in chunks]
    of = ex.latent if explanation_of is None else int(explanation_of)
    labels, texts = [y for c in chunks for y, _, _ in c], [t for c in chunks for _, t, _ in c]
    if cfg.verdicts == "logprob":
        preds, margins, answers = logprob_verdicts(client, prompts)
        return Verdicts(kind, explanation, of, labels, preds, texts, answers, "logprob", margins)
    many = getattr(client, "complete_many", None)  # a batched client answers all prompts in one go
    answers = many(prompts) if callable(many) else [client.complete(m) for m in prompts]
    preds = []
    for chunk, answer in zip(chunks, answers):
        got = parse_verdicts(answer, len(chunk))
        preds += got if got is not None else [None] * len(chunk)
    return Verdicts(kind, explanation, of, labels, preds, texts, list(answers))


def lexical_score(kind: str, words: Sequence[str], ex: LatentExamples, cfg: ExplainConfig,
                  explanation_of: int | None = None) -> Verdicts:
    """The lexical (bag-of-words) baseline of scorer ``kind``: no model, the same examples in the same order as
    :func:`score`. The margin is, in detection, the number of the example's tokens that are one of ``words``
    (a token's text stripped, compared case-insensitively; e.g. :func:`sae.explain.explainer.reference_tokens`)
    and, in fuzzing, the fraction of its marked tokens that are; the verdict is 1 when the margin is above 0.
    Its AUROC is what an explanation that only names those tokens could reach on these examples, read literally:
    the ceiling for a scorer given the top-token reference, and a check that the held-out examples carry them."""
    vocab = {token_key(w).casefold() for w in words}
    if not vocab:
        raise ValueError("lexical_score needs at least one word")
    chunks = scorer_chunks(kind, ex, cfg)
    flat = [item for c in chunks for item in c]
    hits = [[token_key(t).casefold() in vocab for t in toks] for _, _, toks in flat]
    margins = [float(sum(h)) if kind == "detection" else (sum(h) / len(h) if h else 0.0) for h in hits]
    of = ex.latent if explanation_of is None else int(explanation_of)
    return Verdicts(kind, "lexical: " + ", ".join(repr(w) for w in words), of, [y for y, _, _ in flat],
                    [int(m > 0) for m in margins], [t for _, t, _ in flat], [], "lexical", margins)


def logprob_verdicts(client: ChatClient, prompts: Sequence[Any]) -> tuple[list[int | None], list[float | None],
                                                                           list[str]]:
    """One constrained verdict per prompt: ``(preds, margins, answers)`` from the client's log-probabilities of
    ``"1"`` and ``"0"`` after the answer cue; ``pred`` is the likelier (``None`` and margin ``None`` when the
    client knows neither, e.g. both outside an endpoint's top log-probs)."""
    read = getattr(client, "option_logprobs", None)
    if not callable(read):
        raise ValueError(f"ExplainConfig(verdicts='logprob') needs a scorer client with option_logprobs "
                         f"(LocalChatClient, HTTPChatClient); {getattr(client, 'name', type(client).__name__)} has "
                         f"none: score with verdicts='text'")
    lp = read(prompts, options=VERDICT_OPTIONS, cue=ANSWER_CUE)
    if tuple(lp.shape) != (len(prompts), 2):
        raise ValueError(f"option_logprobs returned shape {tuple(lp.shape)} for {len(prompts)} prompts x 2 options")
    preds, margins, answers = [], [], []
    for one, zero in lp.double().tolist():
        known = not (math.isinf(one) and math.isinf(zero))
        preds.append(int(one > zero) if known else None)
        margins.append(one - zero if known else None)
        answers.append(f"log p('1') {one:.4f}, log p('0') {zero:.4f}")
    return preds, margins, answers


def pooled(verdicts: Sequence[Verdicts], n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """:func:`verdict_metrics` over every example of several latents' verdicts pooled."""
    margins = [m for v in verdicts for m in (v.margins or [None] * len(v.labels))]
    return verdict_metrics([y for v in verdicts for y in v.labels], [q for v in verdicts for q in v.preds],
                           n_boot=n_boot, seed=seed,
                           margins=margins if any(v.margins for v in verdicts) else None)


def auroc_difference(a: Sequence[Verdicts], b: Sequence[Verdicts], n_boot: int = 1000, seed: int = 0
                     ) -> tuple[float, list[float]]:
    """AUROC of ``a``'s pooled margins minus ``b``'s, on the same examples (e.g. own vs shuffled explanations,
    scored on the same contexts in the same order), with a paired bootstrap 95% interval: the examples are
    resampled once, within each class, and both AUROCs computed on the same resample. Examples without a margin
    in either are left out of both."""
    la, lb = [y for v in a for y in v.labels], [y for v in b for y in v.labels]
    if la != lb or [t for v in a for t in v.texts] != [t for v in b for t in v.texts]:
        raise ValueError("the two sets of verdicts were scored on different examples; a paired difference needs "
                         "the same examples in the same order (the shuffled control's)")
    ma, mb = ([m for v in vs for m in (v.margins or [None] * len(v.labels))] for vs in (a, b))
    keep = [i for i in range(len(la)) if ma[i] is not None and mb[i] is not None]
    y = torch.tensor([la[i] for i in keep], dtype=torch.long)
    if not keep or int(y.sum()) in (0, len(keep)):
        return math.nan, [math.nan, math.nan]
    sa, sb = (torch.tensor([m[i] for i in keep], dtype=torch.float64) for m in (ma, mb))
    idx = resample_ids(len(keep), n_boot, seed, groups=y)
    lo, hi = percentile_interval(auroc(sa[idx], y) - auroc(sb[idx], y))
    return float(auroc(sa, y) - auroc(sb, y)), [round(float(lo), 4), round(float(hi), 4)]


__all__ = ["SCORERS", "Verdicts", "auroc_difference", "lexical_score", "logprob_verdicts", "pooled", "score", "scorer_chunks",
           "verdict_metrics"]
