"""The refusal pipeline's HTML report from the typed stage results: heatmaps, projections, rates, generations."""

from __future__ import annotations

import html
import math
from typing import Any

import torch

from interp.studies.refusal.diagnosis import random_kl_text
from interp.studies.refusal.result import RefusalResult
from interp.viz.html import kv_table, page, table


def _summary(res: RefusalResult, model_name: str, family: str, n_layers: int) -> str:
    notes = "".join(f"<p class='note'>{html.escape(n)}</p>" for n in res.notes)
    tok, sel, m, diag = res.tokens, res.selection, res.metrics, res.diagnosis
    rows: list[tuple[str, Any]] = [
        ("model", model_name), ("family", family), ("layers", n_layers)]
    rows += [(f"data: {k}", v) for k, v in m.get("data", {}).items()]
    rows += [(f"prompts: {k}", ", ".join(f"{part} {n}" for part, n in v.items())) for k, v in m.get("sizes", {}).items()]
    rows += [("seed (splits, controls)", m.get("seed")), ("judge", m.get("judge"))]
    if diag is not None:
        h, s = diag.harmful, diag.harmless
        rows += [("baseline refusal on train prompts", f"harmful {_rate(h)}; harmless {_rate(s)}"),
                 ("diagnosis", f"{diag.test}: p = {diag.p_value:.2g} (alpha {diag.alpha:g}); "
                               f"{'refuses' if diag.refuses else 'does not refuse: stopped before scoring'}")]
    rows += [("refusal tokens", ", ".join(repr(t) for t in (tok.strings if tok else []))),
             ("direction found", res.direction is not None)]
    if sel is not None and sel.found:
        rows += [("selected layer", sel.layer), ("selected position", f"{sel.position} ({sel.position_token!r})"),
                 ("bypass score", sel.bypass_score), ("induce score", sel.induce_score), ("KL", sel.kl)]
    if sel is not None:
        rows += _filter_rows(sel, n_layers)
    if sel is not None and res.scores is not None and res.scores.kl_random:
        rows += [("KL of random directions (the KL filter's reference)",
                  random_kl_text(res.scores.kl_random, sel.filters["kl_threshold"]))]
    return notes + kv_table(rows)


def _rate(r: dict[str, Any]) -> str:
    """``k/n (rate, 95% CI low-high)``."""
    return f"{r['k']}/{r['n']} ({100 * r['rate']:.0f}%, 95% CI {100 * r['ci95'][0]:.0f}-{100 * r['ci95'][1]:.0f}%)"


def _rate_table(rates: dict[str, dict[str, Any]]) -> str:
    """Every condition's refusal rate with its count, sample size and interval."""
    head = "<tr><th>condition</th><th>refused / n</th><th>rate</th><th>95% Wilson interval</th></tr>"
    body = "".join(f"<tr><td>{html.escape(c)}</td><td>{r['k']} / {r['n']}</td><td>{100 * r['rate']:.1f}%</td>"
                   f"<td>{100 * r['ci95'][0]:.1f}% - {100 * r['ci95'][1]:.1f}%</td></tr>" for c, r in rates.items())
    return f"<table>{head}{body}</table>"


def _filter_rows(sel: Any, n_layers: int) -> list[tuple[str, Any]]:
    """How many (layer x position) candidates pass all filters, and each filter alone, each with its rule."""
    p, f = sel.passing, sel.filters
    depth = math.floor(n_layers * (1 - f["prune_layer_fraction"]))
    return [("candidates passing all filters", f"{p['all']} of {p['of']} (layer x position candidates)"),
            ("passing each filter alone", f"depth (layer < {depth}): {p['layer']} of {p['of']}; "
             f"KL < {f['kl_threshold']:g}: {p['kl']}; induce score > {f['induce_threshold']:g}: {p['induce']}; "
             f"bypass score below the harmful baseline: {p['bypass']}")]


def _candidate_sections(res: RefusalResult) -> list[tuple[str, Any]]:
    from interp.viz import refusal as F

    sc, cand, sel = res.scores, res.candidates, res.selection
    if sc is None or cand is None:
        return []
    found = sel is not None and sel.found
    li, pi = (sel.layer_index, sel.position_index) if found else (0, cand.n_positions - 1)  # type: ignore[union-attr]
    r = torch.nn.functional.normalize(cand.raw[li, pi], dim=-1)
    return [
        ("Candidate scores", sc.plot(cand, sel)),
        ("Projections", F.projections_by_layer(cand.harmful_acts[:, :, pi] @ r, cand.harmless_acts[:, :, pi] @ r,
                                               cand.layers)),
        ("Cosine similarity of candidates across layers", cand.plot(pi - cand.n_positions)),
    ]


def _estimate_sections(res: RefusalResult) -> list[tuple[str, Any]]:
    """search='estimate': the attribution estimates of every candidate (the exact maps above hold the top k)."""
    est, cand, sc = res.estimate, res.candidates, res.scores
    if est is None or cand is None or sc is None:
        return []
    title = (f"Candidate estimates (first order, every candidate; the {sc.n_scored} scored exactly are in the maps "
             "above; no KL)")
    return [(title, est.plot(cand, res.selection, kl=False))]


def _evaluation_sections(res: RefusalResult) -> list[tuple[str, Any]]:
    ev, sub = res.evaluation, res.subspaces
    out: list[tuple[str, Any]] = []
    if ev is not None:
        out.append(("Refusal rates with controls", ev.plot()))
        out.append(("Refusal rates: counts and 95% intervals (borderline = over-refusal on benign look-alikes)",
                    _rate_table(ev.rates())))
        eq = ev.hook_vs_baked
        baked = ([("max |logit diff| hook vs baked", eq["max_abs_logit_diff"]), ("relative", eq["rel_logit_diff"]),
                  ("architecture bakes exactly", eq["exact_architecture"]),
                  ("baked compared with", eq.get("compared_with", "harmful/ablation"))] +
                 [("baked weights", n) for n in eq.get("notes", [])] if eq["max_abs_logit_diff"] is not None
                 else [("baked weights", "; ".join(eq["notes"]))])
        out.append(("Hook ablation vs baked weights, KL and CE", kv_table(
            baked +
            [(f"harmless {k}", v) for k, v in ev.harmless_kl_ce.items()] +
            [(f"refusal score: {k}", v) for k, v in ev.refusal_score.items()])))
    if sub is not None and sub.ranks:
        out.append(("Subspace ablation", res.plot("subspaces")))
    if ev is not None:
        rows = [f"<tr><td>{html.escape(cond)}</td><td>{html.escape(t)}</td></tr>"
                for cond in ("harmful/baseline", "harmful/ablation", "harmless/baseline", "harmless/addition",
                             "borderline/baseline")
                for t in ev.generations.get(cond, [])[:4]]
        out.append(("Example generations", "<table><tr><th>condition</th><th>response</th></tr>" + "".join(rows)
                    + "</table>"))
    elif res.tokens is not None:  # stopped early: show what the diagnosis read
        tok = res.tokens
        rows = [f"<tr><td>{what}</td><td>{'refusal' if f else 'no refusal'}</td><td>{html.escape(t)}</td></tr>"
                for what, texts, flags in (("harmful", tok.harmful_texts, tok.harmful_refused),
                                           ("harmless", tok.harmless_texts, tok.harmless_refused))
                for t, f in list(zip(texts, flags))[:6]]
        out.append(("Baseline generations on train prompts (what the diagnosis read)",
                    "<table><tr><th>class</th><th>judge</th><th>response</th></tr>" + "".join(rows) + "</table>"))
    return out


def _writers_sections(res: RefusalResult) -> list[tuple[str, Any]]:
    """The writer attribution's table (with what layer 0's resid_pre holds and the identity checks) and its bars."""
    w = res.writers
    if w is None:
        return []
    notes = [w.embedding, f"control: {w.control}"] + [f"max |logit diff| {k}: {v:.2g}" for k, v in w.checks.items()]
    text = "".join(f"<p class='note'>{html.escape(n)}</p>" for n in notes + w.notes)
    return [("Refusal by writer", text + table(*w.table())), ("Refusal by writer (figure)", w.plot())]


def refusal_report(res: RefusalResult, model_name: str, family: str, n_layers: int) -> str:
    """The refusal pipeline's report page: summary, candidate heatmaps, projections, rates, subspaces, examples."""
    sections = [("Summary", _summary(res, model_name, family, n_layers))]
    sections += _candidate_sections(res) + _estimate_sections(res) + _evaluation_sections(res) + _writers_sections(res)
    sections += res.frontier.report_sections() if res.frontier is not None else []
    return page(f"Refusal direction: {model_name}", sections)
