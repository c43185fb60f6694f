"""Alignment elasticity: does further fine-tuning pull an aligned model back toward its base, fast then slowly?

Three fresh fine-tunes, the same config and size, each measured at step 0 and every ``eval_every`` steps (through
``tune.fine_tune``'s callback):
- **compliance**: the aligned model on a little compliance data (harmful prompt -> compliant answer; by default the
  base's own greedy answers to the harmful train prompts);
- **control**: the aligned model on as many unrelated benign pairs (harmless prompt -> the base's answer);
- **forward** (optional): the base on aligned-like data (harmful -> refusal, harmless -> answer), base -> aligned.
At each point: refusal rate on the held-out harmful prompts (generation, anchored judge, Wilson interval), the
first-token refusal score there (the aligned model's own refusal tokens), the refusal direction recomputed as the
difference of means at ``layer`` / post-instruction ``position`` on the train prompts (as
:func:`interp.studies.kit.stages.find_candidates` does), its cosine with the aligned model's and its separation
AUROC on the held-out prompts, and the KL from the base's and the aligned model's next-token distributions on the
held-out harmless prompts. The refusal score and rate curves get the two-phase fit
(:mod:`interp.studies.finetune.twophase`) with bootstrap intervals over prompts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.capturing import capture
from interp.evals.judge import Judge
from interp.evals.logits import kl_div, refusal_score
from interp.evals.metrics import auroc
from interp.evals.rates import fisher_greater, rate
from interp.forward import prepare
from interp.models import Model
from interp.studies.finetune.twophase import TwoPhaseFit, bootstrap_two_phase
from interp.studies.kit.moved import moved
from interp.studies.kit.prompt_sets import RefusalData
from interp.studies.kit.runs import base_answers, fresh_tune, refusals, refuse_shared_adapter
from interp.studies.kit.scoring import prompt_logits
from interp.studies.kit.stages import find_candidates, find_refusal_tokens
from interp.tune import TuneConfig
from interp.tune.data import check_pairs
from interp.values import Runtime, moved_keywords

if TYPE_CHECKING:
    import pandas as pd

Pairs = tuple[Sequence[str], Sequence[str]]
QUANTITIES = ("refusal", "score", "cosine", "auroc", "kl_base", "kl_aligned")
FITTED = ("score", "refusal")


@dataclass
class Curve:
    """One fine-tune over steps: ``rows`` (one per eval point: ``step``, ``loss``, ``refusal`` with ``k``, ``n``,
    ``low`` / ``high`` (its 95% interval), ``score``, ``cosine``, ``auroc``, ``kl_base``, ``kl_aligned``) and the
    per-prompt values behind the means (``per_prompt['score' | 'refusal'] [points, n_harmful]``), for the bootstrap."""

    name: str
    start: str
    rows: list[dict[str, Any]]
    per_prompt: dict[str, torch.Tensor]

    @property
    def steps(self) -> list[int]:
        return [r["step"] for r in self.rows]

    def series(self, key: str) -> list[float]:
        return [float(r[key]) for r in self.rows]


@dataclass
class ElasticityStudy(Result):
    """``curves`` by name (``compliance``, ``control``, ``forward``); ``fits``: per curve and fitted quantity the
    two-phase fit; ``outcomes``: per curve the start and end refusal and score and the share of the way to the
    other model it went (``toward_other``: 0 = stayed, 1 = reached the other model's refusal score)."""

    curves: dict[str, Curve]
    fits: dict[tuple[str, str], TwoPhaseFit]
    outcomes: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Per curve: refusal at the start and end, the share of the way to the other model, Fisher's p."""
        keys = ("refusal_start", "refusal_end", "score_start", "score_end", "toward_other", "fisher_p")
        return {o["curve"]: {k: o[k] for k in keys} for o in self.outcomes}

    def to_frame(self, which: str = "curves") -> pd.DataFrame:
        """``which='curves'`` (one row per curve and eval point), ``'fits'`` or ``'outcomes'`` (one row per curve)."""
        import pandas as pd

        if which == "curves":
            return pd.DataFrame([{"curve": c.name, **r} for c in self.curves.values() for r in c.rows])
        if which == "fits":
            return pd.DataFrame([{"curve": c, "quantity": q, **f.record()} for (c, q), f in self.fits.items()])
        if which == "outcomes":
            return pd.DataFrame(self.outcomes)
        raise ValueError(f"which must be 'curves', 'fits' or 'outcomes', got {which!r}")

    def plot(self, keys: Sequence[str] = QUANTITIES) -> Any:
        """One panel per quantity over steps, one line per curve, the two-phase fits dashed."""
        from interp.viz.tuning import step_panels

        runs = {n: {"step": c.steps, **{k: c.series(k) for k in keys}} for n, c in self.curves.items()}
        fitted = {}
        for (n, q), f in self.fits.items():
            steps = self.curves[n].steps
            xs = torch.linspace(steps[0], steps[-1], 100, dtype=torch.float64)
            fitted[(n, q)] = (xs.tolist(), f.predict(xs).tolist())
        names = {"refusal": "refusal rate (held-out harmful)", "score": "first-token refusal score",
                 "cosine": "cosine with the aligned direction", "auroc": "direction's separation AUROC",
                 "kl_base": "KL(base || model), harmless", "kl_aligned": "KL(aligned || model), harmless"}
        return step_panels(runs, list(keys), fitted, names, title="elasticity: behaviour and internals over steps")


@dataclass
class _Probe:
    """What every eval point measures, with the references computed once."""

    data: RefusalData
    layer: int
    position: int
    tokens: list[int]
    judge: Judge | None
    max_new_tokens: int
    batch_size: int
    refs: dict[str, torch.Tensor] = field(default_factory=dict)

    def direction(self, model: Model) -> torch.Tensor:
        return find_candidates(model, self.data, layers=[self.layer], batch_size=self.batch_size).raw[0, self.position]

    def _acts(self, model: Model, prompts: list[str]) -> torch.Tensor:
        a = capture(model, prompts, sites="resid_pre", layers=[self.layer], positions="post_instruction",
                    runtime=Runtime(batch_size=self.batch_size, progress=False))
        return a.tensor[:, 0, self.position].float()

    def measure(self, model: Model) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
        """The row of one eval point and its per-prompt refusal scores and verdicts on the held-out harmful."""
        harm, safe = self.data.harmful["test"].instructions, self.data.harmless["test"].instructions
        score = refusal_score(prompt_logits(model, prepare(model, harm)[1], batch_size=self.batch_size), self.tokens)
        logits_s = prompt_logits(model, prepare(model, safe)[1], batch_size=self.batch_size)
        refused = torch.tensor(refusals(model, harm, self.judge, self.max_new_tokens, self.batch_size))
        d = self.direction(model)
        u = d / d.norm().clamp(min=1e-12)
        proj = torch.cat([self._acts(model, harm), self._acts(model, safe)]) @ u
        y = torch.tensor([1] * len(harm) + [0] * len(safe))
        r = rate(refused.tolist())
        row = {"refusal": r.rate, **r.columns(), "score": float(score.mean()),
               "cosine": float(u @ self.refs["u"]) if "u" in self.refs else 1.0, "auroc": float(auroc(proj, y)),
               "kl_base": float(kl_div(self.refs["base"], logits_s).mean()) if "base" in self.refs else 0.0,
               "kl_aligned": float(kl_div(self.refs["aligned"], logits_s).mean()) if "aligned" in self.refs else 0.0,
               "direction_norm": float(d.norm())}
        return row, score.float(), refused.float()


def _probe(base: Model, aligned: Model, data: RefusalData, layer: int, position: int, judge: Judge | None,
           max_new_tokens: int, batch_size: int) -> _Probe:
    if not 0 <= layer < aligned.n_layers:
        raise ValueError(f"layer {layer} is out of range 0..{aligned.n_layers - 1}")
    if position >= 0:
        raise ValueError(f"position counts back from the last post-instruction token (-1 = last), got {position}")
    data.check()
    tok = find_refusal_tokens(aligned, data, judge=judge)
    if not tok.tokens:
        raise ValueError(f"the aligned model {aligned.name!r} refused none of the harmful train prompts, so there is "
                         f"no refusal to revert; pass the aligned model (adapter merged)")
    p = _Probe(data, layer, position, tok.tokens, judge, max_new_tokens, batch_size)
    with torch.no_grad():
        safe = prepare(aligned, data.harmless["test"].instructions)[1]
        p.refs = {"base": prompt_logits(base, safe, batch_size=batch_size),
                  "aligned": prompt_logits(aligned, safe, batch_size=batch_size)}
        d = p.direction(aligned)
        p.refs["u"] = d / d.norm().clamp(min=1e-12)
    return p


def _pairs(base: Model, spec: Any, default: list[str], n: int, answer_tokens: int, what: str) -> Pairs:
    if spec is None:
        spec = default[:n]
    if isinstance(spec, tuple) and len(spec) == 2 and not isinstance(spec[0], str):
        ps, rs = list(spec[0]), list(spec[1])
    else:
        ps, rs = base_answers(base, list(spec), answer_tokens)
    try:
        check_pairs(ps, rs)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{what} pairs: {e}") from None
    return ps, rs


def _curve(name: str, start_name: str, start: Model, pairs: Pairs, config: TuneConfig, eval_every: int,
           probe: _Probe) -> Curve:
    rows: list[dict[str, Any]] = []
    per: dict[str, list[torch.Tensor]] = {"score": [], "refusal": []}

    def record(step: int, loss: float, model: Model) -> None:
        was = model.hf.training
        model.hf.eval()
        try:
            with torch.no_grad():
                row, s, r = probe.measure(model)
        finally:
            model.hf.train(was)
        rows.append({"step": step, "loss": loss, **row})
        per["score"].append(s)
        per["refusal"].append(r)

    record(0, float("nan"), start)
    with fresh_tune(start, *pairs, config,
                    callback=lambda s, loss, m: record(s, loss, m) if s % eval_every == 0 or s == config.steps else None):
        pass
    return Curve(name, start_name, rows, {k: torch.stack(v) for k, v in per.items()})


def _outcome(c: Curve, other_score: float) -> dict[str, Any]:
    first, last = c.rows[0], c.rows[-1]
    down = c.start == "aligned"  # a curve from the aligned model may lose refusal; the forward one gains it
    hi, lo = (first, last) if down else (last, first)
    span = other_score - first["score"]
    return {"curve": c.name, "start": c.start, "refusal_start": first["refusal"], "ci95_start": [first["low"], first["high"]],
            "refusal_end": last["refusal"], "ci95_end": [last["low"], last["high"]], "score_start": first["score"],
            "score_end": last["score"], "toward_other": (last["score"] - first["score"]) / span if span else 0.0,
            "fisher_p": fisher_greater(hi["k"], hi["n"], lo["k"], lo["n"]),
            "cosine_end": last["cosine"], "auroc_end": last["auroc"], "kl_base_end": last["kl_base"],
            "kl_aligned_end": last["kl_aligned"]}


@dataclass(frozen=True)
class ElasticityConfig:
    """The study's knobs: ``tune``, the one fine-tune every curve runs (``tune.seed`` seeds it); the direction's
    ``position`` (counted back from the last post-instruction token, -1 = last); ``n_pairs`` default training pairs
    per curve; an eval point every ``eval_every`` steps; ``n_boot`` bootstrap draws of the fits; ``max_new_tokens``
    of the judged generations; ``answer_tokens`` of the base's greedy answers to prompts given without responses."""

    tune: TuneConfig = TuneConfig(steps=40)
    position: int = -1
    n_pairs: int = 32
    eval_every: int = 4
    n_boot: int = 200
    max_new_tokens: int = 16
    answer_tokens: int = 48

    def __post_init__(self) -> None:
        if not isinstance(self.tune, TuneConfig):
            raise TypeError(f"tune must be a TuneConfig, got {type(self.tune).__name__}")
        if self.eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {self.eval_every}")
        if self.position >= 0:
            raise ValueError(f"position counts back from the last post-instruction token (-1 = last), got "
                             f"{self.position}")
        for name in ("n_pairs", "n_boot", "max_new_tokens", "answer_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


CURVES = ("compliance", "control", "forward")
_MOVED = {**moved(config="ElasticityConfig", knobs=("position", "n_pairs", "eval_every", "n_boot", "max_new_tokens",
                                                      "answer_tokens")),
          **{k: f"pairs={{'{k}': (prompts, responses) or prompts}}" for k in CURVES}}


def _config(config: Any) -> ElasticityConfig:
    if isinstance(config, TuneConfig):
        raise TypeError("config= is the study's ElasticityConfig now; pass config=ElasticityConfig(tune=TuneConfig(...))")
    return config if config is not None else ElasticityConfig()


@moved_keywords(_MOVED)
def elasticity_study(base: Model, aligned: Model, data: RefusalData, layer: int,
                     pairs: Mapping[str, Pairs | Sequence[str]] | None = None, judge: Judge | None = None,
                     config: ElasticityConfig | None = None, runtime: Runtime | None = None) -> ElasticityStudy:
    """The compliance, control and (``pairs['forward']`` given) forward curves, their fits and outcomes (module
    docstring). ``pairs['compliance' | 'control']``: (prompts, responses), or prompts the base answers (greedy,
    ``config.answer_tokens``); default the first ``config.n_pairs`` harmful / harmless train prompts of ``data``,
    answered by the base. Both are cut to the smaller size. ``data``: train prompts fit the directions and the
    refusal tokens, test prompts are measured. ``aligned``: a plain model (a merged adapter), never the base's own
    modules. ``runtime``: batch size of the measurements (default 32), ``seed`` of the fits' bootstrap."""
    c, rt = _config(config), runtime if runtime is not None else Runtime(batch_size=32, progress=False)
    pairs = dict(pairs or {})
    if set(pairs) - set(CURVES):
        raise ValueError(f"pairs keys must be among {CURVES}, got {sorted(set(pairs) - set(CURVES))}")
    refuse_shared_adapter(base, aligned, "aligned")
    if 1 + -(-c.tune.steps // c.eval_every) < 5:
        raise ValueError(f"{c.tune.steps} steps evaluated every {c.eval_every} give fewer than 5 points, too few for "
                         f"the two-phase fit; lower eval_every or raise config.tune.steps")
    probe = _probe(base, aligned, data, layer, c.position, judge, c.max_new_tokens, rt.batch_size)
    comp = _pairs(base, pairs.get("compliance"), data.harmful["train"].instructions, c.n_pairs, c.answer_tokens,
                  "compliance")
    ctrl = _pairs(base, pairs.get("control"), data.harmless["train"].instructions, c.n_pairs, c.answer_tokens,
                  "control")
    n = min(len(comp[0]), len(ctrl[0]))
    comp, ctrl = (comp[0][:n], comp[1][:n]), (ctrl[0][:n], ctrl[1][:n])
    runs = [("compliance", "aligned", aligned, comp), ("control", "aligned", aligned, ctrl)]
    if pairs.get("forward") is not None:
        runs.append(("forward", "base", base, _pairs(base, pairs["forward"], [], 0, c.answer_tokens, "forward")))
    with torch.no_grad():
        score_base = probe.measure(base)[0]["score"]
    curves = {name: _curve(name, start, m, ps, c.tune, c.eval_every, probe) for name, start, m, ps in runs}
    score_aligned = curves["compliance"].rows[0]["score"]
    fits = {(name, q): bootstrap_two_phase(cv.steps, cv.per_prompt[q], n_boot=c.n_boot, seed=rt.seed)
            for name, cv in curves.items() for q in FITTED}
    outcomes = [_outcome(cv, score_base if cv.start == "aligned" else score_aligned) for cv in curves.values()]
    return ElasticityStudy(curves, fits, outcomes,
                           meta={"layer": layer, "position": c.position, "n_pairs": n, "config": c.tune.record(),
                                 "eval_every": c.eval_every, "n_boot": c.n_boot, "refusal_tokens": probe.tokens,
                                 "score_base": score_base, "score_aligned": score_aligned, "sizes": data.sizes(),
                                 "n_forward": len(runs[2][3][0]) if len(runs) > 2 else 0})


__all__ = ["Curve", "ElasticityConfig", "ElasticityStudy", "QUANTITIES", "base_answers", "elasticity_study"]
