"""The refusal job's outputs from its typed stage results: notes, metrics.json, direction, edit specs, generations, report."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from interp.chat import has_chat_template
from interp.io import atomic_write, write_json
from interp.models import Model
from interp.studies.kit.config import RefusalConfig
from interp.studies.kit.prompt_sets import RefusalData
from interp.studies.refusal.cache import Run
from interp.studies.refusal.conditions import evaluated_edits
from interp.studies.refusal.diagnosis import effect_check, effect_notes, random_kl_text
from interp.studies.refusal.estimate import search_metrics
from interp.studies.refusal.frontier import frontier_outputs
from interp.studies.refusal.report import refusal_report
from interp.studies.refusal.result import RefusalResult


def start_notes(model: Model) -> list[str]:
    """Notes known before any stage runs (e.g. the plain-prompt fallback for a model without a chat template)."""
    if not has_chat_template(model):
        return ["the model has no chat template: prompts use the plain 'User: ...\\nAssistant:' fallback"]
    return []


def outcome_notes(cfg: RefusalConfig, res: RefusalResult) -> list[str]:
    """Why no direction was reported, when none was; which causal checks a found direction failed."""
    tok, sel, s, diag = res.tokens, res.selection, cfg.selection, res.diagnosis
    if diag is not None and not diag.refuses:
        return [diag.finding]
    if res.evaluation is not None:
        return effect_notes(effect_check(res.evaluation.refused, s.diagnosis_alpha), s.diagnosis_alpha)
    if tok is not None and not tok.tokens:
        return [f"the model refused {tok.train_refusal_harmful:.0%} of harmful training prompts: it has no refusals "
                f"to find refusal tokens from, so no refusal direction can be selected"]
    if sel is not None and not sel.found:
        scored = "" if s.search == "exhaustive" else (
            f" among the top {s.top_k} by attribution estimate, the only ones scored exactly (--search exhaustive "
            f"or a larger --top-k scores more)")
        notes = [f"no candidate passes the filters (layer < {1 - s.prune_layer_fraction:.0%} of depth, KL < "
                 f"{sel.filters['kl_threshold']:.3g}, induce score > {s.induce_threshold}, bypass below baseline){scored}: no refusal "
                 f"direction is reported"]
        level = random_kl_text(res.scores.kl_random if res.scores is not None else [], s.kl_threshold)
        if level:  # is the KL filter's threshold above what any ablation costs on this model?
            notes.append(f"the KL filter's reference: {level}")
        if s.ablate_positions == "all":
            n_scored = res.scores.n_scored if res.scores is not None else 0
            notes.append(f"the ablation acted at every token ({sel.passing.get('kl', 0)} of the {n_scored} candidates "
                         f"scored exactly pass the KL filter): an every-token ablation also edits the instruction tokens; "
                         f"--ablate-positions post_instruction (or the default, auto) edits only the post-instruction "
                         f"and generated tokens when every-token ablation finds nothing (on smollm2-aligned it finds "
                         f"a direction where this finds none)")
        return notes
    return []


def build_metrics(cfg: RefusalConfig, model: Model, data: RefusalData, res: RefusalResult) -> dict[str, Any]:
    """``metrics.json``: the data (sources, sample sizes, seed), the diagnosis, one section per stage that ran."""
    tok, cand, sel, ev, sub = res.tokens, res.candidates, res.selection, res.evaluation, res.subspaces
    assert tok is not None
    m: dict[str, Any] = {"model": cfg.runtime.model, "family": model.spec.family, "n_layers": model.n_layers,
                         "data": data.source, "sizes": data.sizes(), "seed": cfg.data.seed,
                         "judge": cfg.runtime.judge or "phrases (anchored at the response start)",
                         "refusal_tokens": tok.strings,
                         "train_refusal_rate": {"harmful": tok.train_refusal_harmful,
                                                "harmless": tok.train_refusal_harmless}}
    if res.diagnosis is not None:
        m["diagnosis"] = res.diagnosis.as_dict()
    if cand is not None:
        m["candidates"] = {"layers": cand.layers, "positions": list(range(-cand.n_positions, 0)),
                           "position_tokens": cand.pos_tokens}
    if sel is not None:
        m["selection"] = {"baseline_refusal_score": sel.baseline_refusal_score, "filters": sel.filters,
                          "passing": sel.passing, "ablate_positions": cfg.selection.ablate_positions,
                          "kl_rejected": sel.kl_rejected}
        if res.ablation_search:  # ablate_positions="auto": every mode searched, in order
            m["selection"]["ablation_search"] = res.ablation_search
        if res.scores is not None:
            m["selection"].update(search_metrics(cfg.selection, res.estimate, res.scores))
        if sel.found:
            m["selection"].update({"layer": sel.layer, "position": sel.position, "position_token": sel.position_token,
                                   "bypass_score": sel.bypass_score, "induce_score": sel.induce_score, "kl": sel.kl,
                                   "norm": float(res.direction.norms[0])})
    if ev is not None:
        rates = ev.rates()
        m["evaluation"] = {"refusal_rate": ev.refusal_rate, "refusal": rates, "refusal_score": ev.refusal_score,
                           "hook_vs_baked": ev.hook_vs_baked, "harmless_kl_ce": ev.harmless_kl_ce,
                           "causal_checks": effect_check(ev.refused, cfg.selection.diagnosis_alpha)}
        over = {k.split("/", 1)[1]: v for k, v in rates.items() if k.startswith("borderline/")}
        if over:
            m["over_refusal"] = over
    if res.writers is not None:
        m["writers"] = res.writers.summary()
    if sub is not None:
        m["subspaces"] = {"basis_order": ["refusal direction"] + sub.categories, "rank": sub.ranks,
                          "harmful_refusal_rate": sub.rates, "harmful_refusal_score": sub.scores,
                          "random_control": {"harmful_refusal_rate": sub.control_rates,
                                             "harmful_refusal_score": sub.control_scores}}
    m["found_direction"] = res.direction is not None
    m["notes"] = res.notes
    return m


def write_generations(path: Path, data: RefusalData, res: RefusalResult) -> None:
    """``generations.jsonl``: one line per (condition, prompt) with the response and the judge's verdict: the
    baseline on the train prompts (what the diagnosis read; always), then every test condition that ran."""
    tok, ev = res.tokens, res.evaluation
    assert tok is not None
    rows: list[tuple[str, Any, list[str], list[bool]]] = [
        ("train/harmful baseline", data.harmful["train"], tok.harmful_texts, tok.harmful_refused),
        ("train/harmless baseline", data.harmless["train"], tok.harmless_texts, tok.harmless_refused)]
    if ev is not None:
        for cond, texts in ev.generations.items():
            which = cond.split("/", 1)[0]
            prompts = data.borderline if which == "borderline" else getattr(data, which)["test"]
            rows.append((cond, prompts, texts, ev.refused.get(cond, [])))
    sets = {"harmful": data.harmful["test"], "harmless": data.harmless["test"], "borderline": data.borderline}
    for cond, texts in (res.frontier.generations if res.frontier is not None else {}).items():  # --search frontier
        rows.append((f"frontier/{cond}", sets[cond.rsplit("/", 1)[1].replace("control_", "")], texts, []))
    lines = []
    for cond, prompts, texts, flags in rows:
        for i, (p, t) in enumerate(zip(prompts.instructions, texts)):
            cat = prompts.categories[i] if i < len(prompts.categories) else "all"
            lines.append(json.dumps({"condition": cond, "instruction": p, "category": cat, "response": t,
                                     "refused": bool(flags[i]) if i < len(flags) else None}))
    atomic_write(path, lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))


def save_edits(run: Run, model: Model, cfg: RefusalConfig, data: RefusalData, res: RefusalResult) -> dict[str, str]:
    """Every evaluated edit as a spec in ``out/edits`` (``steering.load_edit`` rebuilds it): ``{condition: path}``."""
    import steering
    from steering.specs import model_record

    folder = run.replace_dir("edits")
    if res.evaluation is None or res.selection is None or res.direction is None:
        return {}
    edits = evaluated_edits(model, res.direction, res.selection.layer, cfg.data.seed, data.borderline is not None,
                            cfg.selection.ablate_positions)
    record = model_record(model)
    names = {cond: cond.replace("/", "-").replace(" ", "_") for cond in edits}
    return {cond: str(steering.save_edit(edit, folder / names[cond], record=record).relative_to(run.out))
            for cond, edit in edits.items()}


def save_baked(run: Run, model: Model, res: RefusalResult) -> str:
    """Bake the direction's ablation into the weights and save an HF model folder ``out/model``."""
    import steering
    from steering.bias import check_saveable

    baked = steering.bake(model, res.direction.vectors[0], allow_inexact=True).model
    check_saveable(baked, "the refusal pipeline's saved model")
    target = run.replace_dir("model")
    baked.hf.save_pretrained(target)
    model.tokenizer.save_pretrained(target)
    return str(target)


def finish(run: Run, model: Model, cfg: RefusalConfig, data: RefusalData, res: RefusalResult,
           say: Callable[[str, str], None], save_frontier: bool = False) -> RefusalResult:
    """Write every output of the run into its folder and return the result (``save_frontier``: bake and save the
    frontier's chosen point into ``out/frontier_model``)."""
    res.notes += outcome_notes(cfg, res)
    if res.selection is not None and res.selection.found:
        assert res.candidates is not None
        res.direction = res.selection.direction(res.candidates, model.name)
        res.direction.save(run.replace_dir("direction"))
    else:
        run.remove_outputs("direction", "model")
    write_generations(run.out / "generations.jsonl", data, res)
    res.metrics = build_metrics(cfg, model, data, res)
    res.metrics["edits"] = save_edits(run, model, cfg, data, res)   # steering.load_edit(out / path)
    if res.frontier is not None and res.candidates is not None:
        target = run.replace_dir("frontier_model") if save_frontier else None
        res.metrics["frontier"] = frontier_outputs(run.out, model, res.frontier, res.candidates, target)
        res.metrics["edits"] |= res.metrics["frontier"].pop("specs")
    res.metrics["generation"] = {"max_new_tokens": cfg.generation.max_new_tokens, "sampling": "greedy",
                                 "batch_size": cfg.runtime.batch_size}
    if res.direction is not None and cfg.runtime.save_model:
        say("save model", "start")
        res.metrics["saved_model"] = save_baked(run, model, res)
        say("save model", "done")
    write_json(run.out / "metrics.json", res.metrics)
    say("report", "start")
    html = refusal_report(res, model_name=model.name, family=model.spec.family, n_layers=model.n_layers)
    atomic_write(run.out / "report.html", lambda tmp: Path(tmp).write_text(html))
    say("report", "done")
    return res
