"""The multilingual studies' HTML page: what transfers to each language, the figures, the tables and the notes."""

from __future__ import annotations

import json
from pathlib import Path

from interp.io import atomic_write
from interp.studies.multilingual.retention import Retention
from interp.viz.html import kv_table, page, table
from interp.viz.multilingual import rates_by_language


def retention_page(res: Retention) -> str:
    """A self-contained page for one :class:`Retention` result."""
    tr = res.transfer()
    head = [("model layers captured", len(res.geometry.layers)), ("ablated layer", res.layer),
            ("layer choice", res.layer_choice["rule"]), ("ablation positions", res.config.ablate_positions),
            ("massive dimensions left out", res.layer_choice.get("massive_dims_removed", [])),
            ("test prompts per set and language", res.geometry.n_test), ("seed", res.config.seed),
            ("bootstrap resamples", res.geometry.n_boot), ("max new tokens (greedy)", res.config.max_new_tokens)]
    transfer = table(["language", "harmful refusal", "95% CI", "harmless refusal", "transfer (vs " + res.source + ")",
                      "ablation", "random ablation", "degenerate under ablation / random"],
                     [[lang, res.rate(lang, "harmful")["rate"],
                       f"{res.rate(lang, 'harmful')['low']:.2f}-{res.rate(lang, 'harmful')['high']:.2f}",
                       res.rate(lang, "harmless")["rate"], tr[lang], res.rate(lang, "harmful", "ablation")["rate"],
                       res.rate(lang, "harmful", "random ablation")["rate"],
                       f"{res.rate(lang, 'harmful', 'ablation')['degenerate']:.2f} / "
                       f"{res.rate(lang, 'harmful', 'random ablation')['degenerate']:.2f}"] for lang in res.langs])
    geo = res.to_frame()
    at = geo[geo.layer == res.layer]
    geo_table = table(list(at.columns), at.round(4).values.tolist())
    lang_rows = [] if res.language is None else [r for r in res.language.to_frame().to_dict("records") if r["layer"] == res.layer]
    lang_table = table(list(lang_rows[0]) if lang_rows else ["none"], [list(r.values()) for r in lang_rows])
    notes = "".join(f"<p class='note'>{n}</p>" for n in res.notes) or "<p>none</p>"
    first = {g["prompt"] for g in res.generations[:2]}  # every condition for the first two source prompts
    shown = [g for g in res.generations if g["prompt"] in first or (g["lang"] != res.source
                                                                     and g["condition"] == "baseline")][:40]
    samples = table(["lang", "set", "condition", "prompt", "answer", "refused"],
                    [[g["lang"], g["set"], g["condition"], g["prompt"][:120], g["text"][:200], g["refused"]]
                     for g in shown])
    return page("Refusal retention across languages", [
        ("Setup", kv_table(head)), ("How much refusal transfers", transfer),
        ("Refusal rates", rates_by_language(res.rates)), ("Geometry by layer", res.plot()),
        (f"Geometry at the ablated layer {res.layer}", geo_table),
        (f"Language identity and erasure at layer {res.layer} (LEACE vs a random erasure of the same rank)", lang_table),
        ("Notes", notes), ("Sample generations", samples)])


def write_retention(res: Retention, folder: str | Path, overwrite: bool = False) -> Path:
    """``report.html``, ``retention.json`` and ``generations.jsonl`` into ``folder`` (atomically; refuses to replace
    an existing result unless ``overwrite``)."""
    out = Path(folder)
    files = {"report.html": retention_page(res), "retention.json": json.dumps(res.record(), indent=1) + "\n",
             "generations.jsonl": "".join(json.dumps(g, ensure_ascii=False) + "\n" for g in res.generations)}
    clash = [f for f in files if (out / f).exists()]
    if clash and not overwrite:
        raise FileExistsError(f"{out} already holds {clash}; choose another folder or pass overwrite=True")
    for name, text in files.items():
        atomic_write(out / name, lambda tmp, text=text: Path(tmp).write_text(text, encoding="utf-8"))
    return out / "report.html"


__all__ = ["retention_page", "write_retention"]
