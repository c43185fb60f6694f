"""Cue-induced bias directions on SmolLM2-135M-Instruct (``smollm2-base``) and its safety LoRA (``smollm2-aligned``):
held-out probe AUROC by layer beside a bag-of-tokens baseline and a shuffled-label control, leave-one-dataset-out
transfer, the causal test (steer against each direction on the items the cue flips, vs same-norm random
directions), the overlap of the biases, and the cosine between the two checkpoints' directions.

``nice -n 19 python benchmarks/study_biases.py --n-per-source 20 --layers 0,3,6,9,12,15,18,21,24,27 [--write]``
(``--write`` puts the tables in ``benchmarks/RESULTS_biases.md``)
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from interp.io import atomic_write  # noqa: E402
from interp.models import load_model  # noqa: E402
from interp.studies.directions.biases import BiasConfig, bias_directions  # noqa: E402
from interp.studies.directions.biases_causal import answer_table, bias_causal_test, flip_counts  # noqa: E402
from interp.studies.directions.biases_compare import compare_checkpoints  # noqa: E402
from interp.studies.directions.biases_items import BIASES, load_bias_items  # noqa: E402


def _md(df, floatfmt: str = ".3f") -> str:
    """A pandas frame as a markdown table (tabulate is not installed)."""
    def cell(v) -> str:
        return format(v, floatfmt) if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def family_tables(fam) -> list[str]:
    import pandas as pd

    s = fam.at_best_layer()[["bias", "layer", "auroc", "control_auroc", "lexical_auroc", "lodo_min", "lodo_mean",
                       "lexically_separable", "transfers", "n_items"]]
    lex_lodo = {b: min(p.lexical_lodo.tolist()) for b, p in fam.probes.items() if p.lexical_lodo is not None}
    s.insert(7, "lexical_lodo_min", [lex_lodo.get(b) for b in s["bias"]])
    wide = pd.DataFrame({b: p.auroc.tolist() for b, p in fam.probes.items()},
                        index=[f"L{x}" for x in fam.direction(fam.biases[0]).layers]).T
    wide.insert(0, "lexical", [p.lexical_auroc for p in fam.probes.values()])
    wide.insert(1, "shuffled (mean over layers)", [float(p.control_auroc.nanmean()) for p in fam.probes.values()])
    ov = fam.overlap().to_frame().pivot(index="a", columns="b", values="cosine").reindex(fam.biases)[fam.biases]
    ang = fam.overlap().to_frame().pivot(index="a", columns="b", values="smallest_angle_deg")
    ang = ang.reindex(fam.biases)[fam.biases]
    ov_site = fam.overlap().site
    return [f"#### {fam.model_id}: each bias at its chosen layer", _md(s),
            f"#### {fam.model_id}: held-out AUROC by layer (bag-of-tokens baseline and shuffled control beside)",
            _md(wide.reset_index(names="bias")),
            f"#### {fam.model_id}: overlap at {ov_site} (cosine of directions; chance |cos| ~ "
            f"{fam.overlap().chance:.3f})", _md(ov.reset_index(), ".2f"),
            f"#### {fam.model_id}: smallest principal angle (degrees) between the rank-2 per-source subspaces",
            _md(ang.reset_index(), ".1f")]


def causal_tables(model, fam, items, args) -> list[str]:
    import pandas as pd

    t = time.time()
    answers = answer_table(model, items)
    flips = pd.DataFrame([{"bias": b, **v} for b, v in flip_counts(items, answers).items()])
    rows = []
    for b in fam.biases:
        r = bias_causal_test(model, fam, items, b, band=args.band, alpha=args.alpha, answers=answers,
                             config=BiasConfig(n_random=args.seeds, max_items=args.max_flipped))
        rows.append(r.summary())
        print(r.summary(), flush=True)
    df = pd.DataFrame(rows)[["bias", "n_items", "n_flipped", "recovery", "recovery_ci95", "random_recovery",
                             "random_ci95", "n_random_seeds", "still_cued", "fisher_p", "null", "added_norm"]]
    return [f"#### {model.name}: how often the cue moves the forced-choice answer", _md(flips),
            f"#### {model.name}: causal test (subtract alpha={args.alpha} x mean residual norm at layers "
            f"{args.band}; {args.seeds} random seeds; {time.time() - t:.0f} s)", _md(df)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-per-source", type=int, default=20)
    ap.add_argument("--layers", default="0,3,6,9,12,15,18,21,24,27")
    ap.add_argument("--band", default="9,12,15", help="layers steered in the causal test (must be among --layers)")
    ap.add_argument("--alpha", type=float, default=0.5)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--max-flipped", type=int, default=20)
    ap.add_argument("--biases", default=",".join(BIASES))
    ap.add_argument("--causal-only", action="store_true",
                    help="only the causal test, on the base model, probing at --band only (many items, so enough of "
                         "them flip); written to RESULTS_biases_causal.md")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    args.band = [int(x) for x in args.band.split(",")]
    layers = [int(x) for x in args.layers.split(",")]
    torch.manual_seed(0)
    items = load_bias_items(biases=args.biases.split(","), n_per_source=args.n_per_source)
    t0 = time.time()
    cfg = BiasConfig(progress=False)
    base = load_model("smollm2-base")
    fam_a = bias_directions(base, items, layers=layers, config=cfg)
    print(fam_a.at_best_layer().to_string(), flush=True)
    out = family_tables(fam_a) + causal_tables(base, fam_a, items, args)
    if args.causal_only:
        return _write(args, items, layers, t0, out, "RESULTS_biases_causal.md", "causal test")
    del base
    aligned = load_model("smollm2-aligned")
    fam_b = bias_directions(aligned, items, layers=layers, config=cfg)
    out += family_tables(fam_b)
    cmp = compare_checkpoints(fam_a, fam_b, names=("smollm2-base", "smollm2-aligned"))
    wide = cmp.to_frame().pivot(index="bias", columns="layer", values="cosine").reindex(cmp.biases)
    wide.columns = [f"L{c}" for c in wide.columns]
    out += [f"#### cosine between smollm2-base and smollm2-aligned directions per bias per layer (chance |cos| ~ "
            f"{cmp.chance:.3f})", _md(wide.reset_index())]
    _write(args, items, layers, t0, out, "RESULTS_biases.md", "bias directions")


def _write(args, items, layers, t0: float, out: list[str], name: str, what: str) -> None:
    command = "nice -n 19 python benchmarks/study_biases.py " + " ".join(sys.argv[1:])
    text = "\n\n".join(["### Cue-induced bias directions (issue 14, item 2)", f"`{command}`",
                        f"{len(items)} items ({args.n_per_source} questions per source x 2 sources per bias), "
                        f"layers {layers}; {platform.machine()} CPU, {torch.get_num_threads()} threads, "
                        f"{time.time() - t0:.0f} s in all.", *out]) + "\n"
    print(text)
    if args.write:
        path = REPO / "benchmarks" / name
        atomic_write(path, lambda tmp: Path(tmp).write_text(f"# Results: {what}\n\n" + text))


if __name__ == "__main__":
    main()
