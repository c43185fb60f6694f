"""A small cross-layer transcoder on SmolLM2-135M (the aligned organism's weights, 30 layers, width 576), trained for a
few CPU minutes, beside its two controls: the per-layer transcoders of stage 1 (a CLT with zero cross-layer
decoders) and the same stage-2 refit with the cross-layer decoders held at zero. Replacement quality on held-out
prompts: FVU of each MLP output (mean and worst over layers, first token left out), L0, and the CE loss recovered
with all 30 MLPs replaced at once. Writes its section of ``benchmarks/RESULTS_graphs.md``.

    python benchmarks/bench_clt_smollm2.py --threads 2
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._common import machine, replace_section  # noqa: E402
from interp.data import load_prompts  # noqa: E402
from interp.models import load_model  # noqa: E402
from interp.positions import without_first  # noqa: E402
from interp.values import Runtime  # noqa: E402
from sae.clt import CrossLayerTranscoder  # noqa: E402
from sae.clt_train import CrossConfig, evaluate_clt, fit_cross, layer_pairs, train_clt  # noqa: E402
from sae.train_config import TrainConfig  # noqa: E402
from sae.transcoder_train import capture_pairs  # noqa: E402

RESULTS = REPO / "benchmarks" / "RESULTS_graphs.md"
HEADING = "### A small cross-layer transcoder on SmolLM2-135M: replacement quality"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-aligned")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--d-sae", type=int, default=128)
    ap.add_argument("--l0", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=25_600, help="stage-1 tokens per layer")
    ap.add_argument("--cross-steps", type=int, default=60)
    ap.add_argument("--cross-batch", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    P = {s: [r["instruction"] for r in load_prompts(f"organism_{s}")]
         for s in ("harmful_train", "harmless_train", "harmful_val", "harmless_val")}
    train, val = P["harmful_train"] + P["harmless_train"], P["harmful_val"][:24] + P["harmless_val"][:24]
    cfg = TrainConfig(arch="jumprelu", d_sae=args.d_sae, k=args.l0, total_tokens=args.tokens, batch_size=256,
                      lr=2e-3, progress=False)
    cross = CrossConfig(steps=args.cross_steps, batch_size=args.cross_batch, lr=1e-3)
    t0 = time.time()
    tr = train_clt(model, train, cfg=cfg, cross=cross, sinks="exclude", runtime=Runtime(batch_size=16))
    t_clt = time.time() - t0
    print(f"trained in {t_clt:.0f} s: {tr.summary()}", flush=True)
    per_layer = CrossLayerTranscoder.from_transcoders({i: r.sae for i, r in tr.per_layer.items()})
    control = copy.deepcopy(per_layer)
    pairs = capture_pairs(model, train, None, batch_size=16)
    pairs.mask = without_first(pairs.mask)
    x, y = layer_pairs(pairs, model.n_layers, cfg.sinks)
    del pairs
    t0 = time.time()
    fit_cross(control, x, y, CrossConfig(steps=args.cross_steps, batch_size=args.cross_batch, lr=1e-3,
                                         cross_layer=False))
    t_ctl = time.time() - t0
    rows = []
    for name, clt in (("per-layer transcoders (stage 1)", per_layer), ("control: decoders refit, no cross-layer", control),
                      ("CLT (stage 2 with cross-layer decoders)", tr.clt)):
        s = evaluate_clt(model, clt, val, batch_size=16, sinks="exclude").summary()
        rows.append((name, s))
        print(name, s, flush=True)
    lines = [HEADING, "", f"{args.model}, {model.n_layers} layers; JumpReLU, d_sae {args.d_sae} per layer at L0 "
             f"{args.l0}; stage 1 {args.tokens} tokens per layer, stage 2 {args.cross_steps} steps of "
             f"{args.cross_batch} tokens on {x.shape[0]} training tokens ({len(train)} prompts); held out: {len(val)} "
             f"prompts. Training took {t_clt:.0f} s (both stages), the control's refit {t_ctl:.0f} s.", "",
             "| replacement | FVU mean | FVU worst layer | CE clean | CE replaced | CE MLPs zeroed | CE recovered (vs zero) |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {n} | {s['fvu_mean']:.3f} | {s['fvu_max']:.3f} | {s['ce_clean']:.3f} | {s['ce_replaced']:.3f} | "
              f"{s['ce_zero_ablated']:.3f} | {s['recovered_zero']:.3f} |" for n, s in rows]
    load = "/".join(f"{v:.1f}" for v in os.getloadavg())
    lines += ["", f"{machine()}; load average at the end {load}. Command: `python benchmarks/bench_clt_smollm2.py "
              f"--threads {args.threads} --d-sae {args.d_sae} --l0 {args.l0} --tokens {args.tokens} --cross-steps "
              f"{args.cross_steps} --cross-batch {args.cross_batch}`. FVU: per layer on held-out tokens, each prompt's "
              f"first token left out; CE: every token, all MLPs replaced at once.", ""]
    text = "\n".join(lines)
    print(text)
    replace_section(RESULTS, HEADING, text)


if __name__ == "__main__":
    main()
