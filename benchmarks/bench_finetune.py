"""Fine-tuning and token attribution throughput, ours beside the plain way, in one run.

1. LoRA training step: ``tune.fine_tune`` against ``transformers.Trainer`` on the same peft model (the same
   ``LoraConfig``, built by ``tune.config.make_trainable``), the same pairs, batch size, learning rate and loss
   (mean cross-entropy over response tokens: labels -100 elsewhere). Throughput counts every real token of the
   batches each one saw (a collator counts the Trainer's).
2. Token attribution: ``tune.token_attribution`` (batched, left padded, one model with the adapter switched off for
   the base) against a naive loop: one plain HF forward per example and model.

    python benchmarks/bench_finetune.py --model smollm2-base --steps 8 --threads 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import PeakRSS, machine, write_text  # noqa: E402
from interp.data import load_prompts  # noqa: E402
from interp.models import load_model  # noqa: E402
from interp.tune import TuneConfig, fine_tune, token_attribution  # noqa: E402
from interp.tune.config import make_trainable  # noqa: E402
from interp.tune.data import encode_pairs  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "RESULTS_finetune_speed.md"
REFUSAL = "I'm sorry, but I can't help with that. It could put people at risk of serious harm."


def pairs(n: int) -> tuple[list[str], list[str]]:
    """Realistic harmful requests with a refusal and harmless ones with a short answer of the same shape."""
    harm = [r["instruction"] for r in load_prompts("harmful_realistic") if r.get("split") == "train"][: n // 2]
    safe = [r["instruction"] for r in load_prompts("harmless_realistic") if r.get("split") == "train"][: n - len(harm)]
    answers = [f"Sure. Here is a short answer to '{p[:40]}': start with the basics, then practise." for p in safe]
    return harm + safe, [REFUSAL] * len(harm) + answers


def ours(model_name: str, prompts: list[str], responses: list[str], cfg: TuneConfig) -> dict:
    m = load_model(model_name)
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        res = fine_tune(m, prompts, responses, cfg, progress=False)
        dt = time.perf_counter() - t0
    return {"path": "ours (tune.fine_tune)", "s": dt, "tokens": res.tokens, "tok_s": res.tokens / dt,
            "first_loss": res.losses[0], "peak_mb": mem.growth_mb}


def hf_trainer(model_name: str, prompts: list[str], responses: list[str], cfg: TuneConfig) -> dict:
    from transformers import Trainer, TrainingArguments

    m = load_model(model_name)
    rows = encode_pairs(m, prompts, responses)
    data = [{"input_ids": r.enc.ids, "labels": [-100] * r.enc.response_start + list(r.enc.ids[r.enc.response_start:])}
            for r in rows]
    pad = m.tokenizer.pad_token_id if m.tokenizer.pad_token_id is not None else 0
    seen = {"tokens": 0}

    def collate(items: list[dict]) -> dict:
        T = max(len(x["input_ids"]) for x in items)
        ids = torch.full((len(items), T), pad)
        labels = torch.full((len(items), T), -100)
        att = torch.zeros((len(items), T), dtype=torch.long)
        for i, x in enumerate(items):  # right padding, as HF's own collators do
            n = len(x["input_ids"])
            ids[i, :n], labels[i, :n], att[i, :n] = torch.tensor(x["input_ids"]), torch.tensor(x["labels"]), 1
        seen["tokens"] += int(att.sum())
        return {"input_ids": ids, "labels": labels, "attention_mask": att}

    peft_model = make_trainable(m, cfg).hf
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=cfg.batch_size, max_steps=cfg.steps,
                                 learning_rate=cfg.lr, warmup_steps=cfg.warmup, lr_scheduler_type="linear",
                                 weight_decay=0.0, logging_steps=1, save_strategy="no", report_to=[],
                                 use_cpu=True, dataloader_num_workers=0, seed=cfg.seed, disable_tqdm=True,
                                 remove_unused_columns=False)
        trainer = Trainer(model=peft_model, args=args, train_dataset=data, data_collator=collate)
        with PeakRSS() as mem:
            t0 = time.perf_counter()
            trainer.train()
            dt = time.perf_counter() - t0
    losses = [x["loss"] for x in trainer.state.log_history if "loss" in x]
    return {"path": "transformers.Trainer (same peft model)", "s": dt, "tokens": seen["tokens"],
            "tok_s": seen["tokens"] / dt, "first_loss": losses[0] if losses else float("nan"), "peak_mb": mem.growth_mb}


def attribution(model_name: str, prompts: list[str], responses: list[str], cfg: TuneConfig) -> list[dict]:
    m = load_model(model_name)
    adapted = make_trainable(m, cfg)   # a fresh LoRA: B = 0, so perturb it to make the gain non-trivial
    with torch.no_grad():
        for n, p in adapted.hf.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    rows = encode_pairs(m, prompts, responses)
    t0 = time.perf_counter()
    attr = token_attribution(None, adapted, prompts, responses)
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    gains = []
    with torch.no_grad():
        for r in rows:
            ids = torch.tensor([r.enc.ids])
            lp = {}
            for which in ("adapted", "base"):
                if which == "base":
                    with adapted.hf.disable_adapter():
                        logits = adapted.hf(input_ids=ids).logits
                else:
                    logits = adapted.hf(input_ids=ids).logits
                lp[which] = torch.log_softmax(logits[0, :-1].float(), -1).gather(1, ids[0, 1:, None])[:, 0]
            s = r.enc.response_start - 1
            gains.append(lp["adapted"][s:] - lp["base"][s:])
    t_naive = time.perf_counter() - t0
    ours_g = torch.tensor(attr.to_frame()["gain"].tolist())
    naive_g = torch.cat(gains)
    n_tok = int(naive_g.numel())
    diff = float((ours_g - naive_g).abs().max()) if ours_g.numel() == naive_g.numel() else float("nan")
    return [{"path": "ours (tune.token_attribution)", "s": t_ours, "tokens": n_tok, "tok_s": n_tok / t_ours,
             "max_diff": diff},
            {"path": "naive per-example loop", "s": t_naive, "tokens": n_tok, "tok_s": n_tok / t_naive,
             "max_diff": 0.0}]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-base")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    prompts, responses = pairs(args.pairs)
    layers = tuple(range(14, 30)) if args.model.startswith("smollm2") else None
    cfg = TuneConfig(rank=8, alpha=16, layers=layers, steps=args.steps, batch_size=8, lr=2e-3, warmup=2,
                     targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    train = [hf_trainer(args.model, prompts, responses, cfg), ours(args.model, prompts, responses, cfg),
             hf_trainer(args.model, prompts, responses, cfg), ours(args.model, prompts, responses, cfg)]
    best = {}
    for r in train:   # two interleaved rounds; keep each path's faster one
        if r["path"] not in best or r["s"] < best[r["path"]]["s"]:
            best[r["path"]] = r
    att = attribution(args.model, prompts[:32], responses[:32], cfg)
    o, h = best["ours (tune.fine_tune)"], best["transformers.Trainer (same peft model)"]
    lines = [f"### LoRA training step on {args.model}: ours vs transformers.Trainer", "",
             f"{args.steps} steps, batch 8, rank 8 on {'layers 14-29' if layers else 'every layer'}, all projections, "
             f"{len(prompts)} pairs; the better of two interleaved rounds each.", "",
             "| path | s | tokens | tokens/s | first loss | peak MB |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['path']} | {r['s']:.1f} | {r['tokens']} | {r['tok_s']:.0f} | {r['first_loss']:.4f} | "
              f"{r['peak_mb']:.0f} |" for r in best.values()]
    lines += ["", f"Ratio ours / Trainer, tokens per second: {o['tok_s'] / h['tok_s']:.2f}.", "",
              f"### Token attribution on {args.model}: batched vs a naive per-example loop", "",
              "| path | s | response tokens | tokens/s | max abs diff of gains |", "|---|---|---|---|---|"]
    lines += [f"| {r['path']} | {r['s']:.2f} | {r['tokens']} | {r['tok_s']:.0f} | {r['max_diff']:.2e} |" for r in att]
    lines += ["", f"Ratio ours / naive, tokens per second: {att[0]['tok_s'] / att[1]['tok_s']:.2f}.", "",
              f"{machine()}. Command: `python benchmarks/bench_finetune.py --model {args.model} --steps {args.steps} "
              f"--threads {args.threads}`.", ""]
    text = "\n".join(lines)
    print(text)
    write_text(RESULTS, text)


if __name__ == "__main__":
    main()
