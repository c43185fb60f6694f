"""What the steered model writes: a few harmful (or ``--split harmless``) test prompts' greedy answers from the tuned model unsteered, with
the study's chosen crosscoder latents subtracted, and with the first random draw's (norm-matched) subtracted, at each
``--subtract`` multiple; with ``--ablate`` also the chosen latents and the first draw of each random control ablated
token by token (``CrossDiffConfig.ablate``), after the size of what each ablation removes (the norm of ``z @ W_dec`` over the
latents, per token and at the last prompt token, beside the residual's norm). It reads the chosen latents, their
weights and the draws from the steering rows file that ``study_crossdiff.py`` saved (run that first, with the same
``--tuned`` / ``--prompts`` / sizes).

    python benchmarks/crossdiff_peek.py --tuned gemma3-aligned --prompts 700 --subtract 1,0.25 --n 3
    python benchmarks/crossdiff_peek.py --tuned gemma3-aligned --prompts 700 --subtract "" --ablate --n 8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.study_crossdiff import PAIRS  # noqa: E402
from interp.capturing import capture  # noqa: E402
from interp.io import read_json  # noqa: E402
from interp.models import ADAPTERS, cache_dir  # noqa: E402
from interp.studies.finetune.crossdiff import _matched, load_pair  # noqa: E402
from interp.studies.kit.prompt_sets import load_refusal_data  # noqa: E402
from interp.values import Runtime  # noqa: E402
from sae.crosscoder import Crosscoder  # noqa: E402
from sae.edits import LatentAblation, LatentSteering, MatchedRemoval  # noqa: E402


def removed(model, view, prompts, latents: dict[str, list[int]]) -> None:
    """Print the norm of what ablating each set of latents removes (``z @ W_dec``), mean over real tokens and at
    the last prompt token, beside the residual's norm there (attention sinks left out, as the edit leaves them)."""
    acts = capture(model, prompts, sites=[view.site], positions="all", runtime=Runtime(progress=False))
    x = acts.flat_tokens(view.site)
    last = acts.site(view.site)[:, -1]
    for name, idx in latents.items():
        cut = [(view.encode(v)[..., idx] @ view.W_dec[idx]).norm(dim=-1) for v in (x, last)]
        print(f"{name}: removes |z W_dec| {cut[0].mean():.1f} per token on average (max {cut[0].max():.1f}), "
              f"{cut[1].mean():.1f} at the last prompt token; residual norm {x.norm(dim=-1).mean():.1f} per token, "
              f"{last.norm(dim=-1).mean():.1f} at the last token")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tuned", default="smollm2-aligned", choices=sorted(PAIRS))
    ap.add_argument("--prompts", type=int, default=1300)
    ap.add_argument("--d-sae", type=int, default=2048)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--subtract", default="1")
    ap.add_argument("--ablate", action="store_true", help="also the chosen and random latents ablated")
    ap.add_argument("--n", type=int, default=3, help="test prompts shown")
    ap.add_argument("--split", choices=("harmful", "harmless"), default="harmful", help="which test prompts")
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
    data = load_refusal_data(args.tuned)
    harm = (data.harmful if args.split == "harmful" else data.harmless)["test"].instructions[:args.n]
    view, chosen, w = cc.view(1), key["chosen"], key["weights"]
    norm = float(LatentSteering(view, chosen, w).vector().norm())
    print(f"chosen {chosen}; x1 vector norm {norm:.1f}")
    conditions = [("unsteered", [])]
    if args.ablate:
        same = cc.view(1, inputs="same")
        sets = {"chosen": chosen, "random draw 0": key["draws"][0]}
        removed(tuned, same, harm, sets)
        conditions += [(f"{name} ablated", [LatentAblation(same, lat, sinks="exclude")]) for name, lat in sets.items()]
        conditions.append(("norm-matched random draw 0 (MatchedRemoval)",
                           [MatchedRemoval(same, chosen, key["draws"][0], sinks="exclude")]))
    for m in (float(v) for v in args.subtract.split(",") if v):
        conditions += [(f"chosen x{m:g}", [LatentSteering(view, chosen, [-m * x for x in w], sinks="exclude")]),
                       (f"random draw 0 x{m:g}", [_matched(view, key["draws"][0], m * norm, -1.0)])]
    for name, edits in conditions:
        g = steering.generate(tuned, harm, *edits, max_new_tokens=24, runtime=Runtime(batch_size=len(harm),
                                                                                       progress=False))
        for t in g.texts:
            print(f"| {name} | `{t[:120].replace('|', '/').replace(chr(10), ' ')}` |")


if __name__ == "__main__":
    main()
