"""Per-family check of the attention sites: pattern vs HF eager (padded mixed-length batch), every site vs
TransformerLens (TL_FAMILIES, one unpadded prompt). Prints the markdown table of benchmarks/RESULTS_attention.md.

Run from the repository root: PYTHONPATH=. python benchmarks/bench_attention.py
"""

from __future__ import annotations

import torch

from interp.testing.oracles import TL_FAMILIES, transformer_lens_model
from interp.testing.tiny import FAMILIES, MOE_FAMILIES, tiny_model
from tests.test_attention_sites import PROMPTS, TL_SITES, _ours, check_pattern_against_eager


def tl_error(m) -> float:
    tl = transformer_lens_model(m)
    names = [f"blocks.{i}.attn.{s}" for i in range(m.n_layers) for s in TL_SITES if f"blocks.{i}.attn.{s}" in tl.hook_dict]
    got, ids = _ours(m, PROMPTS[2], names)
    with torch.no_grad():
        _, cache = tl.run_with_cache(ids)
    causal = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).tril()
    err = 0.0
    for n in names:
        a, b = got[n], cache[n]
        if n.endswith(("hook_attn_scores", "hook_pattern")):
            a, b = a[..., causal], b[..., causal]
        err = max(err, (a - b).abs().max().item())
    return err, sorted({n.split(".")[-1] for n in names})


def main() -> None:
    print("| family | pattern vs HF eager `output_attentions` (3 padded prompts, all layers) | sites vs TransformerLens | max abs error vs TL |")
    print("| --- | --- | --- | --- |")
    for fam in dict.fromkeys(FAMILIES + MOE_FAMILIES):
        m = tiny_model(fam)
        e = check_pattern_against_eager(m, tiny_model(fam, attn_implementation="eager").hf, PROMPTS)
        if fam in TL_FAMILIES:
            t, sites = tl_error(m)
            print(f"| {fam} | {e:.2e} | {', '.join(sites)} | {t:.2e} |")
        else:
            print(f"| {fam} | {e:.2e} | (no TransformerLens oracle) | - |")


if __name__ == "__main__":
    main()
