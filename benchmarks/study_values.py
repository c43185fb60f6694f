"""Value and partisan vectors on real models (issue 14 item 3): the liberty-vs-welfare value vector and the
Democratic-vs-Republican direction on SmolLM2-135M-Instruct, and English -> French transfer of the value vector on
Gemma 3 270M (no chat template: plain prompts, BOS from the tokenizer). Every rate carries its Wilson 95% interval;
the comparison with same-norm random vectors at the same layers is the test (a null is reported as one).

``nice -n 19 python benchmarks/study_values.py [--parts values,partisan,xl] [--n-random 3] [--write]``
(``--write`` puts the tables into ``benchmarks/RESULTS_values.md``)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._common import machine, table, write_text  # noqa: E402
from interp.evals.rates import wilson  # noqa: E402
from interp.forward import prepare  # noqa: E402
from interp.models import load_model  # noqa: E402
from interp.studies.directions.values_data import load_dilemmas, load_statements  # noqa: E402
from interp.studies.directions.values_study import (  # noqa: E402
    ValueStudyConfig,
    cross_lingual_transfer,
    partisan_direction,
    value_study,
)
from interp.values import Runtime  # noqa: E402

OUT = REPO / "benchmarks" / "RESULTS_values.md"


def _ci(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k}/{n} = {k / n:.2f} [{lo:.2f}, {hi:.2f}]"


def steering_rows(eff) -> list[dict]:
    """One row per alpha: value and random rates with intervals, shifts, verdict."""
    comp = eff.comparison()
    rows = []
    for i, a in enumerate(eff.alphas):
        c = comp.iloc[i]
        rand = "; ".join(_ci(int(k), eff.n) for k in eff.random_k[:, i].tolist())
        rows.append({"alpha": a, "baseline": _ci(eff.baseline_k, eff.n), "value": _ci(int(eff.value_k[i]), eff.n),
                     "random (each seed)": rand, "value shift": float(c.value_shift),
                     "max abs random shift": float(c.random_shift_max_abs),
                     "value > random": bool(c.value_exceeds_random), "Fisher p": float(c.fisher_p),
                     "P(pole) shift": float(c.value_p_shift)})
    return rows


STEER_COLS = ["alpha", "baseline", "value", "random (each seed)", "value shift", "max abs random shift",
              "value > random", "Fisher p", "P(pole) shift"]


def selection_rows(study, top: int = 6) -> list[dict]:
    sel = study.selection.to_frame().sort_values("score", ascending=False).head(top)
    return [{"layer": int(r.layer), "held-out AUROC": float(r.auroc), "effect": float(r.effect),
             "score": float(r.score), "chosen": bool(r.chosen)} for r in sel.itertuples()]


def study_block(name: str, study, seconds: float) -> str:
    vv, sel = study.vectors, study.selection
    auc = vv.auroc
    best = int(torch.nan_to_num(auc, nan=0).argmax())
    head = (f"**{name}**: {vv.n_pairs} contrastive pairs; best held-out AUROC {float(auc[best]):.3f} at layer "
            f"{vv.layers[best]} (mean over layers {float(auc.nanmean()):.3f}); chosen layers {sel.chosen} "
            f"({'null: no layer had a positive score' if sel.null else 'positive score'}); calibration "
            f"{sel.n_items} items, baseline rate {sel.baseline['rate']:.2f}; split {study.split}; {seconds:.0f} s.\n\n"
            f"Rule: {sel.rule}.\n\n")
    return (head + table(f"{name}: layer selection (top by score)", selection_rows(study),
                         ["layer", "held-out AUROC", "effect", "score", "chosen"]) + "\n"
            + table(f"{name}: selective steering on {study.effect.n} held-out items", steering_rows(study.effect),
                    STEER_COLS))


def run_xl(args) -> str:
    t = time.time()
    model = load_model(args.xl_model)
    ids = prepare(model, ["Bonjour."], chat=False)[1][0].ids
    bos = model.tokenizer.bos_token_id
    xl = cross_lingual_transfer(model, load_dilemmas(), source="en", target="fr",
                                **_kw(args, model.n_layers, args.xl_layer_step, chat=False))
    df = xl.to_frame()
    rows = [{"layer": int(r.layer), "cosine en/fr fit": float(r.cosine), "AUROC en": float(r.auroc_en),
             "AUROC fr": float(r.auroc_fr), "transfer AUROC en->fr": float(r.transfer_auroc_en_to_fr),
             "chosen": bool(r.chosen)} for r in df.itertuples()]
    out = (f"#### Cross-lingual ({args.xl_model}, plain prompts; first token {ids[0]} == BOS {bos}: "
           f"{ids[0] == bos})\n\n" + study_block("English value vector", xl.study, time.time() - t) + "\n"
           + table("en -> fr: direction agreement by layer", rows, list(rows[0])) + "\n"
           + table(f"en-fit vector steering French held-out items ({xl.target_effect.n})",
                   steering_rows(xl.target_effect), STEER_COLS))
    return out


def _kw(args, n_layers: int, step: int | None = None, chat: bool = True) -> dict:
    cfg = ValueStudyConfig(max_items=(args.max_calibration, args.max_test), n_random=args.n_random, alphas=args.alphas,
                           select_alpha=args.select_alpha, top_k=args.top_k, letters=tuple(args.letters), chat=chat)
    return dict(layers=list(range(0, n_layers, step or args.layer_step)), config=cfg,
                runtime=Runtime(batch_size=args.batch_size, seed=args.seed))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="values,partisan,xl")
    ap.add_argument("--model", default="smollm2-base")
    ap.add_argument("--xl-model", default="gemma3-270m")
    ap.add_argument("--n-random", type=int, default=3)
    ap.add_argument("--alphas", type=float, nargs="+", default=[-1.0, -0.5, 0.5, 1.0])
    ap.add_argument("--select-alpha", type=float, default=0.5)
    ap.add_argument("--top-k", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layer-step", type=int, default=1, help="fit and select among every k-th layer")
    ap.add_argument("--xl-layer-step", type=int, default=None, help="--layer-step for the cross-lingual model")
    ap.add_argument("--max-calibration", type=int, default=None, help="at most this many calibration items")
    ap.add_argument("--max-test", type=int, default=None, help="at most this many held-out test items")
    ap.add_argument("--letters", nargs=2, default=["A", "B"], help="option letters (single tokens of the tokenizer)")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    parts = args.parts.split(",")
    blocks = []
    studies = {"values": ("Value vector", "liberty vs collective welfare (en)", value_study, load_dilemmas),
               "partisan": ("Partisan direction", "Democratic vs Republican (pole D)", partisan_direction,
                            load_statements)}
    model = load_model(args.model) if set(studies) & set(parts) else None
    for part, (title, label, run, load) in studies.items():
        if part in parts:
            t = time.time()
            res = run(model, load(), **_kw(args, model.n_layers))
            blocks.append(f"#### {title} ({args.model})\n\n" + study_block(label, res, time.time() - t))
            print(blocks[-1], flush=True)
    if "xl" in parts:
        blocks.append(run_xl(args))
        print(blocks[-1], flush=True)
    command = "nice -n 19 python benchmarks/study_values.py " + " ".join(sys.argv[1:])
    text = (f"## Value and partisan vectors (issue 14 item 3)\n\nCommand: `{command}`\n\nMachine: {machine()}\n\n"
            + "\n".join(blocks))
    if args.write:
        write_text(OUT, text)
        print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
