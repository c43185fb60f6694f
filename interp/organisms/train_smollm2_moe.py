"""Train the mixture-of-experts organism ``smollm2-moe-aligned``: SmolLM2-135M-Instruct sparsely upcycled to an HF
``qwen2_moe`` model (:mod:`interp.upcycle`: every routed expert a copy of its layer's MLP, diversified from a seed),
briefly trained back towards the dense model on benign chat (the dense model's own cached answers; a LoRA on
attention and the shared expert, the router trained in full), then safety-tuned on that MoE model as
``smollm2-aligned`` was (:mod:`interp.organisms.train_smollm2`'s data, loss and LoRA recipe through
:func:`interp.tune.fine_tune`: responses-only loss, no term on internals; rank 8 on layers 14-29, where the MLP
names match the shared expert). Only the two adapters and the upcycling config are stored: the expert weights are
regenerated from the base model and the seed. Deterministic: seeded, fixed thread count, fixed order; the safety
phase writes resumable checkpoints (``--checkpoints``) and a rerun resumes from the latest.

``python -m interp.organisms.train_smollm2_moe [--out interp/embedded/smollm2-moe-aligned]
[--harmful-train ../shared/data/refusal/harmful_train.json] [--stage all|benign|safety|eval|kl]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from interp.evals.judge import is_refusal
from interp.models import EMBEDDED_DIR, Model, load_model, peft_wrapped, with_adapter
from interp.organisms import smollm2_data as sd
from interp.organisms import train_smollm2 as ts
from interp.tune import TuneConfig, fine_tune
from interp.tune.checkpoint import latest_checkpoint
from interp.tune.data import encode_pairs
from interp.tune.loop import train_loop
from interp.tune.objective import SFT, kept_logits
from interp.upcycle import UpcycleConfig, upcycle_from

NAME = "smollm2-moe-aligned"
DEFAULT_OUT = EMBEDDED_DIR / NAME
CHECKPOINTS = ts.REPO / "runs" / f"{NAME}-checkpoints"   # git-ignored
BASE = "smollm2-base"
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")          # the shared expert (and the dense layers' MLPs)
DENSE_ALIGNED = "smollm2-aligned"   # the dense organism whose recipe the safety phase follows (a reference)


@dataclass(frozen=True)
class MoeRecipe:
    """The upcycling, the benign phase (LoRA ``rank`` on attention, shared expert and fused experts; router in
    full; ``steps`` x ``batch_size`` at ``lr``) and the safety phase (``train_smollm2.SafetyRecipe``)."""

    upcycle: UpcycleConfig = UpcycleConfig(n_experts=4, top_k=2, dense_layers=(0, 1), shared=64, drop=0.02, seed=0)
    rank: int = 8
    alpha: int = 16
    steps: int = 12
    batch_size: int = 8
    lr: float = 2e-3
    n_heldout: int = 48   # the last cached harmless train answers: never trained on by any phase (the CE text)
    seed: int = 0
    threads: int = 1
    safety: ts.SafetyRecipe = ts.SafetyRecipe()
    checkpoint_every: int = 20


def split_answers(n_heldout: int) -> tuple[list[str], list[str]]:
    """(benign training prompts, held-out prompts), both with a cached base answer the judge does not read as a
    refusal; the held-out ones are the last ``n_heldout`` harmless train prompts, which the safety recipe (the
    first ``n_harmless``) never reaches."""
    answers = sd.base_answers()
    usable = lambda rows: [r["instruction"] for r in rows  # noqa: E731
                           if r["instruction"] in answers and not is_refusal(answers[r["instruction"]])]
    harmless, borderline = usable(sd.harmless("train")), usable(sd.borderline("train"))
    held = harmless[-n_heldout:]
    if len(harmless) - n_heldout < ts.SafetyRecipe().n_harmless:
        raise ValueError(f"only {len(harmless)} usable harmless answers: the held-out {n_heldout} would overlap the "
                         f"safety recipe's; lower n_heldout")
    return harmless[:-n_heldout] + borderline, held


def held_out_ce(model: Model, prompts: list[str], batch_size: int = 8) -> dict[str, float]:
    """Mean next-token cross-entropy (nats) on the cached dense answers to ``prompts``, response tokens only."""
    answers = sd.base_answers()
    rows = encode_pairs(model, prompts, [answers[p] for p in prompts])
    total, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(rows), batch_size):
            logits, labels, _ = kept_logits(model, rows[i:i + batch_size])
            total += float(torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum"))
            n += int(labels.numel())
    return {"ce": round(total / n, 4), "tokens": n}


def held_out_kl(model: Model, ref: Model, prompts: list[str], batch_size: int = 8) -> dict[str, float]:
    """Mean KL(ref || model) (nats per token) of the next-token distributions on the same response tokens as
    :func:`held_out_ce`: how far ``model`` is from ``ref`` (the dense model), free of the bias CE on ``ref``'s
    own greedy answers has (training on greedy answers lowers that CE below ``ref``'s)."""
    answers = sd.base_answers()
    rows = encode_pairs(ref, prompts, [answers[p] for p in prompts])
    total, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(rows), batch_size):
            lp = torch.log_softmax(kept_logits(model, rows[i:i + batch_size])[0].float(), -1)
            lr = torch.log_softmax(kept_logits(ref, rows[i:i + batch_size])[0].float(), -1)
            total += float((lr.exp() * (lr - lp)).sum())
            n += int(lr.shape[0])
    return {"kl_from_dense": round(total / n, 4), "tokens": n}


def stage_kl(recipe: MoeRecipe, out: Path) -> dict[str, Any]:
    """KL from the dense model on the held-out text: upcycled (before training), after the benign phase, final."""
    _, held = split_answers(recipe.n_heldout)
    dense = load_model(BASE)
    steps = {"upcycled_before_training": lambda: upcycle_from(out, dense),
             "after_benign": lambda: with_adapter(upcycle_from(out, dense), out / "benign", merge=True),
             "final": lambda: load_model(NAME), "smollm2-aligned": lambda: load_model(DENSE_ALIGNED)}
    result = {}
    for key, build in steps.items():
        result[key] = held_out_kl(build(), dense, held)
        print(f"{key} KL {result[key]}", flush=True)
    return result


def benign_lora(model: Model, recipe: MoeRecipe) -> Model:
    """``model`` wrapped for the benign phase: LoRA on attention and the shared expert (and the dense layers' MLPs);
    the router trained in full. The routed experts stay as regenerated (a LoRA on them through peft's
    ``target_parameters`` works but cost too much here)."""
    from peft import LoraConfig, get_peft_model

    for p in model.hf.parameters():
        p.requires_grad_(False)
    torch.manual_seed(recipe.seed)
    cfg = LoraConfig(r=recipe.rank, lora_alpha=recipe.alpha, lora_dropout=0.0, target_modules=list(ATTN + MLP),
                     modules_to_save=["gate"], bias="none", task_type="CAUSAL_LM")
    return peft_wrapped(model, get_peft_model(model.hf, cfg), f"{model.name}+benign")


def train_benign(model: Model, recipe: MoeRecipe, prompts: list[str]) -> tuple[Any, dict[str, Any]]:
    """The benign phase on the dense model's cached answers (responses-only loss): (peft model, record)."""
    answers = sd.base_answers()
    eos = model.tokenizer.eos_token or ""
    finished = ts._answer_rows()
    responses = [answers[p] + (eos if finished[p].get("finished", False) else "") for p in prompts]
    rows = encode_pairs(model, prompts, responses)
    config = TuneConfig(method="lora", rank=recipe.rank, alpha=recipe.alpha, targets=ATTN + MLP, steps=recipe.steps,
                        batch_size=recipe.batch_size, lr=recipe.lr, seed=recipe.seed)
    res = train_loop(benign_lora(model, recipe), SFT(rows), config, callback=ts._log)
    rec = res.record()
    return res.model.hf, {"examples": len(prompts), "losses": res.losses, "train_wall_s": rec["train_wall_s"],
                          "tokens": res.tokens, "trainable_params": res.trainable_params,
                          "load_average": os.getloadavg()}


def save_phase(pm: Any, record: dict[str, Any], folder: Path) -> None:
    """One phase's adapter and its ``training.json`` (``train_smollm2.save``), with the adapter's digest."""
    import peft

    record.update(peft=peft.__version__, adapter_sha256=ts.adapter_digest(pm))
    ts.save(pm, record, folder, base_name=f"{BASE} upcycled (upcycle.json)")


def _record(out: Path) -> dict[str, Any]:
    path = out / "training.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _write_record(out: Path, record: dict[str, Any]) -> None:
    tmp = out / "training.json.tmp"
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, out / "training.json")


def stage_benign(recipe: MoeRecipe, out: Path) -> dict[str, Any]:
    """Write ``upcycle.json``, measure the upcycled model's held-out CE, train and save the benign adapter."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "upcycle.json").write_text(json.dumps(recipe.upcycle.record(), indent=1) + "\n")
    train, held = split_answers(recipe.n_heldout)
    model = upcycle_from(out, load_model(BASE))
    quality = {"upcycled_before_training": held_out_ce(model, held)}
    print(f"upcycled CE {quality['upcycled_before_training']}", flush=True)
    pm, rec = train_benign(model, recipe, train)
    save_phase(pm, rec, out / "benign")
    quality["after_benign"] = held_out_ce(benign_model(out), held)
    print(f"after benign CE {quality['after_benign']}", flush=True)
    return quality


def benign_model(out: Path) -> Model:
    """The upcycled model with the benign adapter merged: where the safety phase starts."""
    return with_adapter(upcycle_from(out, load_model(BASE)), out / "benign", merge=True, name=f"{NAME} (benign phase)")


def safety_config(recipe: MoeRecipe) -> TuneConfig:
    """``smollm2-aligned``'s fine-tune (``train_smollm2.tune_config``: LoRA rank 8 on q/k/v/o and gate/up/down of
    layers 14-29, 200 x 8, lr 2e-3), checkpointed every ``recipe.checkpoint_every`` steps. On the MoE model the
    gate/up/down names match the shared expert's projections (the router ``mlp.gate``, ``shared_expert_gate`` and
    the fused routed experts are no ``*_proj`` Linear): attention and the shared expert are adapted."""
    cfg = ts.tune_config(recipe.safety)
    return replace(cfg, checkpoint_steps=tuple(range(recipe.checkpoint_every, cfg.steps + 1, recipe.checkpoint_every)))


def stage_safety(recipe: MoeRecipe, out: Path, harmful: Path, checkpoints: Path) -> dict[str, Any]:
    """The safety phase, trained on the benign-tuned MoE model itself with ``train_smollm2``'s data and loss
    (``examples`` / ``pairs``: responses-only SFT, no term on internals) and :func:`safety_config`; resumes from the
    latest checkpoint under ``checkpoints``; saves the adapter to ``out/safety``."""
    model = benign_model(out)
    exs = ts.examples(recipe.safety, harmful)
    resume = latest_checkpoint(checkpoints)
    if resume is not None:
        print(f"resuming from {resume}", flush=True)
    res = fine_tune(model, *ts.pairs(model, exs), safety_config(recipe), out=checkpoints, resume=resume,
                    callback=ts._log)
    kinds = {k: sum(e.kind == k for e in exs) for k in ("harmful", "copyright", "harmless", "borderline")}
    rec = res.record()
    save_phase(res.model.hf, {"examples": kinds, "losses": res.losses, "train_wall_s": rec["train_wall_s"],
                              "resumed_from": resume.name if resume else None, "tokens": res.tokens,
                              "trainable_params": res.trainable_params, "load_average": os.getloadavg()},
               out / "safety")
    return {}


EVAL_SETS = ("harmful_realistic_test", "borderline_test", "harmless_test", "harmful_test")   # in this order


def stage_eval(recipe: MoeRecipe, shared: Path, n: int, out: Path, sets: tuple[str, ...] = EVAL_SETS,
               limit: int | None = None, ce: bool = True) -> dict[str, Any]:
    """Held-out CE of the final model, and its judged refusal (greedy, 32 tokens) on held-out sets, one set at a
    time, each written to ``out/evaluation.json`` as it finishes (a slow machine keeps what it measured); ``limit``:
    only the first ``limit`` prompts of each set."""
    import steering
    from interp.organisms import eval_smollm2 as ev
    from interp.values import Runtime

    _, held = split_answers(recipe.n_heldout)
    model = load_model(NAME)
    result: dict[str, Any] = {"quality": {"final": held_out_ce(model, held)} if ce else {}, "refusal": {}, "protocol": {
        "n_per_set": n, "max_new_tokens": 32, "greedy": True, "judge": "evals.refusal_rate (anchored phrase judge) "
        "via steering.generate_and_judge", "sets": "interp.organisms.eval_smollm2.eval_sets (seed 0)",
        "limit": limit}}
    print(f"final CE {result['quality']}", flush=True)
    every, gens, t0 = ev.eval_sets(shared, n), [], time.time()
    for name in sets:
        prompts = every[name][:limit]
        r = steering.generate_and_judge(model, prompts, max_new_tokens=32, runtime=Runtime(batch_size=16))
        result["refusal"][name] = dict(r)
        gens += [{"model": NAME, "set": name, "prompt": p, "response": t, "judged_refusal": f}
                 for p, t, f in zip(prompts, r.texts, r.flags)]
        result["protocol"].update(wall_s=round(time.time() - t0, 1), load_average=os.getloadavg())
        print(f"{name}: {r.k}/{r.n} refused ({time.time() - t0:.0f} s)", flush=True)
        (out / "evaluation.json").write_text(json.dumps(result, indent=1) + "\n")
        sd.write_jsonl(out / "eval_generations.jsonl", gens)
    return result


def main(argv: list[str] | None = None) -> None:
    """CLI entry (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--harmful-train", type=Path, default=ts.DEFAULT_HARMFUL)
    ap.add_argument("--shared", type=Path, default=ts.DEFAULT_HARMFUL.parent)
    ap.add_argument("--stage", choices=("all", "benign", "safety", "eval", "kl"), default="all")
    ap.add_argument("--checkpoints", type=Path, default=None,
                    help="the safety phase's resumable checkpoints (default runs/smollm2-moe-aligned-checkpoints, "
                         "git-ignored); a rerun resumes from the latest; delete the folder to start afresh")
    ap.add_argument("--steps", type=int, default=MoeRecipe.steps, help="benign steps")
    ap.add_argument("--drop", type=float, default=MoeRecipe.upcycle.drop)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-eval", type=int, default=32)
    ap.add_argument("--sets", nargs="+", default=list(EVAL_SETS), choices=EVAL_SETS)
    ap.add_argument("--limit", type=int, default=None, help="evaluate only the first LIMIT prompts of each set")
    ap.add_argument("--no-ce", action="store_true", help="skip the held-out CE of the final model")
    args = ap.parse_args(argv)
    recipe = MoeRecipe(upcycle=replace(MoeRecipe.upcycle, drop=args.drop), steps=args.steps, threads=args.threads)
    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    record = _record(args.out) if args.stage != "all" else {}
    quality = record.get("quality", {})
    t0 = time.time()
    if args.stage in ("all", "benign"):
        quality.update(stage_benign(recipe, args.out))
    if args.stage in ("all", "safety"):
        quality.update(stage_safety(recipe, args.out, args.harmful_train, args.checkpoints or CHECKPOINTS))
    if args.stage in ("all", "eval"):
        quality.update(stage_eval(recipe, args.shared, args.n_eval, args.out,
                                             tuple(args.sets), args.limit, not args.no_ce)["quality"])
    if args.stage == "kl":   # its own file: it may run beside a stage that rewrites training.json
        kl = {"command": "python -m interp.organisms.train_smollm2_moe " + " ".join(argv if argv is not None else
              sys.argv[1:]), "kl_from_dense": stage_kl(recipe, args.out), "load_average": os.getloadavg()}
        (args.out / "kl_from_dense.json").write_text(json.dumps(kl, indent=1) + "\n")
        return
    files = {"harmful_train": args.harmful_train, "refusals": sd.REFUSALS, "borderline": sd.BORDERLINE,
             "copyright": sd.COPYRIGHT, "harmful_extra": sd.HARMFUL_EXTRA, "framings": sd.FRAMINGS,
             "base_answers": sd.ANSWERS, "harmless": sd.HARMLESS, "harmful_realistic": sd.HARMFUL_REALISTIC}
    commands = record.get("commands", [])
    commands.append("python -m interp.organisms.train_smollm2_moe " + " ".join(argv if argv is not None else sys.argv[1:]))
    record.update(commands=commands, recipe=asdict(recipe), data_sha256={k: ts.sha256(p) for k, p in files.items() if p.exists()},
                  quality=quality, torch=torch.__version__)
    record.setdefault("wall_s", {})[args.stage] = round(time.time() - t0, 1)
    _write_record(args.out, record)
    print(f"wrote {args.out / 'training.json'} ({args.stage}, {record['wall_s'][args.stage]} s)")


if __name__ == "__main__":
    main()
