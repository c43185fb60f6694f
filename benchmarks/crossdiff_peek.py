"""What the steered model writes: a few harmful test prompts' greedy answers from the tuned model unsteered, with
the study's chosen crosscoder latents subtracted, and with the first random draw's (norm-matched) subtracted, at each
``--subtract`` multiple. It reads the chosen latents, their weights and the draws from the steering rows file that
``study_crossdiff.py`` saved (run that first, with the same ``--tuned`` / ``--prompts`` / sizes).

    python benchmarks/crossdiff_peek.py --tuned gemma3-aligned --prompts 700 --subtract 1,0.25 --n 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.study_crossdiff import PAIRS  # noqa: E402
from interp.io import read_json  # noqa: E402
from interp.models import ADAPTERS, cache_dir  # noqa: E402
from interp.studies.finetune.crossdiff import _matched, load_pair  # noqa: E402
from interp.studies.kit.prompt_sets import load_refusal_data  # noqa: E402
from interp.values import Runtime  # noqa: E402
from sae.crosscoder import Crosscoder  # noqa: E402
from sae.edits import LatentSteering  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tuned", default="smollm2-aligned", choices=sorted(PAIRS))
    ap.add_argument("--prompts", type=int, default=1300)
    ap.add_argument("--d-sae", type=int, default=2048)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--subtract", default="1")
    ap.add_argument("--n", type=int, default=3, help="harmful test prompts shown")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import steering

    folder = cache_dir() / "crossdiff" / args.tuned / f"L{PAIRS[args.tuned]}"
    tag = f"{args.d_sae}_k{args.k}_e{args.epochs}_lr{args.lr:g}"
    rows = folder / f"steer_{args.prompts}_{tag}.json"
    if not rows.exists():
        raise SystemExit(f"no steering rows at {rows}; run benchmarks/study_crossdiff.py with the same sizes first")
    key = read_json(rows)["key"]
    cc = Crosscoder.load(folder / f"cc_crosscoder_batchtopk_{tag}" / "sae")
    _, tuned = load_pair(ADAPTERS[args.tuned][0], args.tuned)
    harm = load_refusal_data(args.tuned).harmful["test"].instructions[:args.n]
    view, chosen, w = cc.view(1), key["chosen"], key["weights"]
    norm = float(LatentSteering(view, chosen, w).vector().norm())
    print(f"chosen {chosen}; x1 vector norm {norm:.1f}")
    conditions = [("unsteered", [])]
    for m in (float(v) for v in args.subtract.split(",")):
        conditions += [(f"chosen x{m:g}", [LatentSteering(view, chosen, [-m * x for x in w], sinks="exclude")]),
                       (f"random draw 0 x{m:g}", [_matched(view, key["draws"][0], m * norm, -1.0)])]
    for name, edits in conditions:
        g = steering.generate(tuned, harm, *edits, max_new_tokens=24, runtime=Runtime(batch_size=len(harm),
                                                                                       progress=False))
        for t in g.texts:
            print(f"| {name} | `{t[:120].replace('|', '/').replace(chr(10), ' ')}` |")


if __name__ == "__main__":
    main()
