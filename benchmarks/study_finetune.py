"""Run the fine-tune studies (loss masking, elasticity) on the toy organism or the realistic SmolLM2 organism and
print their figures as JSON.

``python benchmarks/study_finetune.py --study masking --model organism``
``python benchmarks/study_finetune.py --study elasticity --model smollm2 --steps 40 --eval-every 5``
Toy data: the organism's own synthetic requests (train pairs: harmful -> one of its refusals, harmless -> its
templated answer; held out: the test split; NLL pairs: the val split). SmolLM2: the realistic organism's own
training pairs (``interp.organisms.train_smollm2.examples``), held-out sets of the refusal pipeline (``load_refusal_data``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from interp.models import load_model  # noqa: E402
from interp.studies.finetune.elasticity import ElasticityConfig, elasticity_study  # noqa: E402
from interp.studies.finetune.masking import MaskingConfig, masking_study  # noqa: E402
from interp.studies.kit.config import DataConfig  # noqa: E402
from interp.studies.kit.prompt_sets import load_refusal_data  # noqa: E402
from interp.tune import TuneConfig  # noqa: E402
from interp.values import Prompts, Runtime  # noqa: E402

TOY_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")
SMOL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def toy_pairs(split: str, n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """``n`` harmful requests with refusals then ``n`` harmless ones with answers, from the toy's ``split``."""
    from interp.organisms import data as od

    rng = random.Random(seed)
    sp = od.make_splits()
    h, s = list(sp.get("harmful", split)), list(sp.get("harmless", split))
    rng.shuffle(h)
    rng.shuffle(s)
    return ([r.instruction for r in h[:n] + s[:n]],
            [od.refusal_response(r, rng) for r in h[:n]] + [od.helpful_response(r, rng) for r in s[:n]])


def smol_pairs(n: int) -> tuple[list[str], list[str]]:
    """The first ``n`` harmful and ``n`` harmless/borderline pairs of the realistic organism's training set."""
    from interp.organisms import train_smollm2 as ts

    base = load_model("smollm2-base")
    exs = ts.examples(ts.SafetyRecipe(), ts.DEFAULT_HARMFUL)
    pick = [e for e in exs if e.kind == "harmful"][:n] + [e for e in exs if e.kind in ("harmless", "borderline")][:n]
    return ts.pairs(base, pick)


def masking(args: argparse.Namespace) -> dict:
    toy = args.model == "organism"
    if toy:
        base, adapted = load_model("organism-base"), load_model("organism")
        ps, rs = toy_pairs("train", args.n)
        ev = toy_pairs("val", 40, seed=1)
        from interp.organisms import data as od

        sp = od.make_splits()
        harm, safe = ([r.instruction for r in sp.get(k, "test")] for k in ("harmful", "harmless"))
        cfg = TuneConfig(steps=args.steps, batch_size=16, lr=1e-2, warmup=10, targets=TOY_TARGETS, seed=args.seed)
    else:
        base, adapted = load_model("smollm2-base"), load_model("smollm2-aligned")
        ps, rs = smol_pairs(args.n)
        data = load_refusal_data("smollm2-base", DataConfig(n_train=8, n_val=8, n_test=args.n_test))
        harm, safe = data.harmful["test"].instructions, data.harmless["test"].instructions
        ev = smol_eval_pairs(base, data)
        cfg = TuneConfig(steps=args.steps, batch_size=8, lr=2e-3, warmup=4, targets=SMOL_TARGETS,
                         layers=tuple(range(14, 30)), seed=args.seed)
    st = masking_study(base, adapted, Prompts(ps, responses=rs), (harm, safe), ev,
                       config=MaskingConfig(q=args.q, tune=cfg, max_new_tokens=args.max_new_tokens),
                       runtime=Runtime(batch_size=32, seed=args.seed))
    return {"rates": st.rates, "fisher_p_random_gt_top": st.fisher_p, "nll": st.nll, "meta": st.meta,
            "concentration": st.attribution.concentration(), "losses_last": {k: v["losses"][-5:]
                                                                              for k, v in st.runs.items()}}


def attribution(args: argparse.Namespace) -> dict:
    """Token attribution of the organism's adapter over its base on its own training pairs: concentration, gain by
    token class (share of the positive gain, excess over what token frequency predicts), frequency-controlled
    enrichment among the top ``q`` tokens, and the words holding the most gain."""
    from interp.tune import token_attribution

    if args.model == "organism":
        base, adapted = load_model("organism-base"), load_model("organism")
        ps, rs = toy_pairs("train", args.n)
    else:
        base, adapted = load_model("smollm2-base"), load_model("smollm2-aligned")
        ps, rs = smol_pairs(args.n)
    if len(ps) != 2 * args.n:
        raise SystemExit(f"--n {args.n}: the training set gave {len(ps)} pairs, not {args.n} harmful + {args.n} "
                         f"others; pass a smaller --n")
    att = token_attribution(base, adapted, ps, rs)
    pos = att.gain.clamp(min=0)
    refusals = att.example < args.n   # the first n pairs are harmful prompts -> the organism's refusals
    return {"n_examples": att.n_examples, "n_tokens": int(att.gain.numel()), "concentration": att.concentration(),
            "refusal_responses": {"tokens": int(refusals.sum()), "share_of_positive_gain":
                                  float(pos[refusals].sum() / pos.sum()), "mean_gain": float(att.gain[refusals].mean()),
                                  "mean_gain_other": float(att.gain[~refusals].mean())},
            "by_class": att.by_class(), "enrichment": att.enrichment(q=args.q, seed=args.seed),
            "top_words": att.by_word(top=15, min_count=3)}


def smol_eval_pairs(base, data) -> tuple[list[str], list[str]]:
    """Held-out pairs for the NLL cost: val harmless prompts with the base's own answers (helpfulness kept) and
    val harmful prompts with one of the organism's refusals."""
    from interp.organisms import smollm2_data as sd
    from interp.studies.kit.runs import base_answers

    rng = random.Random(1)
    hp, hr = base_answers(base, data.harmless["val"].instructions, 48)
    refs = sd.refusals()
    eos = base.tokenizer.eos_token or ""
    harm = data.harmful["val"].instructions
    return hp + harm, hr + [rng.choice(refs) + eos for _ in harm]


def elasticity(args: argparse.Namespace) -> dict:
    toy = args.model == "organism"
    if toy:
        base, aligned = load_model("organism-base"), load_model("organism")
        data = load_refusal_data("organism", DataConfig(n_train=64, n_val=8, n_test=args.n_test))
        forward = toy_pairs("train", args.n)
        cfg = TuneConfig(steps=args.steps, batch_size=8, lr=args.lr or 3e-3, warmup=2, targets=TOY_TARGETS,
                         seed=args.seed)
        layer = 2
    else:
        base, aligned = load_model("smollm2-base"), load_model("smollm2-aligned")
        data = load_refusal_data("smollm2-base", DataConfig(n_train=32, n_val=8, n_test=args.n_test))
        forward = smol_pairs(args.n)
        cfg = TuneConfig(steps=args.steps, batch_size=8, lr=args.lr or 2e-3, warmup=2, targets=SMOL_TARGETS,
                         layers=tuple(range(14, 30)), seed=args.seed)
        layer = args.layer
    st = elasticity_study(base, aligned, data, layer=layer, pairs={"forward": forward},
                          config=ElasticityConfig(tune=cfg, n_pairs=args.n_pairs, eval_every=args.eval_every,
                                                  n_boot=args.n_boot, max_new_tokens=args.max_new_tokens),
                          runtime=Runtime(batch_size=32, seed=args.seed))
    if args.html:
        st.plot().write_html(args.html)
    return {"outcomes": st.outcomes, "fits": {f"{c}/{q}": f.record() for (c, q), f in st.fits.items()},
            "curves": {n: [{k: r[k] for k in ("step", "refusal", "score", "cosine", "auroc", "kl_base", "kl_aligned")}
                           for r in c.rows] for n, c in st.curves.items()}, "meta": st.meta}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", choices=("masking", "elasticity", "attribution"), required=True)
    ap.add_argument("--model", choices=("organism", "smollm2"), default="organism")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--n", type=int, default=64, help="pairs per class in the training / forward set")
    ap.add_argument("--n-pairs", type=int, default=32, help="elasticity: compliance / control pairs")
    ap.add_argument("--n-test", type=int, default=80)
    ap.add_argument("--q", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--layer", type=int, default=18, help="SmolLM2: the direction's layer (the adapter acts on layers 14-29, so resid_pre below 15 never changes; default: %(default)s)")
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--n-boot", type=int, default=200)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--html", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    res = {"masking": masking, "elasticity": elasticity, "attribution": attribution}[args.study](args)
    res["machine"] = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, " \
                     f"{args.threads} thread(s), load {os.getloadavg()[0]:.1f}"
    res["wall_s"] = round(time.time() - t0, 1)
    res["command"] = "python benchmarks/study_finetune.py " + " ".join(sys.argv[1:])
    text = json.dumps(res, indent=1, default=float)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
