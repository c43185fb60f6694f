"""SAE model diffing on the realistic organism: an SAE trained on smollm2-base's residual stream, its latents ranked
by how the safety fine-tune (smollm2-aligned) changed them at the harmful val prompts' last token, the most
amplified ones ablated in the aligned model and added to the base, each against frequency-matched random latents.

    python benchmarks/study_diffing.py --layer 19 --threads 2

The SAE (and the ranked latents) are saved under ``--save`` for ``study_circuits.py --diff``. The section goes to
``benchmarks/RESULTS_finetune.md`` under its own heading (a rerun replaces it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import machine, replace_section  # noqa: E402
from interp.data import load_prompts  # noqa: E402
from interp.evals.rates import fisher_greater  # noqa: E402
from interp.models import cache_dir, load_model  # noqa: E402
from interp.studies.finetune.diffing import (
    DiffConfig,
    diff_study,  # noqa: E402
)
from interp.studies.kit.prompt_sets import load_refusal_data  # noqa: E402
from interp.studies.kit.stages import find_candidates  # noqa: E402
from interp.values import Runtime

RESULTS = Path(__file__).resolve().parent / "RESULTS_finetune.md"
HEADING = "### SAE model diffing on smollm2-aligned"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layer", type=int, default=19, help="the SAE reads resid_post of this layer (default: 19, "
                                                            "i.e. resid_pre.20, where the organism's refusal is read)")
    ap.add_argument("--d-sae", type=int, default=2048)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--n-steer", type=int, default=10)
    ap.add_argument("--n-random", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save", default=None, help="folder for the SAE and the ranked latents (default: the cache)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    base, tuned = load_model("smollm2-base"), load_model("smollm2-aligned")
    data = load_refusal_data("smollm2-aligned")
    extra = [r["instruction"] for r in load_prompts("harmless_general")]
    sae_prompts = data.harmful["train"].instructions + data.harmless["train"].instructions + extra
    st = diff_study(base, tuned, data, args.layer, sae=sae_prompts,
                    config=DiffConfig(d_sae=args.d_sae, k=args.k, n_steer=args.n_steer, n_random=args.n_random),
                    runtime=Runtime(seed=0))
    r = find_candidates(tuned, data, layers=[args.layer + 1]).raw[0, -1]
    r = r / r.norm()
    save = Path(args.save) if args.save else cache_dir() / "diffing" / "smollm2-aligned" / f"L{args.layer}"
    if not (save / "sae" / "meta.json").exists():
        st.sae.save(save / "sae")
    (save / "latents.json").write_text(json.dumps({"top": st.top, "site": st.meta["site"]}))
    text = report(args, st, r, len(sae_prompts), time.time() - t0, save)
    print(text)
    replace_section(RESULTS, HEADING, text)


def report(args, st, r: torch.Tensor, n_sae_prompts: int, wall: float, save: Path) -> str:
    fit, sizes = st.meta["fit"], st.meta["sizes"]
    w = st.sae.W_dec.detach().float()
    cos = (w / w.norm(dim=1, keepdim=True)) @ r.to(w.device)
    lines = [HEADING, "", f"`python benchmarks/study_diffing.py --layer {args.layer} --threads {args.threads}` "
             f"({machine()}; {wall:.0f} s). TopK SAE (d_sae {args.d_sae}, k {args.k}) trained on smollm2-base at "
             f"`{st.meta['site']}` from {n_sae_prompts} prompts (the refusal train splits and our general harmless "
             f"set, every token but the first); fit at the harmful val prompts' last token (FVU against the spread "
             f"across prompts at that one position, a strict measure): FVU "
             f"{fit['fvu_base']:.3f} in the base, {fit['fvu_tuned']:.3f} in the aligned model (L0 "
             f"{fit['l0_base']:.1f} / {fit['l0_tuned']:.1f}). Latents ranked by their mean increase from base to "
             f"aligned on {sizes['harmful']['val']} harmful val prompts; the top {args.n_steer} steered, against "
             f"{args.n_random} draws of frequency-matched random latents; refusal on {sizes['harmful']['test']} "
             f"harmful / {sizes['harmless']['test']} harmless test prompts, greedy 24 tokens, the anchored judge. "
             f"Cosine with the refusal direction (difference of means at resid_pre.{args.layer + 1}, last token): "
             f"the decoder row's. SAE saved in `{save}`.", "",
             "| rank | latent | increase | base mean | aligned mean | cos with refusal direction | top context |",
             "|---|---|---|---|---|---|---|"]
    frame = st.to_frame("latents")
    for _, row in frame.head(args.n_steer).iterrows():
        lat = int(row["latent"])
        ctx = (st.contexts.get(lat) or [""])[0].replace("|", "/").replace("\n", " ")[-80:]
        lines.append(f"| {int(row['rank'])} | {lat} | {row['delta']:.3f} | {row['mean_base']:.3f} | "
                     f"{row['mean_tuned']:.3f} | {float(cos[lat]):.3f} | `{ctx}` |")
    lines += ["", "| condition | prompts | refused | n | rate | 95% CI |", "|---|---|---|---|---|---|"]
    lines += [f"| {x['condition']} | {x['split']} | {x['k']} | {x['n']} | {x['rate']:.2f} | "
              f"{x['ci95'][0]:.2f}-{x['ci95'][1]:.2f} |" for x in st.rates]
    lines += ["", tests(st.rates, args.n_random)]
    return "\n".join(lines) + "\n"


def tests(rates: list[dict], n_random: int) -> str:
    """One-sided Fisher tests of the top latents against their pooled random draws, both ways."""
    by = {x["condition"]: x for x in rates}
    top = by["tuned, top latents ablated"]
    rand = [by[f"tuned, random latents ablated (draw {i})"] for i in range(n_random)]
    k, n = sum(x["k"] for x in rand), sum(x["n"] for x in rand)
    out = [f"Ablation in the aligned model: random latents refuse more than the top ones, one-sided Fisher p = "
           f"{fisher_greater(k, n, top['k'], top['n']):.3g} ({top['k']}/{top['n']} vs {k}/{n} pooled)."]
    for s in sorted({x["strength"] for x in rates if "strength" in x}):
        add = by[f"base, top latents added x{s:g}"]
        rr = [by[f"base, random latents added x{s:g} (draw {i})"] for i in range(n_random)]
        k, n = sum(x["k"] for x in rr), sum(x["n"] for x in rr)
        out.append(f"Addition x{s:g} to the base: the top latents make it refuse more than random ones, p = "
                   f"{fisher_greater(add['k'], add['n'], k, n):.3g} ({add['k']}/{add['n']} vs {k}/{n}).")
    return " ".join(out)


if __name__ == "__main__":
    main()
