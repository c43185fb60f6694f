"""Greedy generation of refusal-job prompts: HF ``generate`` against ours (finished rows dropped, an addition's
prompt pass resumed at its layer), interleaved in one process on the same batches, with the same token ids checked.

HF ``generate`` keeps a finished row in the batch, fed padding, until every row is done; ``steering.decode`` drops
it, so a batch of short answers (refusals) costs what its live rows cost. Under an addition at one layer, the prompt
pass computes only the blocks from that layer on (a ``steering.GenerationSession`` reuses it), the ones below read
from one plain pass shared by every such condition (its cost is printed apart: the job pays it once per prompt set,
with its plain generation's prefix).

The last row stacks four conditions (post-instruction ablations of random directions) in one batch
(``GenerationSession.generate_each(stack=4)``) against one condition per batch: on a compute-bound CPU a wider batch costs in
proportion to its rows; on an accelerator it should cost little more (``--device cuda``, run by gpu_all.sh).

    python benchmarks/bench_decode.py                 # smollm2-aligned, the job's default test prompts, 3 rounds
    python benchmarks/bench_decode.py --device cuda --threads 0 --out runs/gpu/decode.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import interp  # noqa: E402
import steering  # noqa: E402
from benchmarks._common import machine, table, write_text  # noqa: E402
from interp.models import load_model  # noqa: E402
from interp.studies.kit.prompt_sets import load_refusal_data  # noqa: E402
from interp.studies.kit.scoring import ablation  # noqa: E402

COLS = ["prompts", "edit", "HF generate s", "ours s", "ours / HF", "same tokens", "mean new tokens"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-aligned")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=24, help="max new tokens (the job's default)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--layer", type=int, default=18, help="the addition's layer (the job's selection on smollm2-aligned)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (0: torch's default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=str(HERE / "RESULTS_decode.md"))
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    m = load_model(args.model, device=args.device)
    data = load_refusal_data(args.model)
    v = torch.randn(m.d_model, generator=torch.Generator().manual_seed(0))
    sets = {"harmful test": data.harmful["test"].instructions, "harmless test": data.harmless["test"].instructions}
    cases = [(name, "none", ()) for name in sets] + [
        ("harmless test", f"addition at layer {args.layer} (random direction, norm 8)",
         (steering.AddVector(8 * v / v.norm(), layers=args.layer, sites="resid_pre"),))]
    rows, t0 = [], time.perf_counter()
    for name, label, ivs in cases:
        prompts = interp.Prompts(sets[name])
        run = interp.Runtime(batch_size=args.batch_size, progress=False)
        sessions = {True: steering.GenerationSession(m, prompts, run),     # rows dropped, the plain pass reused
                    False: steering.GenerationSession(m, prompts, run, drop_finished=False, reuse=False)}
        prompts.encode(m)
        s0 = time.perf_counter()
        if ivs:
            sessions[True].states({args.layer})
        states_s = time.perf_counter() - s0
        times: dict[bool, list[float]] = {True: [], False: []}
        outs = {}
        for _ in range(args.rounds):
            for ours in (True, False):
                s = time.perf_counter()
                outs[ours] = sessions[ours].generate(*ivs, max_new_tokens=args.tokens).token_ids
                times[ours].append(time.perf_counter() - s)
        hf, us = statistics.median(times[False]), statistics.median(times[True])
        rows.append({"prompts": f"{name} ({len(prompts)})", "edit": label + (
            f"; plain pass for the resume {states_s:.2f} s" if ivs else ""), "HF generate s": f"{hf:.2f}",
            "ours s": f"{us:.2f}", "ours / HF": f"{us / hf:.2f}", "same tokens": outs[True] == outs[False],
            "mean new tokens": f"{sum(map(len, outs[True])) / len(prompts):.1f}"})
        print(rows[-1], flush=True)
    rows.append(_stacking(m, sets["harmful test"], args))
    print(rows[-1], flush=True)
    text = table(f"Greedy generation, {args.model}, batch {args.batch_size}, up to {args.tokens} new tokens "
                 f"(median of {args.rounds} interleaved rounds)", rows, COLS)
    text += (f"\nMachine: {machine()}; {args.threads} threads; total {time.perf_counter() - t0:.0f} s. Command: "
             f"`python benchmarks/bench_decode.py --model {args.model} --rounds {args.rounds} --threads "
             f"{args.threads} --device {args.device}`.\n")
    print(text)
    write_text(args.out, text)


def _stacking(m, prompts: list[str], args: argparse.Namespace) -> dict:
    """Four post-instruction ablations of random directions: ``generate_each`` with all four in one batch
    ("ours") against one per batch ("HF generate" column: the same decoding, one condition at a time)."""
    g = torch.Generator().manual_seed(1)
    conds = [(ablation(torch.nn.functional.normalize(torch.randn(m.d_model, generator=g), dim=0),
                       "post_instruction"),) for _ in range(4)]
    session = steering.GenerationSession(m, prompts, interp.Runtime(batch_size=args.batch_size, progress=False))
    session.prefixes()
    times: dict[int, list[float]] = {4: [], 1: []}
    outs = {}
    for _ in range(args.rounds):
        for stack in (4, 1):
            s = time.perf_counter()
            outs[stack] = [x.token_ids for x in session.generate_each(conds, stack=stack,
                                                                          max_new_tokens=args.tokens)]
            times[stack].append(time.perf_counter() - s)
    one, four = statistics.median(times[1]), statistics.median(times[4])
    return {"prompts": f"harmful test ({len(prompts)}) x 4 conditions", "edit": "4 post-instruction ablations "
            "stacked in one batch (ours) vs one per batch (other column)", "HF generate s": f"{one:.2f}",
            "ours s": f"{four:.2f}", "ours / HF": f"{four / one:.2f}", "same tokens": outs[4] == outs[1],
            "mean new tokens": f"{sum(len(t) for c in outs[4] for t in c) / (4 * len(prompts)):.1f}"}


if __name__ == "__main__":
    main()
