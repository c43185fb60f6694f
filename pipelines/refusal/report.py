"""The refusal pipeline's HTML report: candidate heatmaps, projections, rates with controls, generations."""

from __future__ import annotations

import html
from typing import Any

import torch

from viz.html import kv_table, page


def refusal_report(metrics: dict, extra: dict, model_name: str) -> str:
    """The refusal pipeline's report: candidate heatmaps, projections, rates with controls, cosines, subspaces."""
    from viz import refusal as F

    sections: list[tuple[str, Any]] = []
    notes = "".join(f"<p class='note'>{html.escape(n)}</p>" for n in metrics.get("notes", []))
    sel = metrics.get("selection", {})
    summary = [("model", model_name), ("family", metrics.get("family")), ("layers", metrics.get("n_layers")),
               ("refusal tokens", ", ".join(repr(t) for t in metrics.get("refusal_tokens", []))),
               ("direction found", metrics.get("found_direction"))]
    if metrics.get("found_direction"):
        summary += [("selected layer", sel["layer"]), ("selected position", f"{sel['position']} ({sel['position_token']!r})"),
                    ("bypass score", sel["bypass_score"]), ("induce score", sel["induce_score"]), ("KL", sel["kl"])]
    if "passing" in sel:
        summary.append(("candidates passing filters", f"{sel['passing']['all']} of {sel['passing']['of']} "
                        f"(layer {sel['passing']['layer']}, KL {sel['passing']['kl']}, induce {sel['passing']['induce']}, "
                        f"bypass {sel['passing']['bypass']})"))
    sections.append(("Summary", notes + kv_table(summary)))
    sc, cand = extra.get("scores"), extra.get("cand")
    if sc is not None and cand is not None:
        chosen = (extra["li"], extra["pi"]) if "li" in extra else None
        sections.append(("Candidate scores", F.candidate_heatmaps(sc["bypass"], sc["induce"], sc["kl"], cand["layers"],
                                                                  cand["pos_tokens"], chosen)))
        pi = extra.get("pi", cand["P"] - 1)
        li = extra.get("li", 0)
        r = torch.nn.functional.normalize(cand["raw"][li, pi], dim=-1)
        sections.append(("Projections", F.projections_by_layer(cand["harmful_acts"][:, :, pi] @ r,
                                                               cand["harmless_acts"][:, :, pi] @ r, cand["layers"])))
        sections.append(("Cosine similarity of candidates across layers",
                         F.cosine_heatmap(cand["raw"][:, pi], cand["layers"],
                                          f"candidates at position {pi - cand['P']} ({cand['pos_tokens'][pi]!r})")))
    ev = metrics.get("evaluation")
    if ev:
        sections.append(("Refusal rates with controls", F.refusal_rates(ev["refusal_rate"])))
        eq = ev["hook_vs_baked"]
        sections.append(("Hook ablation vs baked weights, KL and CE", kv_table(
            [("max |logit diff| hook vs baked", eq["max_abs_logit_diff"]), ("relative", eq["rel_logit_diff"]),
             ("architecture bakes exactly", eq["exact_architecture"])] +
            [(f"harmless {k}", v) for k, v in ev["harmless_kl_ce"].items()] +
            [(f"refusal score: {k}", v) for k, v in ev["refusal_score"].items()])))
    sub = metrics.get("subspaces")
    if sub and sub.get("rank"):
        base = ev["refusal_rate"]["harmful/baseline"] if ev else 0.0
        sections.append(("Subspace ablation", F.subspace_curve(sub["rank"], sub["harmful_refusal_rate"],
                                                               sub["harmful_refusal_score"], base)))
    if extra.get("eval"):
        rows = []
        gens = extra["eval"]["gens"]
        for cond in ("harmful/baseline", "harmful/ablation", "harmless/baseline", "harmless/addition"):
            for t in gens.get(cond, [])[:4]:
                rows.append(f"<tr><td>{html.escape(cond)}</td><td>{html.escape(t)}</td></tr>")
        sections.append(("Example generations", "<table><tr><th>condition</th><th>response</th></tr>" + "".join(rows)
                         + "</table>"))
    return page(f"Refusal direction: {model_name}", sections)
