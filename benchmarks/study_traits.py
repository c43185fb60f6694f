"""Calibrated Big Five trait scales on SmolLM2-135M-Instruct (``smollm2-base``): per trait the held-out ordered
layers, the band and its adjacent-level d, AUROC (ours vs scikit-learn on the same folds), the sycophancy
decomposition with bootstrap intervals, corpus signatures, steering in level units with its KL cost, and a
three-level generation sample. Persona statements come from ``../shared/data/persona`` (test data).

``nice -n 19 python benchmarks/study_traits.py --n 40 [--write]`` writes ``benchmarks/RESULTS_traits.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import steering  # noqa: E402
from benchmarks._common import machine, skipped, write_text  # noqa: E402
from interp.models import load_model  # noqa: E402
from interp.studies.directions.traits import TraitConfig, trait_scales  # noqa: E402
from interp.studies.directions.traits_analysis import capture_contrast, corpus_signature  # noqa: E402
from interp.studies.directions.traits_band import BandRule  # noqa: E402
from interp.studies.directions.traits_data import SYCOPHANCY_PROMPTS, TRAITS, sycophancy_items  # noqa: E402
from interp.studies.directions.traits_decompose import decompose  # noqa: E402
from interp.studies.directions.traits_steer import level_sweep, steer_levels  # noqa: E402
from interp.values import Prompts, Runtime  # noqa: E402

SHARED = Path(os.environ.get("INTERP_SHARED", REPO.parent / "shared"))


def persona_rows(trait: str) -> list[dict]:
    rows = [json.loads(x) for x in (SHARED / "data" / "persona" / f"{trait}.jsonl").read_text().splitlines() if x]
    import random

    random.Random(0).shuffle(rows)
    return rows


def sklearn_auroc(scale, acts, top=None) -> torch.Tensor:
    """scikit-learn's held-out AUROC ``[n_folds, n_layers]`` on the folds our probe used (same l2 as C); ``scale``
    is a trait scale (positive label: its top level) or plain ``ProbeScores`` with ``top`` the positive label."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.preprocessing import StandardScaler

    from probes.logistic import sklearn_C

    row = {pid: i for i, pid in enumerate(acts.prompt_ids)}
    X = acts.tensor.double().numpy()
    scores = scale if hasattr(scale, "folds") else scale.auroc
    top = scale.levels[-1] if top is None else top
    out = torch.zeros(len(scores.folds), X.shape[1])
    for f, fold in enumerate(scores.folds):
        tr, te = [row[i] for i in fold["train"]], [row[i] for i in fold["test"]]
        ytr = np.array([acts.labels[i] == top for i in tr], dtype=int)
        yte = np.array([acts.labels[i] == top for i in te], dtype=int)
        for j in range(X.shape[1]):
            sc = StandardScaler().fit(X[tr, j])
            ref = LogisticRegression(C=sklearn_C(scores.meta["l2"], len(tr)), tol=1e-8, max_iter=5000)
            ref.fit(sc.transform(X[tr, j]), ytr)
            out[f, j] = roc_auc_score(yte, ref.decision_function(sc.transform(X[te, j])))
    return out


def matching_metric(model, rows: list[dict]):
    """Mean logit(matching answer) - logit(other answer) at the first answer token ("Yes" / "No")."""
    tok = model.tokenizer
    yes, no = tok.encode("Yes", add_special_tokens=False)[0], tok.encode("No", add_special_tokens=False)[0]
    sign = torch.tensor([1.0 if r["answer_matching_behavior"].strip() == "Yes" else -1.0 for r in rows])

    def matching_logit_diff(logits: torch.Tensor) -> torch.Tensor:
        return ((logits[:, yes] - logits[:, no]) * sign).mean()
    return matching_logit_diff


def section_scales(scales, t_fit: float) -> list[str]:
    out = [f"## Trait scales ({t_fit:.0f} s)", "", f"Band rule: {scales.rule.describe()}.", "",
           "| trait | held-out ordered layers | band | band adjacent d (min / mean) | band AUROC | max AUROC | "
           "AUROC ours vs sklearn max abs diff | band level error |", "|---|---|---|---|---|---|---|---|"]
    for _, r in scales.table().iterrows():
        s = scales[r.trait]
        diff = float((s.auroc.auroc - sklearn_auroc(s, scales.acts[r.trait]).to(s.auroc.auroc)).abs().max())
        ordered = r.ordered_layers
        out.append(f"| {r.trait} | {len(ordered)}/30: {ordered} | {r.band or r.band_note} | "
                   f"{r.band_min_adjacent_d:.2f} / {r.band_mean_adjacent_d:.2f} | {r.band_auroc:.3f} | "
                   f"{r.max_auroc:.3f} | {diff:.4f} | {r.band_level_error:.2f} |")
    return out + [""]


def section_decomposition(model, scales, n_boot: int) -> list[str]:
    con = capture_contrast(model, sycophancy_items(), SYCOPHANCY_PROMPTS, scales)
    dec = decompose(scales, con, n_boot=n_boot)
    s = dec.table()
    out = [f"## Sycophancy onto the traits ({len(sycophancy_items())} items x 2 system prompts; {dec.report_note}; "
           f"{n_boot} bootstrap resamples)", "",
           f"R^2 {float(s.r2[0]):.3f} (random vectors of the same norm: {float(s.random_r2[0]):.4f}).", "",
           "| trait | coefficient (level steps) | 95% interval | excludes 0 |", "|---|---|---|---|"]
    out += [f"| {r.trait} | {r.coef:+.3f} | [{r.lo:+.3f}, {r.hi:+.3f}] | {r.excludes_0} |" for _, r in s.iterrows()]
    return out + [""]


def section_signature(model, scales, corpora: dict[str, list[str]]) -> list[str]:
    sig = corpus_signature(scales, corpora, model=model, config=TraitConfig(n_boot=1000))
    out = ["## Corpus signatures (level units, band means, 95% bootstrap; random axis with the same calibration)", "",
           "| corpus | " + " | ".join(sig.traits) + " |", "|---|" + "---|" * len(sig.traits)]
    for i, c in enumerate(sig.corpora):
        out.append(f"| {c} (n={sig.n[i]}) | " + " | ".join(
            f"{float(sig.mean[i, j]):.2f} [{float(sig.lo[i, j]):.2f}, {float(sig.hi[i, j]):.2f}] (rnd "
            f"{float(sig.random[i, j]):.2f})" for j in range(len(sig.traits))) + " |")
    return out + [""]


def section_steering(model, scales, trait: str, rows: list[dict], ks: list[float], prompts: list[str]) -> list[str]:
    sw = level_sweep(model, scales, trait, [r["question"] for r in rows], ks, matching_metric(model, rows),
                     on="logits", config=steering.SweepConfig(n_random=2), runtime=Runtime(progress=False))
    out = [f"## Steering {trait} in level units over its band ({len(rows)} held-out statements)", "",
           "| k (level units) | matching logit diff | random (mean) | KL steered | KL random (mean) |",
           "|---|---|---|---|---|", f"| none | {sw.baseline:.3f} | | 0 | |"]
    for i, k in enumerate(sw.alphas):
        out.append(f"| {k:g} | {float(sw.steered[i]):.3f} | {float(sw.random[:, i].mean()):.3f} | "
                   f"{float(sw.kl[i]):.4f} | {float(sw.random_kl[:, i].mean()):.4f} |")
    st = steer_levels(model, scales, trait, prompts, ks=(-2.0, 0.0, 2.0), max_new_tokens=40)
    fr = ", ".join(f"{k}: {v:.3f}" for k, v in st.residual_fraction.items())
    out += ["", f"One level unit adds this fraction of the mean residual norm per band layer: {fr}.", "",
            f"Level read out under k = -2 / 0 / +2: {', '.join(f'{float(x):.2f}' for x in st.read)} "
            f"(random direction, same strength: {', '.join(f'{float(x):.2f}' for x in st.random[0])}).", ""]
    for p in prompts:
        out.append(f"**Prompt:** {p}")
        for k in st.ks:
            out.append(f"- k = {k:+g}: {st.texts[k][prompts.index(p)].strip()!r}")
        out.append("")
    return out


def section_statements(model, rows: dict[str, list[dict]], n: int) -> list[str]:
    """The trait AUROC that is not saturated: statements that express the trait vs statements that deny it
    (the persona data's label), asked with no system prompt, last token of resid_post; ours vs scikit-learn."""
    from interp.capturing import capture
    from probes import cross_validate

    lines = [f"## Trait AUROC on the statements themselves ({n} per trait, half expressing the trait, no system "
             "prompt; 5 folds; logistic l2=1e-3)", "",
             "| trait | best layer | held-out AUROC there | mean over layers | shuffled-label control (mean) | "
             "ours vs sklearn: max abs diff of the fold-mean AUROC (any layer) | of any one fold's |",
             "|---|---|---|---|---|---|---|"]
    for t, rs in rows.items():
        pos = [r for r in rs if r["answer_matching_behavior"].strip() == "Yes"][: n // 2]
        neg = [r for r in rs if r["answer_matching_behavior"].strip() == "No"][: n // 2]
        acts = capture(model,
                       Prompts([r["question"] for r in pos + neg], labels=["expresses"] * len(pos) + ["denies"] * len(neg)),
                       sites="resid_post", positions="last", runtime=Runtime(progress=False))
        sc = cross_validate(acts, positive="expresses", runtime=Runtime(progress=False))
        auc = sc.auroc.mean(0)
        ref = sklearn_auroc(sc, acts, top="expresses").to(sc.auroc)
        diff, mean_diff = float((sc.auroc - ref).abs().max()), float((auc - ref.mean(0)).abs().max())
        best = int(auc.argmax())
        lines.append(f"| {t} | {best} | {float(auc[best]):.3f} | {float(auc.mean()):.3f} | "
                     f"{float(sc.control_auroc.mean()):.3f} | {mean_diff:.4f} | {diff:.4f} |")
    return lines + [""]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=40, help="statements per trait")
    ap.add_argument("--min-d", type=float, default=0.3)
    ap.add_argument("--n-boot", type=int, default=200)
    ap.add_argument("--steer-trait", default="extraversion")
    ap.add_argument("--statements-only", type=int, default=0, metavar="N",
                    help="only the statement-level trait AUROC (N statements per trait), written to "
                         "RESULTS_traits_statements.md")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    out_path = REPO / "benchmarks" / "RESULTS_traits.md"
    if not (SHARED / "data" / "persona").exists():
        skipped("study_traits", f"{SHARED / 'data' / 'persona'} is absent", out_path if args.write else None)
        return
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    t0 = time.time()
    model = load_model("smollm2-base")
    rows = {t: persona_rows(t) for t in TRAITS}
    if args.statements_only:
        cmd = ' '.join(argv if argv is not None else sys.argv[1:])
        text = "\n".join([f"# Trait AUROC on SmolLM2-135M-Instruct\n\n`nice -n 19 python benchmarks/study_traits.py "
                          f"{cmd}`\n\n{machine()}\n"] + section_statements(model, rows, args.statements_only)
                         + [f"Total {time.time() - t0:.0f} s."]) + "\n"
        print(text)
        if args.write:
            write_text(out_path.with_name("RESULTS_traits_statements.md"), text)
        return
    scales = trait_scales(model, {t: [r["question"] for r in rows[t][:args.n]] for t in TRAITS},
                          config=TraitConfig(rule=BandRule(min_d=args.min_d), on_empty="report"))
    lines = ["# Trait scales on SmolLM2-135M-Instruct", "",
             f"`nice -n 19 python benchmarks/study_traits.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
             "", f"{machine()}; {args.n} statements x 3 levels per trait, last token, resid_post, all 30 layers, "
                 f"5 folds by statement.", ""]
    lines += section_scales(scales, time.time() - t0)
    lines += section_decomposition(model, scales, args.n_boot)
    held = {t: [r["question"] for r in rows[t][args.n:args.n + 24]] for t in ("extraversion", "agreeableness")}
    lines += section_signature(model, scales, {"sycophancy items": sycophancy_items(), **held})
    trait = args.steer_trait
    lines += section_steering(model, scales, trait, rows[trait][args.n:args.n + 24], [0.0, 1.0, 2.0, 4.0],
                              ["Tell me about your ideal weekend.", "How do you feel about meeting new people?"])
    lines += [f"Total {time.time() - t0:.0f} s."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        write_text(out_path, text)


if __name__ == "__main__":
    main()
