"""Where to ablate a refusal candidate: every token (the paper) vs the post-instruction tokens only, on the same
candidates and val prompts: the exact bypass, induce and KL scores of both (``score_candidates``), as a table,
with the KL of seeded random unit directions ablated the same way (the KL filter's reference level).

``python benchmarks/bench_refusal_positions.py --model smollm2-aligned --layers 10-22 --positions=-1,-2``
``--model`` also takes a model folder or a LoRA adapter folder (``--base smollm2-base``: a scratch organism from
``python -m interp.organisms.train_smollm2 --out DIR``); ``--zero-dims 507,247`` zeroes those residual dimensions of every
candidate (massive activations) before scoring. ``--judged`` adds what the scores stand in for: each candidate's
judged refusal rate on the val prompts (greedy, 24 tokens, the job's judge) with the direction ablated in each mode
(harmful prompts) and added at its layer (harmless prompts). ``--affine`` (with ``--judged``) adds an affine edit
beside the ablation (as in Marshall et al. 2024, "Refusal in LLMs: an affine function"): the projection on the
candidate's direction set, at every layer's resid_pre, to the harmless train prompts' mean projection at that layer
(last post-instruction token), at the post-instruction and generated tokens; its judged harmful refusal and its
harmless next-token KL. A zero ablation moves harmless prompts whose mean projection is far from 0 by that mean; the
affine edit moves each class to the harmless mean.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from interp.values import Runtime


def _ints(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-") if not part.startswith("-") else (part, "", "")
        out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    return out


def _judged(m, data, cand, layers: list[int], positions: list[int], affine: bool = False
            ) -> dict[tuple[int, int], tuple[float, ...]]:
    """``(layer, position) -> (harmful refused, every-token ablation; post-instruction ablation; harmless refused
    under addition[; harmful refused, affine edit; harmless KL, affine edit])`` on the val prompts, and ``(-1, 0)``
    the two baselines."""
    import steering
    from interp.capturing import capture
    from interp.evals.logits import kl_div
    from interp.forward import prepare
    from interp.studies.kit.runs import refusal_rate
    from interp.studies.kit.scoring import ablation, prompt_logits

    harmful, harmless = data.harmful["val"].instructions, data.harmless["val"].instructions

    def rate(prompts: list[str], *ivs) -> float:
        return refusal_rate(m, prompts, None, 24, ivs, batch_size=64)["rate"]

    if affine:  # the harmless train prompts at every layer's resid_pre, last post-instruction token [n, L, d]
        every = list(range(m.n_layers))
        ref = capture(m, data.harmless["train"].instructions, sites="resid_pre", layers=every,
                      positions="post_instruction", runtime=Runtime(progress=False)).tensor[:, :, -1]
        _, enc = prepare(m, harmless)
        clean = prompt_logits(m, enc)
    out = {(-1, 0): (rate(harmful), rate(harmless))}
    for li, layer in enumerate(layers):
        for p in positions:
            v = cand.raw[li, cand.n_positions + p]
            r = v / v.norm()
            out[layer, p] = (rate(harmful, ablation(r, "all")), rate(harmful, ablation(r, "post_instruction")),
                             rate(harmless, steering.AddVector(v, sites="resid_pre", layers=layer)))
            if affine:
                mean = (ref @ r).mean(0)  # [L]: the harmless mean projection on r at each layer
                edit = [steering.Clamp(r, value=float(mean[i]), layers=i, sites="resid_pre",
                                       positions="post_instruction") for i in every]
                kl = float(kl_div(clean, prompt_logits(m, enc, *edit)).mean())
                out[layer, p] += (rate(harmful, *edit), kl)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-aligned")
    ap.add_argument("--layers", default="14-20", help="candidate layers, e.g. 14-20 or 4,8,16 (default: %(default)s)")
    ap.add_argument("--positions", default="-1", help="post-instruction positions from the end (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--base", default=None, help="base model name when --model is a LoRA adapter folder")
    ap.add_argument("--zero-dims", default="", help="residual dimensions zeroed in every candidate, e.g. 507,247")
    ap.add_argument("--n-random", type=int, default=8, help="random directions for the KL reference (default: 8)")
    ap.add_argument("--judged", action="store_true", help="also the judged refusal rates under each edit (val prompts)")
    ap.add_argument("--affine", action="store_true", help="with --judged: also the affine edit (projection set to "
                    "the harmless train mean at every layer) with its harmless KL")
    args = ap.parse_args()
    if args.affine and not args.judged:
        ap.error("--affine adds columns to the judged table: pass --judged too")
    if args.threads:
        torch.set_num_threads(args.threads)
    import interp
    from interp.studies.kit.config import SelectionConfig
    from interp.studies.refusal import (
        find_candidates,
        find_refusal_tokens,
        load_refusal_data,
        score_candidates,
    )

    t0, load0 = time.perf_counter(), os.getloadavg()
    from interp.models import with_adapter

    m = with_adapter(interp.load_model(args.base), args.model) if args.base else interp.load_model(args.model)
    data = load_refusal_data(args.model)  # a folder is not the toy organism: the realistic sets
    tok = find_refusal_tokens(m, data, min_refusals=8)
    layers = _ints(args.layers)
    cand = find_candidates(m, data, layers)
    dims = [int(x) for x in args.zero_dims.split(",") if x]
    if dims:
        cand.raw[..., dims] = 0.0
    positions = [int(p) for p in args.positions.split(",")]
    only = torch.zeros(len(layers), cand.n_positions, dtype=torch.bool)
    only[:, [cand.n_positions + p for p in positions]] = True
    scores = {mode: score_candidates(m, data, cand, tok, only=only,
                                     config=SelectionConfig(ablate_positions=mode, n_random=args.n_random))
              for mode in ("all", "post_instruction")}
    base = scores["all"]
    judged = _judged(m, data, cand, layers, positions, args.affine) if args.judged else {}
    lines = [f"### Every-token vs post-instruction ablation of the same candidates: `{args.model}`\n",
             f"Refusal score = mean log-odds of the refusal tokens {tok.strings} on {len(data.harmful['val'])} "
             f"harmful / {len(data.harmless['val'])} harmless val prompts (baseline harmful "
             f"{base.baseline_harmful:.2f}, harmless {base.baseline_harmless:.2f}). Bypass: under ablation, harmful "
             f"(lower = less refusal); KL: under ablation, harmless, last prompt token; induce: under addition at the "
             f"candidate's layer (the same in both modes).\n",
             "| layer | position | bypass, every token | KL, every token | bypass, post-instruction | "
             "KL, post-instruction | induce |" + (" harmful refused, every-token ablation | harmful refused, "
             "post-instruction ablation | harmless refused, addition |" if judged else "")
             + (" harmful refused, affine edit | KL, affine edit |" if args.affine else ""),
             "|---|---|---|---|---|---|---|" + ("---|---|---|" if judged else "") + ("---|---|" if args.affine else "")]
    for mode, sc in scores.items():
        ks = sorted(sc.kl_random)
        where = "every token" if mode == "all" else "the post-instruction tokens"
        lines.insert(2, f"KL of {len(ks)} random unit directions ablated at {where} (seeded): "
                        f"{', '.join(f'{k:.3f}' for k in ks)}.\n")
    if dims:
        lines.insert(2, f"Dimensions {dims} zeroed in every candidate before scoring.\n")
    for li, layer in enumerate(layers):
        for p in positions:
            pi = cand.n_positions + p
            a, q = scores["all"], scores["post_instruction"]
            lines.append(f"| {layer} | {p} | {a.bypass[li, pi]:.2f} | {a.kl[li, pi]:.3f} | {q.bypass[li, pi]:.2f} | "
                         f"{q.kl[li, pi]:.3f} | {a.induce[li, pi]:.2f} |"
                         + "".join(f" {x:.3f} |" if i == 4 else f" {x:.2f} |"  # the affine edit's KL
                                   for i, x in enumerate(judged.get((layer, p), ()))))
    if judged:
        h, s = judged[-1, 0]
        lines.append(f"\nJudged refusal without an edit (val): harmful {h:.2f}, harmless {s:.2f}; greedy, 24 tokens.")
    lines.append(f"\nMachine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
                 f"({torch.get_num_threads()} threads); {time.perf_counter() - t0:.0f} s; load average before "
                 f"{load0[0]:.1f}, after {os.getloadavg()[0]:.1f}. Command: `python benchmarks/bench_refusal_positions.py "
                 f"--model {args.model} --layers {args.layers} --positions={args.positions}"
                 f"{f' --base {args.base}' if args.base else ''}{f' --zero-dims {args.zero_dims}' if dims else ''}"
                 f"{f' --n-random {args.n_random}' if args.n_random != 8 else ''}{' --judged' if judged else ''}{' --affine' if args.affine else ''}`.")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
