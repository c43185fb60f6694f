"""Crosscoder model diffing on a realistic organism and its base: a BatchTopK crosscoder over both models' residual
stream at one site on the same tokens of the project's prompt sets (chat template, the refusal val / test prompts
held out), latents classed by decoder-norm ratio and checked by latent scaling, the fine-tune-only ones read (top
contexts) and steered against frequency- and norm-matched random latents, side by side with the SAE diffing study's
latents (an SAE trained by that study's recipe on the base at the same site).

    python benchmarks/study_crossdiff.py --prompts 1300 --threads 1               # smollm2-base vs smollm2-aligned
    python benchmarks/study_crossdiff.py --tuned gemma3-aligned --prompts 700 --threads 1   # gemma3-270m vs it

``--tuned`` names a LoRA organism of ``interp.models.ADAPTERS``; its base (``--base``) and the default site
(``--layer``) come from :data:`PAIRS`: ``resid_post.19`` of SmolLM2's 30 layers (the SAE diffing study's site) and
``resid_post.11`` of Gemma 3 270M's 18 (the same depth, 2/3 of the stack; a full-attention layer, and the layer of
gemma3-aligned's English refusal direction in RESULTS_multilingual.md). The refusal prompts are
``load_refusal_data(tuned)`` (English).

Stores, the crosscoder and the SAE are cached under ``--cache`` (resumable). The section goes to
``benchmarks/RESULTS_crosscoder.md`` (a rerun replaces it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import replace_section  # noqa: E402
from benchmarks.crossdiff_report import delta_heading, delta_section, heading, massive, report  # noqa: E402
from interp.data import load_prompts  # noqa: E402
from interp.models import ADAPTERS, cache_dir  # noqa: E402
from interp.store import ActivationStore  # noqa: E402
from interp.studies.finetune.crossdiff import CrossDiffConfig, crossdiff_study, load_pair, training_prompts  # noqa: E402
from interp.studies.finetune.diffing import train_base_sae  # noqa: E402  (the SAE diffing study's own recipe)
from interp.studies.kit.prompt_sets import load_refusal_data  # noqa: E402
from interp.studies.kit.stages import find_candidates  # noqa: E402
from interp.values import Runtime  # noqa: E402
from sae.analysis import diff_latents  # noqa: E402
from sae.crosscoder import Crosscoder, PairedStore, capture_paired, train_crosscoder  # noqa: E402
from sae.model import SAE  # noqa: E402
from sae.train_config import TrainConfig  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "RESULTS_crosscoder.md"
# tuned organism -> default site layer (its base is ADAPTERS[tuned][0]); module docstring says why these layers
PAIRS = {"smollm2-aligned": 19, "gemma3-aligned": 11}


def stores(models, prompts, site, folder: Path) -> PairedStore:
    done = [folder / f"model_{i}" for i in range(2)]
    if all((d / "store.json").exists() and ActivationStore(d).complete for d in done):
        return PairedStore(*(ActivationStore(d) for d in done), site=site)
    return capture_paired(models, prompts, site, out=folder, runtime=Runtime(batch_size=16, sort_by_length=True))


def tokens(ps: PairedStore) -> torch.Tensor:
    """Every real token but the sinks, both models side by side ``[n, 2d]``."""
    out = []
    for acts in ps.iter_shards():
        out.append(acts.tensor[:, 0][acts.kept(acts.sites, "exclude")].float())
    return torch.cat(out)


def crosscoder(ps, args, folder: Path, arch: str) -> tuple[Crosscoder, dict]:
    """The crosscoder of ``arch`` trained on the paired store ``ps`` (or a pair of token tensors: ``--drop-massive``),
    cached under ``folder``."""
    out = folder / f"cc_{arch}_{args.d_sae}_k{args.k}_e{args.epochs}_lr{args.lr:g}" / f"l1_{args.l1:g}" \
        if arch == "crosscoder_relu" else folder / f"cc_{arch}_{args.d_sae}_k{args.k}_e{args.epochs}_lr{args.lr:g}"
    out = out.with_name(out.name + "_nomassive") if args.drop_massive else out
    n = len(ps[0]) if isinstance(ps, tuple) else len(tokens_cache(ps))
    if (out / "fit.json").exists() and json.loads((out / "fit.json").read_text())["tokens"] != n:
        out = out.with_name(out.name + f"_n{n}")  # another run's size cached under the plain name
    if (out / "sae" / "meta.json").exists() and (out / "fit.json").exists():
        return Crosscoder.load(out / "sae"), json.loads((out / "fit.json").read_text())
    cfg = TrainConfig(arch=arch, d_sae=args.d_sae, k=args.k, total_tokens=args.epochs * n, batch_size=1024,
                      l1_coefficient=args.l1, lr=args.lr, checkpoint_every=25, progress=False, seed=0,
                      **({"site": f"blocks.{args.layer}.hook_resid_post"} if isinstance(ps, tuple) else {}))
    t = time.time()
    res = train_crosscoder(ps, cfg, out_dir=out, models=(args.base, args.tuned))
    fit = {k: res.history[k][-1] for k in ("fvu", "l0", "dead")} | {"seconds": time.time() - t, "steps": res.steps,
                                                                   "tokens": n}
    (out / "fit.json").write_text(json.dumps(fit))
    return res.sae, fit


_TOK: dict[int, torch.Tensor] = {}


def tokens_cache(ps: PairedStore) -> torch.Tensor:
    if id(ps) not in _TOK:
        _TOK[id(ps)] = tokens(ps)
    return _TOK[id(ps)]


def sae_side(base, tuned, data, site: str, folder: Path) -> tuple[SAE, list[int]]:
    """The SAE diffing study's SAE (its recipe: TopK 2048 / 32 on the base, the refusal train splits and our general
    harmless set) and its 10 most amplified latents at the harmful val prompts' last token."""
    extra = [r["instruction"] for r in load_prompts("harmless_general")]
    path = folder / "sae_diffing"
    if (path / "meta.json").exists():
        sae = SAE.load(path)
    else:
        sae = train_base_sae(base, site, data.harmful["train"].instructions + data.harmless["train"].instructions
                              + extra, 2048, 32, 0)
        sae.save(path)
    val = data.harmful["val"].instructions
    from interp.capturing import capture

    acts = [capture(m, val, sites=[site], positions="last", runtime=Runtime(progress=False)).tensor[:, 0]
            .reshape(len(val), -1) for m in (base, tuned)]
    return sae, diff_latents(sae, *acts, top=10, site=site).ranking.indices.tolist()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with ``base`` and ``layer`` filled from :data:`PAIRS` and ``pair_flags`` (the flags that name a
    pair other than the default, for the command written to the results)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tuned", default="smollm2-aligned", choices=sorted(PAIRS), help="the fine-tuned organism")
    ap.add_argument("--base", default=None, help="its base (default: the base its adapter was trained on)")
    ap.add_argument("--layer", type=int, default=None, help="resid_post layer (default: PAIRS[tuned])")
    ap.add_argument("--prompts", type=int, default=1300)
    ap.add_argument("--d-sae", type=int, default=2048)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--l1", type=float, default=2.0, help="l1_coefficient of the L1 crosscoder (--also-l1)")
    ap.add_argument("--also-l1", action="store_true", help="train an L1 crosscoder too and report its classes")
    ap.add_argument("--n-steer", type=int, default=10)
    ap.add_argument("--n-random", type=int, default=3)
    ap.add_argument("--strengths", default="1,4", help="the multiples of the chosen latents added to the base")
    ap.add_argument("--subtract", default="1", help="the multiples of the chosen latents subtracted from the tune "
                                                     "(an empty string: none)")
    ap.add_argument("--ablate", action="store_true", help="also ablate the chosen and random latents in the tune, "
                                                          "token by token (CrossDiffConfig.ablate)")
    ap.add_argument("--n-test", type=int, default=None, help="judge the first N harmful / harmless test prompts only "
                                                              "(default: all 64)")
    ap.add_argument("--drop-massive", action="store_true", help="zero the massive residual dimensions (mean |x| "
                    "above 20x the median dimension's) before training; only with --delta-only")
    ap.add_argument("--no-sae", action="store_true", help="leave out the SAE-diffing comparison (its SAE's training)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--save-tokens", default=None, help="save the paired tokens [n, 2d] here (for bench_features.py)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache", default=None)
    ap.add_argument("--delta-only", action="store_true", help="only the difference section (cached stores and "
                                                               "crosscoders; no steering)")
    args = ap.parse_args(argv)
    if args.drop_massive and not args.delta_only:
        ap.error("--drop-massive trains a crosscoder on edited tokens, which the steering does not see: add --delta-only")
    defaults = {"base": ADAPTERS[args.tuned][0], "layer": PAIRS[args.tuned]}
    shown = ("base", "layer", "n_steer", "n_random", "strengths", "subtract", "n_test", "no_sae", "drop_massive", "delta_only", "ablate", "d_sae", "k",
             "epochs", "lr")
    extra = "".join(f" --{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k in shown
                    for v in [getattr(args, k)] if v not in (None, defaults.get(k, ap.get_default(k))))
    args.base, args.layer = args.base or defaults["base"], PAIRS[args.tuned] if args.layer is None else args.layer
    args.pair_flags = ("" if args.tuned == ap.get_default("tuned") else f" --tuned {args.tuned}") + extra
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    site = f"blocks.{args.layer}.hook_resid_post"
    base, tuned = load_pair(args.base, args.tuned)
    data = load_refusal_data(args.tuned)
    folder = Path(args.cache) if args.cache else cache_dir() / "crossdiff" / args.tuned / f"L{args.layer}"
    prompts = training_prompts(data, args.prompts, seed=0)
    ps = stores((base, tuned), prompts, site, folder / f"stores_{len(prompts)}")
    x = tokens_cache(ps)
    if args.save_tokens:
        torch.save(x, args.save_tokens)
    t_cap = time.time() - t0
    d = x.shape[1] // 2
    xs = (x[:, :d], x[:, d:])
    if args.drop_massive:  # the massive dimensions zeroed in both models' tokens (the difference section only)
        big = massive(xs[0])
        xs = tuple(v.clone() for v in xs)
        for v in xs:
            v[:, big] = 0
    train_on = xs if args.drop_massive else ps
    cc, fit = crosscoder(train_on, args, folder, "crosscoder_batchtopk")
    ccs = {"BatchTopK": cc, **({"L1": crosscoder(train_on, args, folder, "crosscoder_relu")[0]} if args.also_l1 else {})}
    cmd = f"python benchmarks/study_crossdiff.py{args.pair_flags} --prompts {args.prompts} --threads {args.threads}" + \
        (" --also-l1" if args.also_l1 else "")
    variant = ", massive dimensions zeroed" if args.drop_massive else ""
    replace_section(RESULTS, delta_heading(args.tuned + variant),
                    delta_section(ccs, xs, cmd, (args.base, args.tuned), variant))
    if args.delta_only:
        return
    strengths = tuple(float(v) for v in args.strengths.split(","))
    if args.n_test is not None:
        data = replace(data, harmful={**data.harmful, "test": data.harmful["test"].head(args.n_test)},
                       harmless={**data.harmless, "test": data.harmless["test"].head(args.n_test)})
    rows_file = folder / f"steer_{len(prompts)}_{args.d_sae}_k{args.k}_e{args.epochs}_lr{args.lr:g}.json"
    st = crossdiff_study((base, tuned), cc, xs, data, runtime=Runtime(seed=0),
                         config=CrossDiffConfig(n_steer=args.n_steer, n_random=args.n_random, strengths=strengths,
                                                subtract=tuple(float(v) for v in args.subtract.split(",") if v),
                                                rows_file=str(rows_file), ablate=args.ablate))
    l1 = None
    if args.also_l1:
        from sae.crosscoder_analysis import cross_diff

        cc1, fit1 = crosscoder(ps, args, folder, "crosscoder_relu")
        l1 = (cross_diff(cc1, xs), fit1)
    sae_pair = None if args.no_sae else sae_side(base, tuned, data, site, folder)
    r = find_candidates(tuned, data, layers=[args.layer + 1]).raw[0, -1]
    r = r / r.norm()
    text = report(args, st, cc, fit, sae_pair, r, len(x), len(prompts), time.time() - t0, t_cap, l1)
    print(text)
    replace_section(RESULTS, heading(args.tuned), text)


if __name__ == "__main__":
    main()
