"""What did a fine-tune add? Crosscoder model diffing: one BatchTopK crosscoder over the base's and the fine-tuned
model's residual stream on the same tokens (:mod:`sae.crosscoder`), its latents classed by decoder-norm ratio and
checked by latent scaling (Minder et al. 2025: a fine-tune-only latent whose direction the base still carries, in
its error or through other latents, is a sparsity artefact), their top contexts, and steering with them against
frequency- and norm-matched random latents.

The causal check (as :mod:`interp.studies.finetune.diffing`, with the crosscoder's fine-tuned-model decoder vectors):
in the tuned model, subtracting the chosen latents' vectors (each scaled by its mean activation at the harmful val
prompts' last token) should lower refusal on held-out harmful prompts more than random latents' vectors of the same
norm; in the base, adding them should raise refusal on held-out harmless prompts more than the random ones.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.capturing import capture
from interp.data import prompt_texts
from interp.evals.controls import matched_random
from interp.evals.judge import Judge
from interp.evals.judge_languages import detect_language, is_degenerate
from interp.evals.rates import fisher_greater, rate_cells
from interp.io import read_json, write_json
from interp.models import Model, load_model, with_chat_template
from interp.studies.kit.prompt_sets import RefusalData
from interp.studies.kit.runs import refusal_rate
from interp.values import Runtime
from sae.contexts import Context
from sae.crosscoder import Crosscoder, check_models
from sae.crosscoder_analysis import Classes, CrossDiff, cross_contexts, cross_diff
from sae.edits import LatentAblation, LatentSteering, MatchedRemoval

if TYPE_CHECKING:
    import pandas as pd


def load_pair(base: str | Model, tuned: str | Model) -> tuple[Model, Model]:
    """The base and its fine-tune (:func:`~interp.models.load_model` names, or loaded models), checked for a
    crosscoder (:func:`sae.crosscoder.check_models`: width, depth, tokenizer, chat template). A fine-tune that also
    taught its base the turn format (``gemma3-aligned``: the pretrained Gemma ships no chat template) carries a
    template the base lacks; the base gets that template (on a copy of its tokenizer), so that the same prompts are
    the same tokens in both models."""
    b, t = (load_model(m) if isinstance(m, str) else m for m in (base, tuned))
    tb, tt = getattr(b.tokenizer, "chat_template", None), getattr(t.tokenizer, "chat_template", None)
    if tt and not tb:
        b = with_chat_template(b, tt)
    check_models(b, t)
    return b, t


def training_prompts(data: RefusalData, n: int, seed: int = 0) -> list[str]:
    """``n`` prompts from the project's prompt sets (every set's ``instruction`` / ``request`` / ``question``),
    deduplicated, none of the refusal data's val or test prompts (the steering is judged on those), in a seeded
    order."""
    held = {p for part in (data.harmful, data.harmless) for s in ("val", "test") for p in part[s].instructions}
    out = sorted(t for t in prompt_texts() if t not in held)
    random.Random(seed).shuffle(out)
    if n > len(out):
        raise ValueError(f"asked for {n} training prompts; the prompt sets hold {len(out)} outside the val/test splits")
    return out[:n]


@dataclass(frozen=True)
class CrossDiffConfig:
    """The study's knobs: the ``n_steer`` latents steered (the fine-tune-only latents that pass latent scaling, most
    active at the harmful val prompts' last token first; fewer exist: the highest norm ratios among those that fire
    there fill up, and ``meta['chosen_classes']`` says which), ``n_random`` matched random draws (firing frequency
    within ``freq_window`` ranks), the ``strengths`` of the added vectors and the multiples
    ``subtract`` of the subtracted ones, ``max_new_tokens`` judged, ``classes``; ``rows_file``: a JSON file that keeps each
    steering condition's row as it finishes, so that a stopped run resumes (:func:`steer_rates`).

    ``ablate``: also remove the latents from the tuned model token by token (:class:`sae.edits.LatentAblation`
    through the crosscoder's tuned-model view, every model's input taken as the tuned activation, the
    reconstruction error kept), the chosen and each random draw alike. Unlike the subtracted vectors, an ablation
    takes out only what the latent writes where it fires, so it cannot push the residual stream off its scale (a
    constant vector at the chosen latents' mean activation can: Gemma 3's massive dimension). Two random controls
    per draw: the draw's latents ablated alike (they fire elsewhere, so they remove other amounts at other tokens),
    and :class:`sae.edits.MatchedRemoval`, which removes at every token exactly as much as the chosen ablation, along
    the draw's decoder vectors: only the second separates "these directions" from "that much removed there"."""

    n_steer: int = 10
    n_random: int = 3
    strengths: tuple[float, ...] = (1.0, 4.0)
    subtract: tuple[float, ...] = (1.0,)
    max_new_tokens: int = 24
    freq_window: int = 20
    n_contexts: int = 3
    classes: Classes = field(default_factory=Classes)
    rows_file: str | None = None
    ablate: bool = False

    def __post_init__(self) -> None:
        if self.n_steer < 1 or self.n_random < 0 or self.max_new_tokens < 1 or self.freq_window < 1:
            raise ValueError("n_steer, max_new_tokens and freq_window must be >= 1 and n_random >= 0")
        object.__setattr__(self, "strengths", tuple(float(s) for s in self.strengths))
        object.__setattr__(self, "subtract", tuple(float(s) for s in self.subtract))


@dataclass
class CrossDiffStudy(Result):
    """``diff``: classes, ratios, frequencies and latent scaling over the training tokens read; ``chosen``: the
    steered latents with ``mean_act`` (their mean activation at the harmful val prompts' last token); ``contexts``:
    their top contexts; ``rates``: one row per steering condition (rate, ``k``, ``n``, ``ci95``); ``meta``: site,
    sizes, tests."""

    diff: CrossDiff
    chosen: list[int]
    mean_act: torch.Tensor
    contexts: dict[int, list[Context]]
    rates: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {"counts": self.diff.counts(), "true_tuned_only": len(self.diff.true_tuned_only()),
                "chosen": self.chosen, "chosen_classes": self.meta.get("chosen_classes"),
                "rates": rate_cells(self.rates, ("condition", "split")), "tests": self.meta.get("tests")}

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.rates)

    def plot(self, title: str | None = None) -> Any:
        from interp.viz.refusal import refusal_rates

        names = [f"{r['condition']} ({r['split']})" for r in self.rates]
        fig = refusal_rates(dict(zip(names, (r["rate"] for r in self.rates))),
                            dict(zip(names, (r["ci95"] for r in self.rates))))
        return fig.update_layout(title=title or "Refusal when steering with crosscoder latents")


def last_token_latents(cc: Crosscoder, base: Model, tuned: Model, prompts: Sequence[str]) -> torch.Tensor:
    """The crosscoder's latents ``[n, d_sae]`` at each prompt's last token (both models on the same tokens)."""
    xs = [capture(m, list(prompts), sites=[cc.site], positions="last", runtime=Runtime(progress=False)).tensor[:, 0]
          for m in (base, tuned)]
    with torch.no_grad():
        return cc.encode(cc.join(*(x.reshape(len(prompts), -1).to(cc.device) for x in xs))).float().cpu()


def choose(diff: CrossDiff, mean_act: torch.Tensor, n: int) -> tuple[list[int], list[str]]:
    """The steered latents and the class each was chosen as (module docstring of :class:`CrossDiffConfig`)."""
    true = sorted(diff.true_tuned_only(), key=lambda j: -float(mean_act[j]))
    chosen = [j for j in true if mean_act[j] > 0][:n]
    kinds = ["tuned-only, passes latent scaling"] * len(chosen)
    if len(chosen) < n:
        ratio = torch.nan_to_num(diff.ratios, nan=-1.0)
        rest = [j for j in ratio.argsort(descending=True).tolist() if mean_act[j] > 0 and j not in chosen]
        for j in rest[:n - len(chosen)]:
            chosen.append(j)
            kinds.append(f"{diff.classes[j]} (ratio {float(diff.ratios[j]):.2f})")
    return chosen, kinds


NORM_MATCHED = "norm-matched random"


def _random_draws(chosen: list[int], freq: torch.Tensor, n_draws: int, window: int, seed: int) -> list[list[int]]:
    order = freq.argsort().tolist()
    pos = {lat: i for i, lat in enumerate(order)}
    rng = random.Random(seed)
    return [matched_random(chosen, lambda lat: order[max(0, pos[lat] - window):pos[lat] + window + 1], rng,
                           what="latent") for _ in range(n_draws)]


def _matched(view: Any, rand: list[int], norm: float, sign: float) -> LatentSteering:
    scale = sign * norm / max(float(LatentSteering(view, rand, 1.0).vector().norm()), 1e-12)
    return LatentSteering(view, rand, scale, sinks="exclude")


def _conditions(models: tuple[Model, Model], view: Any, chosen: list[int], w: list[float], draws: list[list[int]],
                data: RefusalData, c: CrossDiffConfig, view_same: Any = None
                ) -> list[tuple[dict[str, Any], Model, list[str], list]]:
    """Every steering condition: (its row's labels, the model, the prompts, the edits). ``view`` / ``view_same``:
    the crosscoder's tuned-model views (``inputs="alone"`` / ``"same"``)."""
    base, tuned = models
    harm, safe = data.harmful["test"].instructions, data.harmless["test"].instructions
    norm = float(LatentSteering(view, chosen, w).vector().norm())
    out: list[tuple[dict[str, Any], Model, list[str], list]] = [
        ({"condition": "tuned", "split": "harmful"}, tuned, harm, [])]
    for m in c.subtract:
        tag = "" if m == 1.0 else f" x{m:g}"
        out.append(({"condition": f"tuned, chosen latents subtracted{tag}", "split": "harmful",
                     "latents": chosen}, tuned, harm, [LatentSteering(view, chosen, [-m * x for x in w],
                                                                      sinks="exclude")]))
        out += [({"condition": f"tuned, random latents subtracted{tag} (draw {i})", "split": "harmful",
                  "latents": r}, tuned, harm, [_matched(view, r, m * norm, -1.0)])
                for i, r in enumerate(draws)]
    if c.ablate:
        out.append(({"condition": "tuned, chosen latents ablated", "split": "harmful", "latents": chosen}, tuned, harm,
                    [LatentAblation(view_same, chosen, sinks="exclude")]))
        out += [({"condition": f"tuned, random latents ablated (draw {i})", "split": "harmful", "latents": r},
                 tuned, harm, [LatentAblation(view_same, r, sinks="exclude")]) for i, r in enumerate(draws)]
        out += [({"condition": f"tuned, {NORM_MATCHED} latents ablated (draw {i})", "split": "harmful", "latents": r},
                 tuned, harm, [MatchedRemoval(view_same, chosen, r, sinks="exclude")]) for i, r in enumerate(draws)]
    out.append(({"condition": "base", "split": "harmless"}, base, safe, []))
    for s in c.strengths:
        out.append(({"condition": f"base, chosen latents added x{s:g}", "split": "harmless", "strength": s,
                     "latents": chosen}, base, safe, [LatentSteering(view, chosen, [s * x for x in w], sinks="exclude")]))
        out += [({"condition": f"base, random latents added x{s:g} (draw {i})", "split": "harmless", "strength": s,
                  "latents": r}, base, safe, [_matched(view, r, s * norm, 1.0)]) for i, r in enumerate(draws)]
    return out


def answer_checks(texts: Sequence[str]) -> dict[str, int]:
    """How many answers are broken (:func:`interp.evals.judge_languages.is_degenerate`) and how many are not in
    English (the judged prompts are English): a refusal rate alone cannot tell an edit that makes the model comply
    from one that makes it babble."""
    return {"degenerate": sum(is_degenerate(t) for t in texts),
            "non_english": sum(detect_language(t) != "en" for t in texts)}


def steer_rates(models: tuple[Model, Model], cc: Crosscoder, chosen: list[int], weights: torch.Tensor,
                draws: list[list[int]], data: RefusalData, c: CrossDiffConfig, judge: Judge | None) -> list[dict]:
    """Refusal under each condition: the tuned model on harmful test prompts minus the chosen (or random) latents'
    tuned-model vectors, the base on harmless test prompts plus them at each strength. With ``c.rows_file`` each
    condition's row is saved there as it finishes and read back by a rerun with the same latents, draws, prompts
    and generation length (a stopped run loses one condition at most; a saved row whose latents differ, or that
    lacks the answer checks, is recomputed). Each row also counts its broken and non-English answers
    (:func:`answer_checks`)."""
    w = weights.tolist()
    key = {"chosen": chosen, "weights": [round(x, 5) for x in w], "draws": draws, "test": data.digest("test"),
           "max_new_tokens": c.max_new_tokens, "judge": type(judge).__name__}
    done: dict[str, dict[str, Any]] = {}
    path = Path(c.rows_file) if c.rows_file else None
    if path is not None and path.exists():
        saved = read_json(path)
        done = saved["rows"] if saved.get("key") == key else {}
    rows = []
    same = cc.view(1, inputs="same") if c.ablate else None
    for labels, model, prompts, edits in _conditions(models, cc.view(1), chosen, w, draws, data, c, same):
        saved_row = done.get(labels["condition"])
        if saved_row is None or saved_row.get("latents") != labels.get("latents") or "degenerate" not in saved_row:
            r = refusal_rate(model, prompts, judge, c.max_new_tokens, edits)
            done[labels["condition"]] = {**labels, **r, **answer_checks(r.texts)}
            if path is not None:
                write_json(path, {"key": key, "rows": done})
        rows.append(done[labels["condition"]])
    return rows


def tests(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One-sided Fisher tests of the chosen latents against the pooled random draws, per comparison."""
    out = []
    for split, lower in (("harmful", True), ("harmless", False)):
        chosen_rows = [r for r in rows if r["split"] == split and "chosen" in r["condition"]]
        for ch, control in ((ch, control) for ch in chosen_rows for control in ("random", NORM_MATCHED)):
            tag = ch["condition"].replace("chosen", control) + " (draw"
            rand = [r for r in rows if r["condition"].startswith(tag)]
            if not rand:
                continue
            k_r, n_r = sum(r["k"] for r in rand), sum(r["n"] for r in rand)
            a, b = ((k_r, n_r), (ch["k"], ch["n"])) if lower else ((ch["k"], ch["n"]), (k_r, n_r))
            out.append({"condition": ch["condition"], "control": control, "chosen": f"{ch['k']}/{ch['n']}",
                        "random": f"{k_r}/{n_r}",
                        "p": fisher_greater(a[0], a[1], b[0], b[1]),
                        "hypothesis": "random refuse more" if lower else "chosen refuse more"})
    return out


def crossdiff_study(models: tuple[Model, Model], cc: Crosscoder, xs: Sequence[torch.Tensor], data: RefusalData,
                    judge: Judge | None = None, config: CrossDiffConfig | None = None,
                    runtime: Runtime | None = None) -> CrossDiffStudy:
    """Read the trained crosscoder ``cc`` (over ``models = (base, tuned)`` at ``cc.site``) on the token rows ``xs``
    (one ``[n, d]`` per model, e.g. its training data), choose latents, steer (module docstring)."""
    c = config if config is not None else CrossDiffConfig()
    base, tuned = models
    check_models(base, tuned)
    seed = (runtime or Runtime()).seed
    diff = cross_diff(cc, xs, c.classes)
    val = data.harmful["val"].instructions
    mean_act = last_token_latents(cc, base, tuned, val).mean(0)
    chosen, kinds = choose(diff, mean_act, c.n_steer)
    draws = _random_draws(chosen, diff.freq, c.n_random, c.freq_window, seed)
    probe = val + data.harmless["val"].instructions
    contexts = cross_contexts(models, cc, chosen, probe, top=c.n_contexts)
    rows = steer_rates(models, cc, chosen, mean_act[chosen], draws, data, c, judge)
    return CrossDiffStudy(diff, chosen, mean_act, contexts, rows,
                          meta={"site": cc.site, "seed": seed, "sizes": data.sizes(), "chosen_classes": kinds,
                                "draws": draws, "tests": tests(rows)})


__all__ = ["CrossDiffConfig", "CrossDiffStudy", "crossdiff_study", "load_pair", "training_prompts"]
