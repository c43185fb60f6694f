"""Cross-layer transcoders on the organism (4 layers, width 64): two-stage training (per-layer transcoders, then all
decoders jointly) against end-to-end training (every encoder and decoder against the joint loss, ``sae.clt_e2e``),
with the controls: stage 1 alone (per-layer transcoders, zero cross-layer decoders) and the stage-2 refit with the
cross-layer decoders held at zero. The settings of ``tests/test_sae_clt.py``'s organism test (JumpReLU, d_sae 256
per layer, target L0 16, 100 steps of 256 tokens; stage 2 100 steps of 512 tokens); end to end at the same 25,600
tokens and at 76,800 (stage 1's tokens plus stage 2's), and two-stage with stage 1 at 76,800 tokens too (the same
encoder budget as the longer end-to-end run). Each over ``--seeds``.

    python benchmarks/bench_clt_organism.py --seeds 0 1 2

Prints per-run rows and a markdown table of means with the range over seeds: mean FVU of the MLP outputs on the
training capture and on 48 held-out prompts, mean L0 and dead fraction over layers (held out), and the CE loss
recovered (zero-ablation baseline) with all four MLPs replaced at once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._common import machine  # noqa: E402
from interp.data import load_prompts  # noqa: E402
from interp.models import load_model  # noqa: E402
from sae.clt import CrossLayerTranscoder  # noqa: E402
from sae.clt_train import CrossConfig, evaluate_clt, joint_fvu, layer_pairs, train_clt  # noqa: E402
from sae.train_config import TrainConfig  # noqa: E402
from sae.transcoder_train import capture_pairs  # noqa: E402

RUNS = ("stage 1 only (control)", "two-stage, cross-layer held at 0 (control)", "two-stage",
        "end to end, 25,600 tokens", "end to end, 76,800 tokens", "stage 1 only, 76,800 tokens (control)",
        "two-stage, stage 1 at 76,800 tokens")


def one_seed(model, train: list[str], val: list[str], seed: int, xy: tuple) -> list[dict]:
    cfg = TrainConfig(arch="jumprelu", d_sae=256, k=16, total_tokens=25_600, batch_size=256, lr=3e-3, progress=False,
                      seed=seed)
    rows = []

    def add(name: str, clt: CrossLayerTranscoder, secs: float) -> None:
        with torch.no_grad():
            fvu_train = float(joint_fvu(clt, *xy))
        q = evaluate_clt(model, clt, val)
        s = q.summary()
        rows.append({"run": name, "seed": seed, "fvu_train": fvu_train, "fvu_val": s["fvu_mean"],
                     "l0": sum(m.l0 for m in q.layers.values()) / len(q.layers), "dead": s["dead_fraction_mean"],
                     "ce_recovered": s["recovered_zero"], "seconds": secs})
        print(json.dumps(rows[-1]), flush=True)

    t0 = time.time()
    two = train_clt(model, train, cfg=cfg, cross=CrossConfig(steps=100, batch_size=512, seed=seed))
    secs = time.time() - t0
    add(RUNS[0], CrossLayerTranscoder.from_transcoders({i: r.sae for i, r in two.per_layer.items()}), float("nan"))
    t0 = time.time()
    ctl = train_clt(model, train, cfg=cfg, cross=CrossConfig(steps=100, batch_size=512, seed=seed, cross_layer=False))
    add(RUNS[1], ctl.clt, time.time() - t0)
    add(RUNS[2], two.clt, secs)
    for name, tokens in zip(RUNS[3:5], (25_600, 76_800)):
        t0 = time.time()
        e2e = train_clt(model, train, cfg=replace(cfg, total_tokens=tokens), method="end_to_end")
        add(name, e2e.clt, time.time() - t0)
    t0 = time.time()
    long = train_clt(model, train, cfg=replace(cfg, total_tokens=76_800),
                     cross=CrossConfig(steps=100, batch_size=512, seed=seed))
    secs = time.time() - t0
    add(RUNS[5], CrossLayerTranscoder.from_transcoders({i: r.sae for i, r in long.per_layer.items()}), float("nan"))
    add(RUNS[6], long.clt, secs)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model("organism")
    P = {s: [r["instruction"] for r in load_prompts(f"organism_{s}")]
         for s in ("harmful_train", "harmless_train", "harmful_val", "harmless_val")}
    train, val = P["harmful_train"] + P["harmless_train"], P["harmful_val"][:24] + P["harmless_val"][:24]
    xy = layer_pairs(capture_pairs(model, train, None), int(model.n_layers), "exclude")
    rows = [r for seed in args.seeds for r in one_seed(model, train, val, seed, xy)]
    print(f"\n{machine()}\n")
    print("| run | mean FVU, training capture | mean FVU, held out | mean L0 | dead | CE recovered | train s |")
    print("|---|---|---|---|---|---|---|")
    for name in RUNS:
        rs = [r for r in rows if r["run"] == name]
        print(f"| {name} | {_cell(rs, 'fvu_train')} | {_cell(rs, 'fvu_val')} | {_cell(rs, 'l0', '.1f')} | "
              f"{_cell(rs, 'dead')} | {_cell(rs, 'ce_recovered')} | {_cell(rs, 'seconds', '.0f')} |")


def _cell(rs: list[dict], k: str, fmt: str = ".3f") -> str:
    """The mean over seeds and, with more than one, the range."""
    v = [r[k] for r in rs]
    m = sum(v) / len(v)
    return f"{m:{fmt}} [{min(v):{fmt}}, {max(v):{fmt}}]" if len(v) > 1 else f"{m:{fmt}}"


if __name__ == "__main__":
    main()
