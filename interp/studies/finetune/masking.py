"""Attribution-guided loss masking (TAME's causal check): which training tokens carry an adapter's behaviour?

1. **attribution**: :func:`tune.token_attribution` of the adapted model over its base on the training pairs;
2. **three fresh fine-tunes from the base**, same config and seed: the top ``q`` of attributed response tokens
   masked out of the loss (:func:`tune.masks.top_mask`), an equal random mask (as many tokens in each example,
   :func:`tune.masks.random_mask`), and no mask;
3. **behaviour**: refusal rates by generation on held-out harmful prompts (the behaviour) and harmless ones
   (over-refusal), 95% Wilson intervals, the anchored judge, plus any user metric ``callable(model) -> float``;
   Fisher's exact test that the random mask keeps more refusal than the top mask;
4. **perplexity cost by token class**: mean NLL of held-out (prompt, response) pairs' response tokens per class of
   :mod:`tune.classes`, for the base and the three fine-tunes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.evals.judge import Judge
from interp.evals.rates import fisher_greater, rate_cells
from interp.models import Model
from interp.studies.kit.runs import fresh_tune, refusal_rate, refuse_shared_adapter
from interp.tune import TuneConfig, token_attribution
from interp.tune.attribution import TokenAttribution
from interp.tune.data import check_pairs
from interp.tune.masks import random_mask, top_mask

if TYPE_CHECKING:
    import pandas as pd

CONDITIONS = ("no mask", "top mask", "random mask")
Metric = Callable[[Model], float]


@dataclass
class MaskingStudy(Result):
    """``rates``: per condition (``base``, ``adapted`` when it is a model, and :data:`CONDITIONS`) and split
    (``harmful``, ``harmless``) the refusal rate, ``k``, ``n``, ``ci95``; ``nll``: per condition and token class
    (``all`` included) ``n`` tokens, mean ``nll`` and ``delta`` over the base's; ``metrics``: per condition the
    user metrics; ``fisher_p``: one-sided p that the random mask refuses harmful prompts more than the top mask;
    ``masks``: the masks passed to the fine-tunes; ``runs``: each fine-tune's record; ``states``: its trained
    tensors (``keep_states=True``)."""

    q: float
    rates: list[dict[str, Any]]
    nll: list[dict[str, Any]]
    metrics: dict[str, dict[str, float]]
    fisher_p: float
    masks: dict[str, list[torch.Tensor]]
    attribution: TokenAttribution
    runs: dict[str, dict[str, Any]]
    states: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Headline numbers: refusal (rate, k, n, 95% interval) per condition and split, Fisher's p that the
        random mask refuses more than the top mask, each condition's NLL change over the base (all tokens),
        ``q`` and the tokens masked."""
        return {"q": self.q, "rates": rate_cells(self.rates, ("condition", "split")), "fisher_p": self.fisher_p,
                "nll_delta": {r["condition"]: r["delta"] for r in self.nll if r["class"] == "all"},
                "n_masked": self.meta.get("n_masked"), "n_tokens": self.meta.get("n_tokens")}

    def rate_of(self, condition: str, split: str = "harmful") -> dict[str, Any]:
        return next(r for r in self.rates if r["condition"] == condition and r["split"] == split)

    def to_frame(self, which: str = "rates") -> pd.DataFrame:
        """``which='rates'`` (behaviour), ``'nll'`` (perplexity cost by token class) or ``'metrics'``."""
        import pandas as pd

        if which == "metrics":
            return pd.DataFrame([{"condition": c, **m} for c, m in self.metrics.items()])
        if which not in ("rates", "nll"):
            raise ValueError(f"which must be 'rates', 'nll' or 'metrics', got {which!r}")
        return pd.DataFrame(self.rates if which == "rates" else self.nll)

    def plot(self, split: str = "harmful") -> Any:
        """Refusal rate of each condition on the ``split`` prompts, with 95% Wilson intervals."""
        from interp.viz.refusal import refusal_rates

        rows = [r for r in self.rates if r["split"] == split]
        return refusal_rates({r["condition"]: r["rate"] for r in rows}, {r["condition"]: r["ci95"] for r in rows})


def _check_q(q: float) -> None:
    if not 0 < q < 1:
        hint = ("q=0 masks no token, so the top mask would be the no-mask fine-tune" if q <= 0 else
                "q=1 masks every response token, leaving nothing to train on" if q == 1 else
                f"q={q} is not a fraction (q is 0.1 for 10%)")
        raise ValueError(f"{hint}; give q strictly between 0 and 1, e.g. q=0.1 (the top 10% of attributed tokens)")


def _behaviour(model: Model, harmful: Sequence[str], harmless: Sequence[str], metrics: Mapping[str, Metric],
               judge: Judge | None, max_new_tokens: int, name: str) -> tuple[list[dict[str, Any]], dict[str, float]]:
    with torch.no_grad():
        rows = [{"condition": name, "split": split, **refusal_rate(model, ps, judge, max_new_tokens, batch_size=32)}
                for split, ps in (("harmful", harmful), ("harmless", harmless))]
        return rows, {k: float(f(model)) for k, f in metrics.items()}


def _nll_by_class(a: TokenAttribution, name: str, which: str) -> list[dict[str, Any]]:
    """Mean NLL per token class of ``a.logp_base`` or ``a.logp_adapted`` (``which``), ``all`` first."""
    lp = a.logp_base if which == "base" else a.logp_adapted
    cls = a.classes
    out = [{"condition": name, "class": "all", "n": int(lp.numel()), "nll": float(-lp.double().mean())}]
    for c in dict.fromkeys(cls):
        m = torch.tensor([k == c for k in cls], dtype=torch.bool)
        out.append({"condition": name, "class": c, "n": int(m.sum()), "nll": float(-lp[m].double().mean())})
    return out


def _masks(attr: TokenAttribution, q: float, seed: int) -> dict[str, list[torch.Tensor] | None]:
    top = top_mask(attr, q)
    if sum(int(m.sum()) for m in top) == 0:
        raise ValueError(f"the top {q:g} of attributed tokens is empty; raise q")
    return {"no mask": None, "top mask": top, "random mask": random_mask(attr, top, seed=seed)}


def _check_inputs(base: Model, adapted: Any, prompts: Sequence[str], responses: Sequence[str],
                  eval_pairs: tuple[Sequence[str], Sequence[str]], harmful: Sequence[str],
                  harmless: Sequence[str], q: float) -> None:
    _check_q(q)
    check_pairs(prompts, responses)
    try:
        check_pairs(*eval_pairs)
    except (TypeError, ValueError) as e:
        raise type(e)(f"eval_pairs (held-out prompts, responses): {e}") from None
    if not harmful or not harmless:
        raise ValueError("give held-out harmful and harmless prompts (the behaviour and over-refusal sets)")
    refuse_shared_adapter(base, adapted, "adapted")


def masking_study(base: Model, adapted: Model | str, prompts: Sequence[str], responses: Sequence[str],
                  harmful: Sequence[str], harmless: Sequence[str], eval_pairs: tuple[Sequence[str], Sequence[str]],
                  q: float = 0.1, config: TuneConfig = TuneConfig(), seed: int = 0,
                  metrics: Mapping[str, Metric] | None = None, judge: Judge | None = None,
                  max_new_tokens: int = 24, keep_states: bool = False, chat: bool = True,
                  system: str | None = None) -> MaskingStudy:
    """Attribution, three fresh fine-tunes from ``base`` and their behaviour and NLL cost (module docstring).

    ``adapted``: the fine-tuned model whose attribution chooses the mask (a model of the same architecture, or an
    adapter folder for ``base``); ``prompts`` / ``responses``: the training pairs (attributed, then trained on);
    ``harmful`` / ``harmless``: held-out prompts; ``eval_pairs``: held-out (prompts, responses) for the NLL cost;
    ``seed``: the random mask's draw (``config.seed`` seeds the fine-tunes)."""
    _check_inputs(base, adapted, prompts, responses, eval_pairs, harmful, harmless, q)
    metrics = dict(metrics or {})
    kw = {"chat": chat, "system": system}
    with torch.no_grad():
        attr = token_attribution(base, adapted, prompts, responses, **kw)
    masks = _masks(attr, q, seed)
    ev_p, ev_r = list(eval_pairs[0]), list(eval_pairs[1])
    rates, nll, ms = [], [], {}
    refs: list[tuple[str, Model]] = [("base", base)] + ([("adapted", adapted)] if isinstance(adapted, Model) else [])
    for name, m in refs:
        r, ms[name] = _behaviour(m, harmful, harmless, metrics, judge, max_new_tokens, name)
        rates += r
    runs, states = {}, {}
    for name in CONDITIONS:
        with fresh_tune(base, prompts, responses, config, mask_out=masks[name], **kw) as res:
            r, ms[name] = _behaviour(res.model, harmful, harmless, metrics, judge, max_new_tokens, name)
            rates += r
            with torch.no_grad():
                ev = token_attribution(base, res.model, ev_p, ev_r, **kw)
            if not nll:
                nll += _nll_by_class(ev, "base", "base")
            nll += _nll_by_class(ev, name, "adapted")
            runs[name] = res.record()
            if keep_states:
                states[name] = res.trainable_state()
    base_nll = {r["class"]: r["nll"] for r in nll if r["condition"] == "base"}
    for r in nll:
        r["delta"] = r["nll"] - base_nll[r["class"]]
    top, rnd = (next(r for r in rates if r["condition"] == c and r["split"] == "harmful")
                for c in ("top mask", "random mask"))
    p = fisher_greater(rnd["k"], rnd["n"], top["k"], top["n"])
    shown = {k: v for k, v in masks.items() if v is not None}
    return MaskingStudy(q, rates, nll, ms, p, shown, attr, runs, states,
                        meta={"n_train": len(prompts), "n_masked": sum(int(m.sum()) for m in shown["top mask"]),
                              "n_tokens": int(attr.gain.numel()), "seed": seed, "config": config.record(),
                              "n_eval_pairs": len(ev_p), "max_new_tokens": max_new_tokens})


__all__ = ["CONDITIONS", "MaskingStudy", "masking_study"]
