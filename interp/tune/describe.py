"""Summaries of a token attribution: concentration, gain by token class and by word (controlled for token
frequency), enrichment of classes among the top tokens, a tidy frame and the figures.

Frequency control: each token's frequency is how often its id occurs among all the response tokens scored;
tokens fall into quantile bins of it (:func:`tune.classes.frequency_bins`), and a class's ``excess`` is its mean
gain minus the mean gain of all tokens in the same bins, weighted as the class is (what frequency alone predicts).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import torch

from interp.tune import classes as C
from interp.tune import stats

QS = (0.01, 0.05, 0.1)


class Described:
    """Mixin over the fields of :class:`tune.attribution.TokenAttribution`."""

    gain: torch.Tensor
    logp_base: torch.Tensor
    logp_adapted: torch.Tensor
    token_ids: torch.Tensor
    example: torch.Tensor
    position: torch.Tensor
    index: torch.Tensor
    special: torch.Tensor
    tokens: list[str]
    texts: list[str]
    n_examples: int

    @cached_property
    def words(self) -> list[str]:
        """The word of each token (``""`` for punctuation / special), words never spanning two examples."""
        out: list[str] = []
        for i in range(self.n_examples):
            idx = (self.example == i).nonzero()[:, 0].tolist()
            out += C.words_of([self.texts[j] for j in idx], [bool(self.special[j]) for j in idx])
        return out

    @cached_property
    def classes(self) -> list[str]:
        """The class of each token (:data:`tune.classes.CLASSES`, defined in :mod:`tune.classes`)."""
        return C.classify(self.texts, self.words, self.special.tolist())

    def frequency_bins(self, n_bins: int = 5) -> torch.Tensor:
        return C.frequency_bins(self.token_ids, n_bins)

    def concentration(self, qs: Sequence[float] = QS) -> dict[str, float]:
        """Shares of the total positive gain held by the top ``qs`` of tokens, and the Gini index
        (:mod:`tune.stats` gives the conventions)."""
        return stats.concentration(self.gain, qs)

    def _expected(self, n_bins: int) -> torch.Tensor:
        bins = self.frequency_bins(n_bins)
        means = torch.zeros(int(bins.max()) + 1 if bins.numel() else 0, dtype=torch.double)
        means.index_add_(0, bins, self.gain.double())
        return (means / torch.bincount(bins, minlength=means.numel()).clamp(min=1))[bins]

    def by_class(self, n_bins: int = 5) -> list[dict[str, Any]]:
        """Per class: ``n``, ``total`` gain, ``mean``, ``share`` of the total positive gain, ``excess`` (mean gain
        over what frequency predicts)."""
        exp, g = self._expected(n_bins), self.gain.double()
        pos = float(g.clamp(min=0).sum()) or 1.0
        cls = self.classes
        out = []
        for c in C.CLASSES:
            m = torch.tensor([k == c for k in cls], dtype=torch.bool)
            if not m.any():
                continue
            out.append({"class": c, "n": int(m.sum()), "total": float(g[m].sum()), "mean": float(g[m].mean()),
                        "share": float(g[m].clamp(min=0).sum()) / pos, "excess": float((g[m] - exp[m]).mean())})
        return out

    def by_word(self, top: int | None = 20, min_count: int = 1, n_bins: int = 5) -> list[dict[str, Any]]:
        """Per word (largest total gain first): ``count`` (occurrences: a word's tokens summed per occurrence),
        ``total``, ``mean`` per occurrence, ``excess`` (token gain over what frequency predicts, per occurrence)."""
        exp, g = self._expected(n_bins), self.gain.double()
        occ: dict[tuple[int, str], list[int]] = defaultdict(list)
        prev: tuple[int, str] | None = None
        run = 0
        for j, w in enumerate(self.words):  # consecutive tokens of one word form one occurrence
            key = (int(self.example[j]), w)
            run += int(key != prev or not w)
            prev = key
            if w:
                occ[(run, w)].append(j)
        agg: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        for (_, w), idx in occ.items():
            a = agg[w]
            a[0] += 1
            a[1] += float(g[idx].sum())
            a[2] += float((g[idx] - exp[idx]).sum())
        rows = [{"word": w, "count": int(n), "total": t, "mean": t / n, "excess": e / n}
                for w, (n, t, e) in agg.items() if n >= min_count]
        rows.sort(key=lambda r: -r["total"])
        return rows[:top] if top is not None else rows

    def enrichment(self, q: float = 0.1, n_perm: int = 1000, n_bins: int = 5, seed: int = 0) -> list[dict[str, Any]]:
        """Per class: over-representation among the top ``q`` tokens (``ratio``, Fisher's exact ``fisher_p``, and a
        frequency-controlled permutation ``perm_p``; :func:`tune.stats.enrichment`)."""
        bins, cls = self.frequency_bins(n_bins), self.classes
        out = []
        for c in C.CLASSES:
            m = torch.tensor([k == c for k in cls], dtype=torch.bool)
            if m.any():
                out.append({"class": c, **stats.enrichment(self.gain, m, q, bins, n_perm=n_perm, seed=seed)})
        return out

    def to_frame(self) -> Any:
        """One row per token: example, index, position, token_id, token, text, word, class, logp_base,
        logp_adapted, gain (a pandas DataFrame)."""
        import pandas as pd

        return pd.DataFrame({"example": self.example.tolist(), "index": self.index.tolist(),
                             "position": self.position.tolist(), "token_id": self.token_ids.tolist(),
                             "token": self.tokens, "text": self.texts, "word": self.words,
                             "class": self.classes, "logp_base": self.logp_base.tolist(),
                             "logp_adapted": self.logp_adapted.tolist(), "gain": self.gain.tolist()})

    def heat_text(self, examples: Sequence[int] | None = None, scale: float | None = None) -> str:
        """HTML: the response tokens of ``examples`` (default the first 20) shaded by gain (orange up, blue down)."""
        from interp.viz.tokens import heat_text

        idx = list(examples) if examples is not None else list(range(min(20, self.n_examples)))
        lines = [(self.example == i).nonzero()[:, 0].tolist() for i in idx]
        return heat_text([[self.texts[j] for j in ln] for ln in lines], [self.gain[ln].tolist() for ln in lines],
                         title="log-likelihood gain per response token (adapted - base)",
                         prefixes=[f"[{i}]" for i in idx], scale=scale, diverging=True)

    def curve(self, title: str = "concentration of the adapter's gain") -> Any:
        """Plotly figure: cumulative share of positive gain against the top fraction of tokens."""
        from interp.viz.tokens import concentration_curve

        return concentration_curve(stats.cumulative_shares(self.gain), {f"top {q * 100:g}%": q for q in QS}, title)

    def plot(self, examples: Sequence[int] | None = None, title: str = "token attribution") -> str:
        """A self-contained HTML page: concentration figures, the curve, gain by class, and the heat text."""
        from interp.viz.html import kv_table, page, table

        conc = self.concentration()
        by = self.by_class()
        return page(title, [("Concentration", kv_table([(k, round(v, 4)) for k, v in conc.items()])),
                            ("Concentration curve", self.curve()),
                            ("Gain by token class", table(list(by[0]), [list(r.values()) for r in by])),
                            ("Tokens", self.heat_text(examples))])


__all__ = ["Described", "QS"]
