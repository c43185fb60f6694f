"""Concatenate the per-area result files (RESULTS_<area>.md, written by each benchmark) into RESULTS.md."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = ["capture", "probes", "steering", "decode", "refusal", "refusal_full", "refusal_positions", "sae", "patching", "finetune",
         "finetune_speed", "circuits", "circuits_direct", "graphs", "traits", "traits_statements", "biases",
         "biases_causal", "values", "similarity", "multilingual", "gpu"]


def main() -> None:
    parts = ["# Benchmark results\n",
             "Each section is the latest table of one benchmark, with the command that produced it. Ratios come "
             "from interleaved runs in one process; absolute times on a shared 2-core machine are noise. The capture, "
             "probes, steering, sae and patching tables were measured on commit 0297a74, before the redesign of "
             "0.2, with the same scripts then named `benchmarks/<area>.py` (now `bench_<area>.py`); not re-run "
             "since.\n"]
    for area in ORDER:
        f = HERE / f"RESULTS_{area}.md"
        parts.append(f"\n## {area}\n\n" + (f.read_text().strip() + "\n" if f.exists() else
                                           f"Not run yet: `python benchmarks/bench_{area}.py`.\n"))
    (HERE / "RESULTS.md").write_text("".join(parts))


if __name__ == "__main__":
    main()
