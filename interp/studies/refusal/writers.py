"""Which writers put the refusal direction into the residual stream: ablate it from one group at a time.

Every write to the residual stream comes from the embedding (``resid_pre`` of layer 0), an attention output or
an MLP output (for a mixture of experts: the routed experts' weighted sum plus the gated shared expert). Projecting
``r`` out is linear, so ablating it from every group at once is :class:`steering.DirectionalAblation` exactly
(the stage measures that identity, and routed + shared = MLP, in logits). Each group is also ablated along a
seeded random unit direction orthogonal to ``r``: the control of the same edit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float

from interp.bundle import Result
from interp.evals.judge import Judge
from interp.evals.logits import refusal_score
from interp.evals.rates import Rate, rate
from interp.models import Model
from interp.studies.kit.config import RefusalConfig
from interp.studies.kit.scoring import ablation
from interp.studies.kit.stages import RefusalTokens
from interp.studies.kit.writer_sites import embedding_note, moe_layers, writer_groups
from interp.studies.refusal.evaluation import STAGE_MOVED, Evaluation, TestPrompts
from interp.values import Runtime, moved_keywords
from probes.directions import random_orthogonal

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class Writers(Result):
    """Refusal on the harmful test prompts with ``r`` (and an orthogonal control) ablated from one writer group at
    a time. ``rows``: one per condition, ``{group, direction, sites, n, refused, rate, low, high, score}`` (``low``
    / ``high`` a 95% Wilson interval of the greedy generations' refusal rate, ``score`` the mean first-token
    refusal score); ``checks``: max |logit diff| of the identities; ``embedding``: what layer 0's resid_pre holds."""

    rows: list[dict[str, Any]]
    embedding: str
    checks: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    control: str = ""

    def row(self, group: str, direction: str = "refusal direction") -> dict[str, Any]:
        """The row of ``group`` (``"baseline"``, ``"attention"``, ...) ablated along ``direction``."""
        for r in self.rows:
            if r["group"] == group and (group == "baseline" or r["direction"] == direction):
                return r
        raise KeyError(f"no row for {group!r} / {direction!r}; groups: {self.groups}")

    @property
    def groups(self) -> list[str]:
        """The writer groups ablated, in order (the baseline excluded)."""
        return list(dict.fromkeys(r["group"] for r in self.rows if r["group"] != "baseline"))

    def summary(self) -> dict[str, Any]:
        """The ``metrics.json`` section."""
        return {"rows": self.rows, "embedding": self.embedding, "checks": self.checks, "control": self.control,
                "notes": self.notes}

    def to_frame(self) -> pd.DataFrame:
        """One row per condition: ``group``, ``direction``, ``sites``, the :meth:`~interp.evals.rates.Rate.columns`
        (rate, k, n, low, high) and the mean first-token refusal ``score``."""
        import pandas as pd

        return pd.DataFrame([{"group": r["group"], "direction": r["direction"], "sites": r["sites"],
                              **Rate(r["k"], r["n"]).columns(), "score": r["score"]} for r in self.rows])

    def table(self) -> tuple[list[str], list[list[Any]]]:
        """Header and rows of the report's table."""
        head = ["writers ablated", "sites", "direction", "refused / n", "refusal rate", "95% interval",
                "mean refusal score"]
        body = [[r["group"], r["sites"], r["direction"], f"{r['k']} / {r['n']}", f"{r['rate']:.0%}",
                 f"{r['ci95'][0]:.0%} - {r['ci95'][1]:.0%}", f"{r['score']:.3f}"] for r in self.rows]
        return head, body

    def plot(self) -> Any:
        """Bars per writer group with 95% intervals, the orthogonal control beside each (:func:`viz.refusal.writer_bars`)."""
        from interp.viz.refusal import writer_bars

        real = [self.row(g) for g in self.groups]
        ctrl = [self.row(g, "orthogonal control") for g in self.groups]
        base = self.row("baseline")

        def cols(rs: list[dict[str, Any]], k: str, i: int | None = None) -> list[float]:
            return [r[k] if i is None else r[k][i] for r in rs]

        return writer_bars(self.groups, (cols(real, "rate"), cols(real, "ci95", 0), cols(real, "ci95", 1)),
                           (cols(ctrl, "rate"), cols(ctrl, "ci95", 0), cols(ctrl, "ci95", 1)),
                           baseline=(base["rate"], tuple(base["ci95"])))


def identity_checks(model: Model, test: TestPrompts, r: Float[torch.Tensor, " d"], batch_size: int = 64,
                    positions: str = "all") -> dict[str, float]:
    """Max |logit diff| on the harmful test prompts: attention + MLP + embedding groups together vs all writers
    (DirectionalAblation), and routed + shared experts (+ dense MLP layers) vs the MLP group."""
    groups, _ = writer_groups(model, positions)

    def logits(names: list[str], extra: tuple = ()) -> torch.Tensor:
        return test.last_logits("harmful", (*[iv for g in names for iv in groups[g][1](r)], *extra), batch_size)

    out = {"attention + MLP + embedding vs all writers": float(
        (logits(["attention", "MLP", "embedding"]) - logits(["all writers"])).abs().max())}
    routed, _ = moe_layers(model)
    if routed:
        dense = [i for i in range(model.n_layers) if i not in routed]
        parts = [g for g in ("routed experts", "shared expert") if g in groups]
        rest = (ablation(r, positions, sites="mlp_out", layers=dense),) if dense else ()
        out[" + ".join(parts) + " vs MLP"] = float((logits(parts, rest) - logits(["MLP"])).abs().max())
    return out


def _measure(model: Model, test: TestPrompts, conditions: list[list[Any]], tokens: RefusalTokens,
             max_new_tokens: int, batch_size: int, judge: Judge | None = None) -> list[dict[str, Any]]:
    """Per condition: refused / n, rate and Wilson interval of greedy generations of the harmful test prompts, and
    the mean first-token refusal score (the conditions stacked, :meth:`TestPrompts.judged_many`)."""
    out = []
    for _, flags, logits in test.judged_many("harmful", conditions, max_new_tokens, batch_size, judge, model):
        out.append({**rate(flags), "score": refusal_score(logits, tokens.tokens).mean().item()})
    return out


def _from_evaluation(ev: Evaluation | None) -> dict[tuple[str, str], dict[str, Any]]:
    """The rows the evaluation stage already measured: baseline, all writers along r and along the control."""
    if ev is None:
        return {}
    out = {}
    for key, cond in ((("baseline", "none"), "harmful/baseline"),
                      (("all writers", "refusal direction"), "harmful/ablation"),
                      (("all writers", "orthogonal control"), "harmful/orthogonal ablation")):
        if cond in ev.refused and cond in ev.refusal_score:
            out[key] = {**rate(ev.refused[cond]), "score": ev.refusal_score[cond]}
    return out


@moved_keywords({k: v for k, v in STAGE_MOVED.items() if k not in ("test", "rank")})
def writer_attribution(model: Model, test: TestPrompts, r: Float[torch.Tensor, " d"], tokens: RefusalTokens,
                       evaluation: Evaluation | None = None, config: RefusalConfig | None = None,
                       runtime: Runtime | None = None) -> Writers:
    """Ablate the unit refusal direction ``r [d]`` from each writer group (and, as a control, a random unit
    direction orthogonal to it, seeded with ``runtime.seed``) and measure refusal on the harmful test prompts
    (judged by ``test.judge``); see :class:`Writers`. ``config``: ``generation.max_new_tokens`` and
    ``selection.ablate_at()``; ``runtime``: default batch size 64.

    ``evaluation`` (the evaluation stage of the same direction, prompts and seed) already holds the baseline and
    the all-writers ablation and its orthogonal control (the same edits): those rows are read from it."""
    cfg = config if config is not None else RefusalConfig()
    rt = runtime if runtime is not None else Runtime(batch_size=64, progress=False)
    max_new_tokens, batch_size, seed, judge = cfg.generation.max_new_tokens, rt.batch_size, rt.seed, test.judge
    ablate_positions = cfg.selection.ablate_at()
    r = torch.as_tensor(r).detach().float().cpu()
    if r.dim() != 1 or r.shape[0] != model.d_model:
        raise ValueError(f"r must be one direction of width {model.d_model} (the model's d_model), got shape "
                         f"{tuple(r.shape)}; pass Direction.vectors[0]")
    if abs(float(r.norm()) - 1) > 1e-4:
        raise ValueError(f"r must be a unit vector (norm {float(r.norm()):.4g}); pass Direction.vectors[0], not .raw")
    if not tokens.tokens:
        raise ValueError("no refusal tokens: the model never refused, so there is no refusal to attribute")
    u = random_orthogonal(r[None], 1, seed=seed)[0].vectors[0]
    groups, notes = writer_groups(model, ablate_positions)
    known = _from_evaluation(evaluation)
    plan = [("baseline", "none", "nothing ablated", [])] + [
        (name, label, sites, make(d)) for name, (sites, make) in groups.items()
        for label, d in (("refusal direction", r), ("orthogonal control", u))]
    todo = [(name, label, ivs) for name, label, _, ivs in plan if (name, label) not in known]
    measured = _measure(model, test, [ivs for _, _, ivs in todo], tokens, max_new_tokens, batch_size, judge)
    known |= {(name, label): got for (name, label, _), got in zip(todo, measured)}
    rows = [{"group": name, "direction": label, "sites": sites, **known[(name, label)]} for name, label, sites, _ in plan]
    return Writers(rows, embedding_note(model), identity_checks(model, test, r, batch_size, ablate_positions), notes,
                   f"a random unit direction orthogonal to r (probes.directions.random_orthogonal, seed {seed})")


__all__ = ["Writers", "embedding_note", "identity_checks", "moe_layers", "writer_attribution", "writer_groups"]  # the last three from the kit
