"""TopK vs Matryoshka BatchTopK at matched L0 on SmolLM2: sparse probing (harmful vs harmless, one language pair)
and first-letter absorption. Both SAEs train on the same activation tokens with the same seed and budget.

    python benchmarks/bench_dictmetrics.py --layer 15 --tokens 60000 --train-tokens 400000 --out /tmp/dictmetrics

``--match-l0``: Matryoshka BatchTopK trains first at ``--k``; its inference L0 (learned threshold) is measured on
the held-out tokens and TopK trains at k = that L0 rounded, so both are compared at the same L0.

Prints a markdown table (paste into benchmarks/RESULTS_dictmetrics.md) and writes the results under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

import interp
from interp.studies.directions.biases import lexical_features
from probes.logistic import solve_logistic
from sae.absorption import AbsorptionConfig, absorption
from sae.probing import SparseProbeConfig, probe_concept
from sae.quality import evaluate
from sae.runner import site_tokens
from sae.trainer import train_sae

DATA = Path(__file__).resolve().parents[1] / "interp" / "data" / "prompts"


def _jsonl(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


def training_texts() -> list[str]:
    """Every committed prompt text (the probing sets' test rows are held out of SAE training)."""
    out = []
    for f in sorted(DATA.glob("*.jsonl")):
        for r in _jsonl(f.name):
            t = r.get("instruction") or r.get("text") or r.get("prompt")
            if isinstance(t, str) and r.get("split") != "test":
                out.append(t)
    return out


def activations(model, site: str, texts: list[str], cap: int) -> torch.Tensor:
    xs, n = [], 0
    for x, b in site_tokens(model, site, texts, 16):
        keep = b.attention_mask.bool()
        if b.special_mask is not None:
            keep &= ~b.special_mask.bool()
        xs.append(x[keep])
        n += int(keep.sum())
        if n >= cap:
            break
    return torch.cat(xs)[:cap]


def concepts(n: int, seed: int) -> dict[str, tuple[list[str], torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)

    def pick(rows: list[str]) -> list[str]:
        return [rows[i] for i in torch.randperm(len(rows), generator=g)[:n].tolist()]

    harm = pick([r["instruction"] for r in _jsonl("harmful_realistic.jsonl")])
    safe = pick([r["instruction"] for r in _jsonl("harmless_realistic.jsonl")])
    ml = _jsonl("multilingual_safety.jsonl")
    fr, de = pick([r["instruction"] for r in ml if r["lang"] == "fr"]), pick([r["instruction"] for r in ml if r["lang"] == "de"])
    lab = torch.tensor([1] * n + [0] * n)
    return {"harmful vs harmless": (harm + safe, lab), "French vs German": (fr + de, lab)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--layer", type=int, default=15)
    ap.add_argument("--tokens", type=int, default=60_000, help="distinct activation tokens for SAE training")
    ap.add_argument("--train-tokens", type=int, default=400_000, help="tokens seen in training (epochs over --tokens)")
    ap.add_argument("--d-sae", type=int, default=2048)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--n-probe", type=int, default=150, help="prompts per class for sparse probing")
    ap.add_argument("--max-words", type=int, default=3000)
    ap.add_argument("--out", default="/tmp/dictmetrics")
    ap.add_argument("--match-l0", action="store_true",
                    help="train TopK at k = Matryoshka's measured inference L0 (rounded); default: both at --k")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = interp.load_model(args.model)
    site = f"blocks.{args.layer}.hook_resid_post"
    t0 = time.time()
    x = activations(model, site, training_texts(), args.tokens)
    held = x[-4096:]
    print(f"# {len(x)} activation tokens at {site} in {time.time() - t0:.0f}s")
    kinds = {"matryoshka_batchtopk": {"arch": "matryoshka_batchtopk", "k": args.k,
                                      "options": {"widths": [args.d_sae // 16, args.d_sae // 4, args.d_sae]}},
             "topk": {"arch": "topk", "k": args.k}}
    sets = concepts(args.n_probe, 0)
    lex = {c: lexical_features(model, t)[:, 0] for c, (t, _) in sets.items()}
    rows = []
    for name, kw in kinds.items():
        if name == "topk" and args.match_l0:
            # matched L0: TopK keeps exactly k per token, so its k is Matryoshka's measured inference L0, rounded
            kw = {**kw, "k": max(1, round(rows[0]["l0"]))}
        rows.append(_measure(name, kw, x, held, model, sets, lex, args))
    print(f"\nmachine: {platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread")
    _table(rows)


def _measure(name: str, kw: dict, x: torch.Tensor, held: torch.Tensor, model, sets: dict, lex: dict,
             args: argparse.Namespace) -> dict:
    """Train one SAE on ``x`` minus the held-out tail, then its quality, sparse probing and absorption row."""
    t0 = time.time()
    tr = train_sae(x[:-4096], d_sae=args.d_sae, total_tokens=args.train_tokens, batch_size=1024,
                   site=f"blocks.{args.layer}.hook_resid_post", seed=0, log_every=10**9, **kw)
    s, secs = tr.sae.eval(), time.time() - t0
    q = evaluate(s, held)
    row = {"sae": name, "k": kw["k"], "train_s": round(secs), "l0": round(q.l0, 1), "fvu": round(q.fvu, 3),
           "dead": round(q.dead_fraction, 3)}
    for c, (texts, y) in sets.items():
        r = probe_concept(s, model, texts, y, lex[c], solve_logistic,
                          SparseProbeConfig(ks=(1, 2, 5, 10, 20), concept=c))
        r.save(Path(args.out) / name / c.replace(" ", "_"), overwrite=True)
        row[c] = r.summary()
    a = absorption(s, model, solve_logistic, AbsorptionConfig(), max_words=args.max_words)
    a.save(Path(args.out) / name / "absorption", overwrite=True)
    row["absorption"] = a.summary()
    print(json.dumps(row), flush=True)
    return row


def _table(rows: list[dict]) -> None:
    print("\n| SAE | train k | L0 | FVU | dead | concept | k=1 | k=2 | k=5 | k=10 | k=20 | random k=5 | residual | bag of tokens |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        for c in ("harmful vs harmless", "French vs German"):
            s = r[c]
            ks = " | ".join(f"{s[f'acc_k{k}']:.3f}" for k in (1, 2, 5, 10, 20))
            print(f"| {r['sae']} | {r['k']} | {r['l0']} | {r['fvu']} | {r['dead']} | {c} | {ks} | {s['control_k5']:.3f} | "
                  f"{s['residual_accuracy']:.3f} | {s['lexical_accuracy']:.3f} |")
    print("\n| SAE | mean absorption | random-direction control | absorbed / words | letters | mean main latents |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        a = r["absorption"]
        print(f"| {r['sae']} | {a['mean_absorption']:.4f} | {a['mean_control']:.4f} | {a['absorbed']} / {a['words']} | "
              f"{a['letters']} | {a['mean_main_latents']:.2f} |")


if __name__ == "__main__":
    main()
