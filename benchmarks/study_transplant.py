"""Where smollm2-aligned's refusal lives: blocks of attention or MLP weights transplanted from the aligned model into
its base (and back), a greedy search for the blocks that bring the refusal, validated by generation against blocks
drawn at random among those the fine-tune changed (``interp.studies.finetune.transplant_study``).

    python benchmarks/study_transplant.py --threads 2

The section goes to ``benchmarks/RESULTS_finetune.md`` under its own heading (a rerun replaces it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import machine, markdown_table, replace_section  # noqa: E402
from interp.models import load_model  # noqa: E402
from interp.studies.finetune.transplant import TransplantConfig, transplant_study  # noqa: E402
from interp.studies.kit.config import DataConfig  # noqa: E402
from interp.studies.kit.prompt_sets import load_refusal_data  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "RESULTS_finetune.md"
HEADING = "### Transplant: where smollm2-aligned's refusal lives"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--block-size", type=int, default=3)
    ap.add_argument("--max-steps", type=int, default=3)
    ap.add_argument("--n-random", type=int, default=2)
    ap.add_argument("--n", type=int, default=32, help="val and test prompts per class (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    base, aligned = load_model("smollm2-base"), load_model("smollm2-aligned")
    data = load_refusal_data("smollm2-aligned", DataConfig(n_val=args.n, n_test=args.n))
    st = transplant_study(base, aligned, data, config=TransplantConfig(block_size=args.block_size, max_steps=args.max_steps,
                                                          n_random=args.n_random, max_new_tokens=20))
    text = report(args, st, time.time() - t0)
    print(text)
    replace_section(RESULTS, HEADING, text)


def report(args, st, wall: float) -> str:
    search = st.search.to_frame()
    lines = [HEADING, "", f"`python benchmarks/study_transplant.py --block-size {args.block_size} --max-steps "
             f"{args.max_steps} --n-random {args.n_random} --n {args.n} --threads {args.threads}` ({machine()}; "
             f"{wall:.0f} s). Score: the mean refusal log-odds gap (harmful minus harmless) of the refusal tokens "
             f"{st.tokens} on {args.n} val prompts per class: base {st.scores['base']:.2f}, aligned "
             f"{st.scores['aligned']:.2f}. Greedy picks (blocks of {args.block_size} layers, attention or MLP): "
             f"{', '.join(f'{p} {layers[0]}-{layers[-1]}' for layers, p in st.found) or 'none'}.", "",
             markdown_table(search), "",
             f"Validation on {args.n} test prompts per class (greedy 20 tokens, the anchored judge, 95% Wilson "
             f"intervals); random = as many blocks of each part drawn among the other blocks the fine-tune changed:", "",
             "| condition | harmful refused | harmless refused | blocks |", "|---|---|---|---|"]
    by: dict[str, dict[str, dict]] = {}
    for r in st.rates:
        by.setdefault(r["condition"], {})[r["split"]] = r
    for name, rows in by.items():
        h, s = rows["harmful"], rows["harmless"]
        lines.append(f"| {name} | {h['k']}/{h['n']} [{100 * h['ci95'][0]:.0f}, {100 * h['ci95'][1]:.0f}]% | "
                     f"{s['k']}/{s['n']} | {' '.join(h.get('blocks', [])) or '-'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
