"""Feature absorption on the first-letter task (Chanin et al. 2024; SAEBench's full-absorption score).

Over single-token words, a one-vs-rest logistic probe per letter reads "the word starts with X" from the residual
at the SAE's site. Each letter's main latents come from k-sparse probing on the latents (ranked by the difference
of class means; ``k`` grows while the held-out F1 gains more than ``f1_jump``, up to ``max_k``). A held-out word
whose probe is right is *absorbed* when every main latent is silent (``< 1e-8``), the latent with the largest
projection onto the probe direction (``z_j * W_dec[j] . u``) has decoder cosine with the probe at least
``cos_threshold``, the residual's projection ``x . u`` is positive, and that latent carries at least
``proj_threshold`` of it. Probes are fitted by the ``solver`` passed in, :func:`probes.logistic.solve_logistic`
(``sae`` may not import ``probes``). The control applies the same test with a random unit direction in place of each probe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float

from interp.bundle import Result
from interp.evals.rates import Rate, wilson
from sae.model import SAE
from sae.probing import Solver, check_sae_site, check_solver, rank_by_mean_diff

if TYPE_CHECKING:
    import pandas as pd

EPS = 1e-8


@dataclass(frozen=True)
class AbsorptionConfig:
    """Thresholds as SAEBench states them (``cos_threshold`` 0.025, ``proj_threshold`` 0.4, ``f1_jump`` 0.03,
    ``max_k`` 10, letters whose probe F1 is under ``min_probe_f1`` 0.6 or with under ``min_words`` correct
    held-out words skipped); ``template``: the text around each word, read at the word's token."""

    letters: str = "abcdefghijklmnopqrstuvwxyz"
    template: str = "The word {word}"
    max_k: int = 10
    f1_jump: float = 0.03
    cos_threshold: float = 0.025
    proj_threshold: float = 0.4
    min_probe_f1: float = 0.6
    min_words: int = 5
    test_fraction: float = 0.3
    l2: float = 1e-3
    seed: int = 0


@dataclass
class Absorption(Result):
    """Per evaluated letter: ``rate`` of absorbed words among the probe-right held-out ones (``k`` of ``n``, Wilson
    ``low`` / ``high``), the random-direction ``control`` rate, the probe's ``probe_f1``, ``main`` latents and unit
    probe ``directions [L, d]``; per word ``[n]``: ``evaluated`` (held out, its letter kept, probe right) and
    ``absorbed``."""

    letters: list[str]
    k: torch.Tensor
    n: torch.Tensor
    rate: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor
    control: torch.Tensor
    probe_f1: torch.Tensor
    main: list[list[int]]
    thresholds: dict[str, float]
    directions: torch.Tensor
    evaluated: torch.Tensor
    absorbed: torch.Tensor

    @property
    def mean_rate(self) -> float:
        return float(self.rate.mean()) if len(self.rate) else float("nan")

    def summary(self) -> dict[str, Any]:
        """Mean absorption rate over letters (and of the control), words counted, letters evaluated, thresholds."""
        return {"mean_absorption": round(self.mean_rate, 4),
                "mean_control": round(float(self.control.mean()), 4) if len(self.control) else float("nan"),
                "absorbed": int(self.k.sum()), "words": int(self.n.sum()), "letters": len(self.letters),
                "mean_main_latents": sum(map(len, self.main)) / max(1, len(self.main)), **self.thresholds}

    def to_frame(self) -> pd.DataFrame:
        """One row per letter: ``rate`` (``k`` / ``n``, ``low`` / ``high``), ``control``, ``probe_f1``, ``main``."""
        import pandas as pd

        return pd.DataFrame([{"letter": c, **Rate(int(k), int(n)).columns(), "control": float(ctl), "probe_f1": float(f),
                              "main": str(m)} for c, k, n, ctl, f, m in zip(self.letters, self.k, self.n, self.control,
                                                                            self.probe_f1, self.main)])

    def plot(self, title: str | None = None) -> Any:
        """Absorption rate per letter with its Wilson interval."""
        from interp.viz.finetune import method_rates

        bars = {c: (float(r), float(lo), float(hi)) for c, r, lo, hi in zip(self.letters, self.rate, self.low, self.high)}
        return method_rates(bars, "absorption rate", title or f"first-letter absorption (mean {self.mean_rate:.3f})")


def letter_words(tokenizer: Any, letters: str = "abcdefghijklmnopqrstuvwxyz", min_len: int = 2) -> list[tuple[int, str]]:
    """``(token id, word)`` for every vocabulary token that is a word of ``min_len``+ ASCII letters whose first
    (lowercased) is in ``letters``; where the tokenizer has space-prefixed word tokens (GPT-2 / SentencePiece
    style), only those, as the word follows a space in the template. Sorted by id."""
    spaced, bare = [], []
    for tid in range(len(tokenizer)):
        s = tokenizer.decode([tid])
        w = s[1:] if s.startswith(" ") else s
        if len(w) >= min_len and w.isascii() and w.isalpha() and w[0].lower() in letters:
            (spaced if s.startswith(" ") else bare).append((tid, w))
    return spaced or bare


def word_residuals(model: Any, words: list[tuple[int, str]], site: str, template: str, batch_size: int = 64
                   ) -> tuple[Float[torch.Tensor, "n d"], list[int]]:
    """Residual at ``site`` on each word's token in ``template`` (raw text, no chat) and the kept word indices
    (those whose text ends in the word's own token)."""
    from interp.values import Prompts
    from sae.runner import site_tokens

    texts = [template.format(word=w) for _, w in words]
    xs, keep = [], []
    for x, b in site_tokens(model, site, Prompts(texts, chat=False), batch_size):
        xs.append(x[:, -1])
        keep.append(b.input_ids[:, -1])
    last = torch.cat(keep)
    ok = [i for i, (tid, _) in enumerate(words) if int(last[i]) == tid]
    return torch.cat(xs)[ok], ok


def _f1(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """F1 per row of ``pred [F, n]`` against ``y [F, n]`` (bool)."""
    tp = (pred & y).sum(-1).float()
    return 2 * tp / (pred.sum(-1) + y.sum(-1)).float().clamp_min(1)


def main_latents(z: torch.Tensor, Y: torch.Tensor, train: torch.Tensor, cfg: AbsorptionConfig, solver: Solver
                 ) -> list[list[int]]:
    """Per letter (row of ``Y [L, n]``), the top-``k`` latents by mean difference, ``k`` grown while held-out F1
    gains more than ``cfg.f1_jump``; all letters fitted at once (a diagonal of the batched solve)."""
    orders = torch.stack([rank_by_mean_diff(z[train], Y[i][train].long(), absolute=False) for i in range(len(Y))])
    L, test = len(Y), ~train
    best = torch.ones(L, dtype=torch.long)
    prev = torch.full((L,), -1.0)
    grow = torch.ones(L, dtype=torch.bool)
    for k in range(1, min(cfg.max_k, z.shape[1]) + 1):
        Xl = torch.stack([z[:, orders[i, :k]] for i in range(L)])
        fit = solver(Xl, Y.long(), train.expand(L, -1), cfg.l2)
        pred = fit.logits.diagonal(dim1=0, dim2=1).T > 0  # [L, n]: letter i's features, letter i's labels
        f1 = _f1(pred[:, test], Y[:, test])
        grow &= (f1 - prev > cfg.f1_jump) | (k == 1)
        best = torch.where(grow, torch.full_like(best, k), best)
        prev = f1
    return [orders[i, : int(best[i])].tolist() for i in range(L)]


def _absorbed(x: torch.Tensor, z: torch.Tensor, W_dec: torch.Tensor, u: torch.Tensor, main: list[int],
              cfg: AbsorptionConfig) -> torch.Tensor:
    """Full absorption per word (rows of ``x [m, d]``, ``z [m, d_sae]``) for unit probe direction ``u [d]``."""
    cos = (W_dec @ u) / W_dec.norm(dim=1).clamp_min(1e-12)
    proj = z * (W_dec @ u)
    total = x @ u
    top = proj.argmax(-1)
    silent = (z[:, main] < EPS).all(-1)
    share = proj.gather(1, top[:, None])[:, 0] / total.where(total > 0, torch.ones_like(total))
    return silent & (cos[top] >= cfg.cos_threshold) & (total > 0) & (share >= cfg.proj_threshold)


def absorption_from(residual: Float[torch.Tensor, "n d"], latents: Float[torch.Tensor, "n d_sae"],
                    W_dec: Float[torch.Tensor, "d_sae d"], first: list[str], solver: Solver | None = None,
                    config: AbsorptionConfig | None = None) -> Absorption:
    """Absorption rates from word residuals, their latents, the decoder and each word's first letter ``first``;
    ``solver``: :func:`probes.logistic.solve_logistic`."""
    cfg = config or AbsorptionConfig()
    solver = check_solver(solver)
    if not len(residual) == len(latents) == len(first):
        raise ValueError(f"residual ({len(residual)}), latents ({len(latents)}) and letters ({len(first)}) need one "
                         f"row per word")
    g = torch.Generator().manual_seed(cfg.seed)
    train = torch.rand(len(first), generator=g) >= cfg.test_fraction
    letters = [c for c in cfg.letters if sum(f == c and bool(t) for f, t in zip(first, train)) >= 2]
    if len(letters) < 2:
        raise ValueError(f"training words start with {len(letters)} of the letters {cfg.letters!r} (two words each "
                         f"at least); the one-vs-rest probes need two letters or more: give more words")
    lab = torch.tensor([letters.index(f) if f in letters else -1 for f in first])
    Y = torch.stack([lab == i for i in range(len(letters))])
    x, z, W = residual.float(), latents.float(), W_dec.float()
    fit = solver(x[None], Y.long(), train.expand(len(letters), -1), cfg.l2)
    U = fit.coef[0] / fit.coef[0].norm(dim=-1, keepdim=True)
    pred = fit.logits[0].argmax(0)
    f1 = _f1(fit.logits[0][:, ~train] > 0, Y[:, ~train])
    mains = main_latents(z, Y, train, cfg, solver)
    rnd = torch.randn(len(letters), x.shape[1], generator=g)
    rows: list[tuple[Any, ...]] = []
    evaluated, absorbed = torch.zeros(len(first), dtype=torch.bool), torch.zeros(len(first), dtype=torch.bool)
    for i, c in enumerate(letters):
        sel = ~train & (lab == i) & (pred == i)
        if f1[i] < cfg.min_probe_f1 or int(sel.sum()) < cfg.min_words:
            continue
        hit = _absorbed(x[sel], z[sel], W, U[i], mains[i], cfg)
        ctl = _absorbed(x[sel], z[sel], W, rnd[i] / rnd[i].norm(), mains[i], cfg)
        evaluated |= sel
        absorbed[sel.nonzero().flatten()[hit]] = True
        rows.append((c, int(hit.sum()), int(sel.sum()), float(ctl.float().mean()), float(f1[i]), mains[i], U[i]))
    return _result(rows, cfg, evaluated, absorbed, x.shape[1])


def _result(rows: list[tuple[Any, ...]], cfg: AbsorptionConfig, evaluated: torch.Tensor, absorbed: torch.Tensor,
            d: int) -> Absorption:
    k = torch.tensor([r[1] for r in rows], dtype=torch.long)
    n = torch.tensor([r[2] for r in rows], dtype=torch.long)
    ci = [wilson(int(a), int(b)) for a, b in zip(k, n)]
    th = {"cos_threshold": cfg.cos_threshold, "proj_threshold": cfg.proj_threshold, "f1_jump": cfg.f1_jump,
          "max_k": float(cfg.max_k), "min_probe_f1": cfg.min_probe_f1}
    return Absorption([r[0] for r in rows], k, n, k.float() / n.clamp_min(1).float(),
                      torch.tensor([c[0] for c in ci]), torch.tensor([c[1] for c in ci]),
                      torch.tensor([r[3] for r in rows]), torch.tensor([r[4] for r in rows]), [r[5] for r in rows], th,
                      torch.stack([r[6] for r in rows]) if rows else torch.zeros(0, d), evaluated, absorbed)


def absorption(sae: SAE, model: Any, solver: Solver | None = None, config: AbsorptionConfig | None = None,
               site: str | None = None, max_words: int | None = None, batch_size: int = 64) -> Absorption:
    """First-letter absorption of ``sae`` on ``model``'s single-token words (at most ``max_words``, spread evenly);
    ``solver``: :func:`probes.logistic.solve_logistic`."""
    from sae.edits import check_site

    cfg = config or AbsorptionConfig()
    check_solver(solver)
    site = check_site(sae, model, check_sae_site(sae, site))
    words = letter_words(model.tokenizer, cfg.letters)
    if max_words is not None and len(words) > max_words:
        words = words[:: -(-len(words) // max_words)]
    x, kept = word_residuals(model, words, site, cfg.template, batch_size)
    with torch.no_grad():
        z = torch.cat([sae.encode(x[a:a + 4096].to(sae.device)).float().cpu() for a in range(0, len(x), 4096)])
    first = [words[i][1][0].lower() for i in kept]
    return absorption_from(x, z, sae.W_dec.detach().float().cpu(), first, solver, cfg)


__all__ = ["Absorption", "AbsorptionConfig", "absorption", "absorption_from", "letter_words", "main_latents",
           "word_residuals"]
