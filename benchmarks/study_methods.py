"""Post-training methods compared on SmolLM2-135M-Instruct: SFT, reasoning SFT and ORPO (or DPO) from the same base
and data (the realistic organism's pair builder), short LoRA runs; the table goes to stdout and, with ``--write``,
into ``benchmarks/RESULTS_finetune.md`` under its own heading (the toy organism's table, from notebook 04, is kept).

``python benchmarks/study_methods.py --steps 60 --threads 2 [--write]``
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._common import markdown_table, replace_section  # noqa: E402
from interp.models import load_model  # noqa: E402
from interp.organisms import train_smollm2 as ts  # noqa: E402
from interp.studies.finetune.methods import MethodsConfig, compare_methods  # noqa: E402
from interp.studies.finetune.methods_data import reasoned_refusals  # noqa: E402
from interp.studies.kit.config import DataConfig  # noqa: E402
from interp.studies.kit.prompt_sets import load_refusal_data  # noqa: E402
from interp.studies.kit.runs import base_answers  # noqa: E402
from interp.tune.config import TuneConfig  # noqa: E402
from interp.values import Runtime  # noqa: E402

HEADING = "### Post-training methods compared on SmolLM2-135M-Instruct"
COLUMNS = ["model", "harmful_refusal", "harmless_refusal", "ce_vs_base", "direction_layer", "all_writers_effect",
           "attention_share", "top3_share", "gini", "top_head", "top_neuron", "add_refusal@2", "add_random@2",
           "ablate_refusal", "ablate_random"]


def training_data(base, n: int, seed: int) -> dict[str, list[str]]:
    """``n`` harmful (our refusals) and ``n`` harmless (the base's cached answers) pairs of the organism's recipe."""
    recipe = replace(ts.SafetyRecipe(seed=seed), n_harmful=n, n_extra=0, n_realistic=0, n_copyright=0, n_harmless=n,
                     n_borderline=0)
    exs = ts.examples(recipe, ts.DEFAULT_HARMFUL)
    prompts, responses = ts.pairs(base, exs)
    harm = [i for i, e in enumerate(exs) if e.kind == "harmful"][:n]
    safe = [i for i, e in enumerate(exs) if e.kind == "harmless"][:n]
    eos = base.tokenizer.eos_token or ""
    return {"harmful": [prompts[i] for i in harm], "refusals": [responses[i] for i in harm],
            "harmless": [prompts[i] for i in safe], "answers": [responses[i] for i in safe],
            "reasoned": reasoned_refusals(len(harm), seed, [exs[i].response for i in harm], suffix=eos)}


def write(table: str, command: str, machine: str) -> None:
    replace_section(REPO / "benchmarks" / "RESULTS_finetune.md", HEADING,
                    f"{HEADING}\n\n`{command}`\n\n{machine}\n\n{table}\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--n", type=int, default=64, help="harmful and harmless training pairs each")
    ap.add_argument("--preference", default="orpo", choices=("orpo", "dpo"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.time()
    base = load_model("smollm2-base")
    tr = training_data(base, args.n, args.seed)
    data = load_refusal_data("smollm2-base", DataConfig(n_train=32, n_val=32, n_test=32))
    # CE on held-out harmless text: the val prompts with the base's own greedy answers (the organism's cached
    # answers cover its training prompts only)
    ce_prompts, ce_answers = base_answers(base, data.harmless["val"].instructions, 48)
    cfg = MethodsConfig(tune=TuneConfig(steps=args.steps, rank=8, alpha=16, targets=ts.TARGETS,
                                        layers=tuple(range(14, 30)), lr=2e-3, batch_size=8), max_new_tokens=24,
                        methods=("sft", "reasoning_sft", args.preference), reasoned=tr["reasoned"])
    study = compare_methods(base, (tr["harmful"], tr["refusals"]), (tr["harmless"], tr["answers"]), data,
                            (ce_prompts, ce_answers), config=cfg,
                            runtime=Runtime(batch_size=32, seed=args.seed, progress=False))
    df = study.to_frame()
    table = markdown_table(df[[c for c in COLUMNS if c in df.columns]])
    print(table)
    machine = f"{platform.machine()}, {platform.processor() or 'cpu'}, torch {torch.__version__}, {args.threads} thread(s), " \
              f"{time.time() - t0:.0f} s"
    if args.write:
        write(table, "python benchmarks/study_methods.py " + " ".join(argv or sys.argv[1:]), machine)


if __name__ == "__main__":
    main()
