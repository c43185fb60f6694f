"""``interp sae train``: train a sparse autoencoder on one site's token activations, save and evaluate it.

The SAE is saved twice, in our format (``sae/``, for ``sae.SAE.load``) and in sae-lens's (``saelens/``), and
judged by the numbers that matter: FVU and L0 on the tokens, and how much of the model's next-token loss
survives splicing it in (CE recovered against zero- and mean-ablation of the site).
"""

from __future__ import annotations

import argparse
from typing import Any

from interp.cli.jobs import JobFolder, add_out_args, load, option, prompts_of, run_job
from interp.values import Prompts, Runtime

# the built-in kinds of sae.kinds (a kind registered in your own code trains through sae.train, not this flag)
ARCHS = ("topk", "batchtopk", "relu", "jumprelu", "jumprelu_target_l0", "gated", "matryoshka_batchtopk")


def add_sae_parser(sub: Any, model_args: Any) -> None:
    p = sub.add_parser("sae", help="sparse autoencoders: `interp sae train`")
    ssub = p.add_subparsers(dest="sae_command", required=True)
    t = ssub.add_parser("train", help="train an SAE on one site's activations, save it (ours and sae-lens) "
                                      "and evaluate FVU, L0 and CE loss recovered")
    model_args(t)
    t.add_argument("--prompts", required=True, help="CSV/JSON/JSONL/text file of prompts whose tokens train the SAE")
    option(t, "--column", None, "column/key of the prompt; none: the first of instruction, prompt, goal, text, ...")
    option(t, "--eval-prompts", None, "file of held-out prompts for evaluation; none: the training prompts "
                                      "(in-sample, said so on the page)")
    option(t, "--eval-column", None, "column/key of --eval-prompts; none: found automatically")
    option(t, "--site", "blocks.2.hook_resid_post", "the site whose activations the SAE reads and reconstructs")
    option(t, "--arch", "topk", "SAE architecture", choices=ARCHS)
    option(t, "--d-sae", None, "number of latents; none: --expansion x d_model", type=int)
    option(t, "--expansion", 8, "latents per model dimension when --d-sae is not given", type=int)
    option(t, "--widths", None, "matryoshka_batchtopk: the nested prefix widths, comma-separated (e.g. 512,2048); "
                                "the full width is the last level")
    option(t, "--k", 16, "active latents per token (topk/batchtopk; the target L0 of jumprelu)", type=int)
    option(t, "--steps", 300, "optimiser steps", type=int)
    option(t, "--batch-size", 256, "tokens per step", type=int)
    option(t, "--lr", None, "learning rate; none: 2e-4 / sqrt(d_sae / 2^14) (Gao et al.)", type=float)
    option(t, "--seed", 0, "seed of initialisation and token order", type=int)
    t.add_argument("--raw", action="store_true", help="do not wrap prompts in the chat template (default: wrap)")
    add_out_args(t, "runs/sae")
    t.set_defaults(func=cmd_sae_train)


def cmd_sae_train(args: argparse.Namespace) -> int:
    """Launched by torchrun, every rank captures its share of the prompts and trains data-parallel; rank 0 saves,
    evaluates and writes the page."""
    return run_job(args, "sae train", ("sae", "saelens", "history.json"), lambda folder: sae_train_job(args, folder),
                   others=lambda: _train(args))


def train_config(args: argparse.Namespace, site: str) -> Any:
    """The ``sae.TrainConfig`` the flags describe (``--steps`` x ``--batch-size`` tokens)."""
    import sae

    for flag, v in (("--steps", args.steps), ("--batch-size", args.batch_size), ("--k", args.k)):
        if v < 1:
            raise ValueError(f"{flag} must be at least 1, got {v}")
    widths = getattr(args, "widths", None)
    if widths is not None and args.arch != "matryoshka_batchtopk":
        raise ValueError(f"--widths sets matryoshka_batchtopk's prefix widths; --arch is {args.arch!r}")
    options = {"widths": [int(w) for w in str(widths).split(",") if w.strip()]} if widths is not None else {}
    return sae.TrainConfig(arch=args.arch, d_sae=args.d_sae, expansion=args.expansion, k=args.k, options=options,
                           total_tokens=args.steps * args.batch_size, batch_size=args.batch_size, lr=args.lr,
                           seed=args.seed, site=site, progress=True)


def sae_train_job(args: argparse.Namespace, folder: JobFolder) -> dict[str, Any]:
    """Capture every token at the site, train, save both formats, evaluate, write figures and page."""
    import interp
    import sae
    from sae.saelens_io import save_saelens

    model, site, prompts, eval_prompts, acts, res = _train(args)
    res.sae.save(folder.path("sae"))
    save_saelens(res.sae, folder.path("saelens"), model_name=model.name, hook_name=site)
    folder.write_json("history.json", res.history)
    eval_acts = acts if args.eval_prompts is None else interp.capture(model,
                                                                      Prompts(eval_prompts, chat=not args.raw),
                                                                      sites=site,
                                                                      positions="all")
    metrics = sae.evaluate(res.sae, eval_acts, site=site)
    ce = sae.quality.ce_loss_recovered(model, res.sae, Prompts(eval_prompts, chat=not args.raw), site=site)
    result = sae_result(res, metrics, ce, site, held_out=args.eval_prompts is not None)
    folder.write_json("result.json", result)
    figures = _figures(res, metrics)
    facts = [("model", model.name), ("site", site), ("architecture", f"{args.arch}, d_sae {res.sae.d_sae}, k {args.k}"),
             ("trained on", f"{res.tokens} tokens in {res.steps} steps ({len(prompts)} prompts)"),
             ("evaluated on", f"{metrics.n_tokens} tokens, " + ("held-out prompts" if args.eval_prompts else
                                                                 "the training prompts (in-sample)")),
             ("FVU", metrics.fvu), ("L0", metrics.l0), ("dead fraction", metrics.dead_fraction),
             ("CE clean / SAE / zero-ablated (nats)", f"{ce.clean:.4f} / {ce.sae:.4f} / {ce.zero_ablated:.4f}"),
             ("CE loss recovered (vs zero / mean ablation)", f"{ce.recovered_zero:.4f} / {ce.recovered_mean:.4f}"),
             ("saved", f"{folder.path('sae')} (sae.SAE.load) and {folder.path('saelens')} (sae-lens)")]
    folder.write_report(f"interp sae train: {model.name} {site}", facts, figures)
    return {"FVU": metrics.fvu, "L0": metrics.l0, "CE recovered (zero)": ce.recovered_zero,
            "dead fraction": metrics.dead_fraction, "saved": str(folder.path("sae"))}


def _train(args: argparse.Namespace) -> tuple[Any, str, list[str], list[str], Any, Any]:
    """Capture every token at the site and train: ``(model, site, prompts, eval prompts, activations,
    TrainResult)``. Data parallel, each rank captures its share of the batches (all ranks get all tokens) and the
    ranks train as one; every rank reads both prompt files first, so a bad file stops them all alike."""
    import interp
    import sae
    from interp import distributed

    prompts = prompts_of(args.prompts, args.column, "--prompts")
    eval_prompts = prompts_of(args.eval_prompts, args.eval_column, "--eval-prompts") if args.eval_prompts else prompts
    model = load(args)
    site = _one_site(model, args.site)
    cfg = train_config(args, site)
    acts = interp.capture(model, Prompts(prompts, chat=not args.raw), sites=site, positions="all",
                          runtime=Runtime(distributed=distributed.active()))
    return model, site, prompts, eval_prompts, acts, sae.train_sae(acts, cfg)


def _one_site(model: Any, name: str) -> str:
    """The canonical name of exactly one site (a kind alone would mean every layer)."""
    from interp.sites import expand_sites

    sites = expand_sites(name, model.n_layers)
    if len(sites) != 1:
        raise ValueError(f"--site {name!r} names {len(sites)} sites; give one, e.g. blocks.{model.n_layers // 2}."
                         f"hook_resid_post")
    return sites[0].name


def sae_result(res: Any, metrics: Any, ce: Any, site: str, held_out: bool) -> dict[str, Any]:
    """``result.json``: training facts, reconstruction/sparsity metrics and CE loss recovered."""
    return {"site": site, "d_sae": res.sae.d_sae, "steps": res.steps, "tokens": res.tokens,
            "input_scale": res.input_scale, "train_dead_fraction": res.dead_fraction, "held_out": held_out,
            "metrics": {"fvu": metrics.fvu, "l0": metrics.l0, "mse": metrics.mse,
                        "dead_fraction": metrics.dead_fraction, "dense_fraction": metrics.dense_fraction,
                        "n_tokens": metrics.n_tokens},
            "ce_loss": {"clean": ce.clean, "sae": ce.sae, "zero_ablated": ce.zero_ablated,
                        "mean_ablated": ce.mean_ablated, "recovered_zero": ce.recovered_zero,
                        "recovered_mean": ce.recovered_mean, "n_predictions": ce.n_predictions}}


def _figures(res: Any, metrics: Any) -> dict[str, Any]:
    """Training curves (loss, FVU, L0, dead fraction) and the evaluation metrics (firing frequencies, FVU, dead
    and dense fractions, L0): the results' own ``.plot()``."""
    return {"training": res.plot(title="SAE training: loss, FVU, L0 and dead fraction"),
            "frequency": metrics.plot(title="SAE metrics on the evaluation tokens")}


__all__ = ["add_sae_parser", "cmd_sae_train", "sae_result", "sae_train_job", "train_config"]
