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
from interp.studies.kit.moved import moved
from interp.studies.kit.runs import fresh_tune, refusal_rate, refuse_shared_adapter
from interp.tune import TuneConfig, token_attribution
from interp.tune.attribution import TokenAttribution
from interp.tune.data import check_pairs
from interp.tune.masks import random_mask, top_mask
from interp.values import Prompts, Runtime, moved_keywords

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


@dataclass(frozen=True)
class MaskingConfig:
    """The study's knobs: ``q``, the fraction of attributed response tokens the top mask leaves out of the loss;
    ``tune``, the one fine-tune of the three conditions (``tune.seed`` seeds them); ``max_new_tokens`` of the judged
    generations; ``metrics``, user measures ``name -> callable(model) -> float``; ``keep_states``: keep each
    fine-tune's trained tensors."""

    q: float = 0.1
    tune: TuneConfig = TuneConfig()
    max_new_tokens: int = 24
    metrics: Mapping[str, Metric] | None = None
    keep_states: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.q < 1:
            q = self.q
            hint = ("q=0 masks no token, so the top mask would be the no-mask fine-tune" if q <= 0 else
                    "q=1 masks every response token, leaving nothing to train on" if q == 1 else
                    f"q={q} is not a fraction (q is 0.1 for 10%)")
            raise ValueError(f"{hint}; give q strictly between 0 and 1, e.g. q=0.1 (the top 10% of attributed tokens)")
        if not isinstance(self.tune, TuneConfig):
            raise TypeError(f"tune must be a TuneConfig, got {type(self.tune).__name__}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


_MOVED = {**moved(config="MaskingConfig", knobs=("q", "max_new_tokens", "metrics", "keep_states"),
                  prompts=("chat", "system", "responses")),
          "harmful": "held_out=(harmful, harmless)", "harmless": "held_out=(harmful, harmless)"}


def _behaviour(model: Model, harmful: Sequence[str], harmless: Sequence[str], metrics: Mapping[str, Metric],
               judge: Judge | None, max_new_tokens: int, name: str, batch_size: int
               ) -> tuple[list[dict[str, Any]], dict[str, float]]:
    with torch.no_grad():
        rows = [{"condition": name, "split": split, **refusal_rate(model, ps, judge, max_new_tokens, batch_size=batch_size)}
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


def _check_inputs(base: Model, adapted: Any, prompts: Prompts, eval_pairs: tuple[Sequence[str], Sequence[str]],
                  held_out: tuple[Sequence[str], Sequence[str]]) -> None:
    if prompts.responses is None:
        raise ValueError("the training prompts carry their responses: pass interp.Prompts(texts, responses=...)")
    check_pairs(list(prompts.texts), list(prompts.responses))
    try:
        check_pairs(*eval_pairs)
    except (TypeError, ValueError) as e:
        raise type(e)(f"eval_pairs (held-out prompts, responses): {e}") from None
    if len(held_out) != 2 or not held_out[0] or not held_out[1]:
        raise ValueError("give held-out harmful and harmless prompts (the behaviour and over-refusal sets) as "
                         "held_out=(harmful, harmless)")
    refuse_shared_adapter(base, adapted, "adapted")


@moved_keywords(_MOVED)
def masking_study(base: Model, adapted: Model | str, prompts: Prompts | Sequence[str],
                  held_out: tuple[Sequence[str], Sequence[str]], eval_pairs: tuple[Sequence[str], Sequence[str]],
                  judge: Judge | None = None, config: MaskingConfig | None = None,
                  runtime: Runtime | None = None) -> MaskingStudy:
    """Attribution, three fresh fine-tunes from ``base`` and their behaviour and NLL cost (module docstring).

    ``adapted``: the fine-tuned model whose attribution chooses the mask (a model of the same architecture, or an
    adapter folder for ``base``); ``prompts``: the training pairs (``interp.Prompts`` with ``responses``; its
    ``chat`` / ``system`` format them), attributed, then trained on; ``held_out``: (harmful, harmless) held-out
    prompts; ``eval_pairs``: held-out (prompts, responses) for the NLL cost; ``runtime.seed``: the random mask's
    draw (``config.tune.seed`` seeds the fine-tunes), ``runtime.batch_size``: the judged generations' (default 32)."""
    if isinstance(config, TuneConfig):
        raise TypeError("config= is the study's MaskingConfig now; pass config=MaskingConfig(tune=TuneConfig(...))")
    c, rt = config if config is not None else MaskingConfig(), runtime if runtime is not None else Runtime(batch_size=32)
    prompts = Prompts.of(prompts)
    _check_inputs(base, adapted, prompts, eval_pairs, held_out)
    harmful, harmless = held_out
    responses, metrics = list(prompts.responses or ()), dict(c.metrics or {})
    texts, kw = list(prompts.texts), {"chat": prompts.chat, "system": prompts.system}
    with torch.no_grad():
        attr = token_attribution(base, adapted, texts, responses, **kw)
    masks = _masks(attr, c.q, rt.seed)
    ev_p, ev_r = list(eval_pairs[0]), list(eval_pairs[1])
    rates, nll, ms = [], [], {}
    refs: list[tuple[str, Model]] = [("base", base)] + ([("adapted", adapted)] if isinstance(adapted, Model) else [])
    for name, m in refs:
        r, ms[name] = _behaviour(m, harmful, harmless, metrics, judge, c.max_new_tokens, name, rt.batch_size)
        rates += r
    runs, states = {}, {}
    for name in CONDITIONS:
        with fresh_tune(base, texts, responses, c.tune, mask_out=masks[name], **kw) as res:
            r, ms[name] = _behaviour(res.model, harmful, harmless, metrics, judge, c.max_new_tokens, name,
                                     rt.batch_size)
            rates += r
            with torch.no_grad():
                ev = token_attribution(base, res.model, ev_p, ev_r, **kw)
            if not nll:
                nll += _nll_by_class(ev, "base", "base")
            nll += _nll_by_class(ev, name, "adapted")
            runs[name] = res.record()
            if c.keep_states:
                states[name] = res.trainable_state()
    base_nll = {r["class"]: r["nll"] for r in nll if r["condition"] == "base"}
    for r in nll:
        r["delta"] = r["nll"] - base_nll[r["class"]]
    top, rnd = (next(r for r in rates if r["condition"] == cond and r["split"] == "harmful")
                for cond in ("top mask", "random mask"))
    p = fisher_greater(rnd["k"], rnd["n"], top["k"], top["n"])
    shown = {k: v for k, v in masks.items() if v is not None}
    return MaskingStudy(c.q, rates, nll, ms, p, shown, attr, runs, states,
                        meta={"n_train": len(texts), "n_masked": sum(int(m.sum()) for m in shown["top mask"]),
                              "n_tokens": int(attr.gain.numel()), "seed": rt.seed, "config": c.tune.record(),
                              "n_eval_pairs": len(ev_p), "max_new_tokens": c.max_new_tokens})


__all__ = ["CONDITIONS", "MaskingConfig", "MaskingStudy", "masking_study"]
