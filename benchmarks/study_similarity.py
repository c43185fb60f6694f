"""Representational similarity on real models: category RSA (binary and graded superordinate targets) and typicality
gradients on SmolLM2-135M-Instruct by layer, with permutation p-values and a random-weights twin as control; cross-language similarity of our parallel
sentences on Gemma 3 270M (multilingual, no chat template) and on SmolLM2 for comparison. Tables to stdout and, with
``--write``, to ``benchmarks/RESULTS_similarity.md``.

``nice -n 19 python benchmarks/study_similarity.py --n-perm 1000 --n-boot 1000 [--write]``
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
from interp.models import load_model  # noqa: E402
from interp.studies.directions.similarity import SimilarityConfig, category_rsa  # noqa: E402
from interp.studies.directions.similarity_data import (  # noqa: E402
    category_matrix,
    load_categories,
    load_parallel,
    random_init,
)
from interp.studies.directions.similarity_language import cross_language_similarity  # noqa: E402
from interp.studies.directions.similarity_typicality import typicality  # noqa: E402
from interp.values import Runtime  # noqa: E402


def _kw(args) -> dict:
    return {"config": SimilarityConfig(n_perm=args.n_perm, n_boot=args.n_boot), "runtime": Runtime(seed=args.seed)}


def rsa_section(model, data, args) -> list[str]:
    """Category RSA by layer against the binary and the graded (superordinate) target, side by side."""
    kw = _kw(args)
    binary = category_rsa(model, data["items"], data["categories"], **kw)
    graded = category_rsa(model, data["items"], data["categories"],
                          target=category_matrix(data["categories"], data["superordinates"]), **kw)
    fb, fg = binary.to_frame(), graded.to_frame()
    rows = [{"layer": int(fb.layer[k]), "r_binary": fb.r[k], "p": fb.p[k], "p_fwe": fb.p_fwe[k],
             "null_97.5%": fb.null_hi[k], "r_graded": fg.r[k], "p_graded": fg.p[k], "p_fwe_graded": fg.p_fwe[k]}
            for k in range(len(fb))]
    title = (f"Category RSA on {model.name} (96 items, 8 categories; 'The word: {{item}}', last token; correlation "
             f"RDMs; Spearman; {args.n_perm} Mantel permutations)")
    return [table(title, rows, list(rows[0])), f"binary: {binary.report()}", "", f"graded: {graded.report()}", ""]


def typicality_section(model, data, args) -> list[str]:
    res = typicality(model, data["items"], data["categories"], data["typicality"], **_kw(args))
    f = res.to_frame()
    pooled = f[f.category == "pooled"].reset_index(drop=True)
    best = int(pooled.rho.idxmax())
    per = f[f.layer == pooled.layer[best]]
    rows = [{"layer": int(r.layer), "pooled_rho": r.rho, "ci_lo": r.lo, "ci_hi": r.hi, "p": r.p, "p_fwe": r.p_fwe}
            for r in pooled.itertuples()]
    cat_rows = [{"category": r.category, "rho": r.rho, "ci_lo": r.lo, "ci_hi": r.hi, "p": r.p}
                for r in per.itertuples() if r.category != "pooled"]
    title = (f"Typicality gradient on {model.name} (closeness to the leave-one-out prototype, cosine, vs our 1-7 "
             f"ratings; pooled = within-category standardised Spearman; {args.n_perm} within-category permutations, "
             f"{args.n_boot} bootstraps)")
    return [table(title, rows, list(rows[0])),
            table(f"Per category at layer {int(pooled.layer[best])} ({model.name})", cat_rows, list(cat_rows[0])),
            res.report(), ""]


def control_section(model, data, args) -> list[str]:
    """Category RSA and typicality on randomly initialised weights: what the tokenizer and architecture alone give."""
    twin = random_init(model, args.seed)
    kw = _kw(args)
    rs = category_rsa(twin, data["items"], data["categories"], **kw).to_frame()
    ty_twin = typicality(twin, data["items"], data["categories"], data["typicality"], **kw)
    ty_real = typicality(model, data["items"], data["categories"], data["typicality"], **kw)
    ty, diff = ty_twin.to_frame(), ty_real.compare(ty_twin)
    ty = ty[ty.category == "pooled"].reset_index(drop=True)
    rows = [{"layer": int(rs.layer[k]), "r_binary": rs.r[k], "p_fwe": rs.p_fwe[k], "typicality_rho": ty.rho[k],
             "typicality_p_fwe": ty.p_fwe[k], "trained_minus_random_rho": diff["difference"][k],
             "diff_lo": diff["lo"][k], "diff_hi": diff["hi"][k]} for k in range(len(rs))]
    title = (f"Random-weights control: {twin.name}, same items, targets and settings; typicality trained - random "
             f"with its paired bootstrap 95% interval")
    return [table(title, rows, list(rows[0]))]


def language_section(model, parallel, args) -> list[str]:
    res = cross_language_similarity(model, parallel, seed=args.seed)
    f = res.to_frame(pairs=False)
    cols = ["layer", "matched", "mismatched", "gap", "raw_matched", "raw_mismatched", "raw_gap", "retrieval",
            "retrieval_lo", "retrieval_hi", "raw_retrieval", "shuffled_retrieval"]
    rows = [{c: (int(r[c]) if c == "layer" else float(r[c])) for c in cols} for _, r in f.iterrows()]
    best = int(f.retrieval.idxmax())
    pairs = res.to_frame()
    at = pairs[pairs.layer == f.layer[best]]
    pair_rows = [{"source": r.source, "target": r.target, "retrieval": r.retrieval, "gap": r.gap,
                  "shuffled_retrieval": r.shuffled_retrieval} for r in at.itertuples()]
    title = (f"Cross-language similarity on {model.name} ({len(parallel)} languages x {res.n} parallel sentences; mean "
             f"over the sentence's tokens after the first (the attention sink); each language centred on its own mean; "
             f"averaged over the {len(res.stats)} ordered pairs; chance retrieval {1 / res.n:.3f})")
    return [table(title, rows, cols), table(f"Per pair at layer {int(f.layer[best])} ({model.name})", pair_rows,
                                            list(pair_rows[0]))]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n-perm", type=int, default=1000)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--n-sentences", type=int, default=None, help="parallel sentences per language (default: all 62)")
    ap.add_argument("--language-models", nargs="+", default=["gemma3-270m", "smollm2-base"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.time()
    data, parallel = load_categories(), load_parallel(n=args.n_sentences)
    out = ["# Representational similarity (issue 14 item 4)", "",
           f"`nice -n 19 python benchmarks/study_similarity.py {' '.join(argv or sys.argv[1:])}`", "", machine(), ""]
    smol = load_model("smollm2-base")
    out += rsa_section(smol, data, args) + typicality_section(smol, data, args) + control_section(smol, data, args)
    print("\n".join(out), flush=True)
    for name in args.language_models:
        model = smol if name == "smollm2-base" else load_model(name)
        sec = language_section(model, parallel, args)
        print("\n".join(sec), flush=True)
        out += sec
    out += [f"total {time.time() - t0:.0f} s (1 thread)", ""]
    if args.write:
        write_text(REPO / "benchmarks" / "RESULTS_similarity.md", "\n".join(out))


if __name__ == "__main__":
    main()
