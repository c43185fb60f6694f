"""Feature-dictionary training speed against the anchors, one section per comparison (each prints its ratio).

    python benchmarks/bench_features.py --sections crosscoder --threads 1

``crosscoder``: our crosscoder training (``sae.crosscoder``, BatchTopK, through the SAE trainer's ``train_one``) vs
PyPI ``dictionary-learning``'s trainer in its own environment (``scripts/dictlearn_venv.sh``; it pins nnsight < 0.4).
PyPI holds only dictionary-learning 0.1.0, which has no crosscoder trainer (the ``CrossCoder`` classes live in later,
unreleased versions on GitHub and in forks); its ``BatchTopKTrainer`` on the two models' activations side by side
(width ``2 d``) is the same computation as an acausal BatchTopK crosscoder but for the per-model norm weighting of the
selection, so it is the anchor here, said as such in the results. Same batches (saved to a file), same d_sae / k,
rounds interleaved (ours, theirs, ours, ...), each side's first step untimed; tokens/s are medians over rounds.

Sections write to ``benchmarks/RESULTS_crosscoder.md`` under their own headings (a rerun replaces them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import machine, replace_section  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "RESULTS_crosscoder.md"
DICTLEARN_PY = ROOT / ".dictlearn-venv" / "bin" / "python"


def _batches(args) -> tuple[torch.Tensor, str]:
    """``[steps + 1, batch, 2 d]``: the study's cached paired tokens if given (``--tokens``), else seeded sparse data
    with SmolLM2's width."""
    n = (args.rounds * args.steps + 1) * args.batch
    if args.tokens:
        x = torch.load(args.tokens)
        if len(x) < n:
            x = x.repeat((n + len(x) - 1) // len(x), 1)
        g = torch.Generator().manual_seed(0)
        x = x[torch.randperm(len(x), generator=g)[:n]]
        what = f"the crosscoder study's paired SmolLM2 tokens ({Path(args.tokens).name}, saved by " \
               f"`study_crossdiff.py --save-tokens`)"
    else:
        g = torch.Generator().manual_seed(0)
        basis = torch.randn(4 * args.d, 2 * args.d, generator=g)
        coef = torch.rand(n, 4 * args.d, generator=g) * (torch.rand(n, 4 * args.d, generator=g) < 0.01)
        x = coef @ basis
        what = f"seeded sparse synthetic data (2 x {args.d} wide; 576 is SmolLM2's width)"
    return x.reshape(-1, args.batch, x.shape[-1]).contiguous(), what


def _ours(batches: torch.Tensor, args):
    from sae.crosscoder import Crosscoder
    from sae.train_config import TrainConfig
    from sae.trainer import Trainer

    n = batches.shape[0] * batches.shape[1]
    cfg = TrainConfig(arch="crosscoder_batchtopk", d_sae=args.d_sae, k=args.k, total_tokens=n,
                      batch_size=args.batch, progress=False, warmup_steps=10, seed=0)
    cc = Crosscoder.build(batches.shape[-1] // 2, args.d_sae, k=args.k)
    tr = Trainer(batches.reshape(n, -1), cfg, sae=cc, fresh=True)
    tr.prepare()
    tr.train_one(batches[0])

    def run(start: int, steps: int) -> float:
        t = time.perf_counter()
        for i in range(start, start + steps):
            tr.train_one(batches[i])
        return time.perf_counter() - t

    return run


def crosscoder_section(args) -> str:
    heading = "### Crosscoder training speed vs dictionary_learning"
    if not DICTLEARN_PY.exists():
        rc = subprocess.run(["bash", str(ROOT / "scripts" / "dictlearn_venv.sh")]).returncode
        if rc != 0:
            return (f"{heading}\n\nNot run: scripts/dictlearn_venv.sh failed (exit {rc}), so PyPI dictionary-learning "
                    f"could not be installed in its own environment.\n")
    batches, what = _batches(args)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "batches.pt"
        torch.save(batches, path)
        theirs = subprocess.Popen([str(DICTLEARN_PY), str(ROOT / "scripts" / "dictlearn_bench.py"), str(path),
                                   str(args.d_sae), str(args.k), str(args.threads)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        ours = _ours(batches, args)
        assert theirs.stdout.readline().strip() == "ready"
        t_ours, t_theirs = [], []
        for r in range(args.rounds):
            start = 1 + r * args.steps
            t_ours.append(ours(start, args.steps))
            theirs.stdin.write(f"{start} {args.steps}\n")
            theirs.stdin.flush()
            t_theirs.append(float(theirs.stdout.readline()))
        theirs.stdin.close()
        theirs.wait()
    tok = args.steps * args.batch
    ours_tps, theirs_tps = tok / statistics.median(t_ours), tok / statistics.median(t_theirs)
    text = "\n".join([
        heading, "",
        f"`python benchmarks/bench_features.py --sections crosscoder --threads {args.threads}"
        f"{' --tokens ' + Path(args.tokens).name if args.tokens else ''}` ({machine()}; the machine shared with other jobs, so "
        f"the ratio is the figure, not the absolute rates). Width 2 x {batches.shape[-1] // 2}, d_sae {args.d_sae}, "
        f"k {args.k}, batch {args.batch} tokens, {what}; {args.rounds} interleaved rounds of {args.steps} steps per "
        f"side, the same batches in the same order.", "",
        "PyPI `dictionary-learning` is 0.1.0 only and has no crosscoder trainer; the anchor is its "
        "`BatchTopKTrainer` on the two models' activations side by side (the same encoder / decoder shapes and "
        "BatchTopK selection as our crosscoder, without the per-model norm weighting), in `.dictlearn-venv` "
        "(`scripts/dictlearn_venv.sh`).", "",
        "| trainer | tokens/s (median) | rounds (s) |", "|---|---|---|",
        f"| ours: `sae.crosscoder` BatchTopK via the SAE trainer | {ours_tps:,.0f} | "
        f"{', '.join(f'{t:.2f}' for t in t_ours)} |",
        f"| dictionary_learning 0.1.0 BatchTopKTrainer | {theirs_tps:,.0f} | "
        f"{', '.join(f'{t:.2f}' for t in t_theirs)} |", "",
        f"Ratio ours / theirs: **{ours_tps / theirs_tps:.2f}x** tokens/s.", ""])
    print(f"crosscoder: ours {ours_tps:.0f} tok/s, dictionary_learning {theirs_tps:.0f} tok/s, ratio "
          f"{ours_tps / theirs_tps:.2f}")
    return text


RESULTS_FEATURES = Path(__file__).resolve().parent / "RESULTS_features.md"


def _matryoshka_batches(args) -> torch.Tensor:
    """``[rounds * steps + 1, batch, d]`` seeded sparse synthetic data of SmolLM2's width (576 by default)."""
    n = (args.rounds * args.steps + 1) * args.batch
    g = torch.Generator().manual_seed(0)
    basis = torch.randn(4 * args.d, args.d, generator=g)
    coef = torch.rand(n, 4 * args.d, generator=g) * (torch.rand(n, 4 * args.d, generator=g) < 0.01)
    return (coef @ basis).reshape(-1, args.batch, args.d).contiguous()


def _matryoshka_steps(batches: torch.Tensor, widths: list[int], args) -> dict:
    """``{name: step(batch)}``: our trainer's ``train_one`` and sae-lens's ``SAETrainer.step`` on its
    ``MatryoshkaBatchTopKTrainingSAE``, both prepared on the first batch (untimed)."""
    from sae_lens.config import SAETrainerConfig
    from sae_lens.saes.matryoshka_batchtopk_sae import (
        MatryoshkaBatchTopKTrainingSAE,
        MatryoshkaBatchTopKTrainingSAEConfig,
    )
    from sae_lens.training.sae_trainer import SAETrainer

    from sae.train_config import TrainConfig
    from sae.trainer import Trainer

    n, lr = batches.shape[0] * batches.shape[1], 1e-4
    cfg = TrainConfig(arch="matryoshka_batchtopk", options={"widths": list(widths)}, d_sae=args.d_sae, k=args.k,
                      total_tokens=10 ** 9, batch_size=args.batch, lr=lr, warmup_steps=0, decay_frac=0.0,
                      progress=False, log_every=10 ** 9, seed=0)
    ours = Trainer(batches.reshape(n, -1), cfg)
    ours.prepare()
    sl = MatryoshkaBatchTopKTrainingSAE(MatryoshkaBatchTopKTrainingSAEConfig(
        d_in=batches.shape[-1], d_sae=args.d_sae, k=args.k, matryoshka_widths=list(widths), device="cpu"))
    tr = SAETrainer(SAETrainerConfig(total_training_samples=10 ** 9, train_batch_size_samples=args.batch, lr=lr,
                                     lr_end=lr, device="cpu", dead_feature_window=1000), sl, data_provider=iter(()))

    def theirs(b: torch.Tensor) -> None:
        tr.step(b)
        tr.n_training_steps += 1

    return {"ours: `sae` matryoshka_batchtopk via the SAE trainer": ours.train_one,
            "sae-lens MatryoshkaBatchTopKTrainingSAE + SAETrainer": theirs}


def matryoshka_section(args) -> str:
    """Our Matryoshka BatchTopK training step vs sae-lens's, same batches, rounds interleaved, first step untimed."""
    import sae_lens

    heading = "### Matryoshka BatchTopK training speed vs sae-lens"
    load = os.getloadavg()[0]
    batches = _matryoshka_batches(args)
    widths = [args.d_sae // 16, args.d_sae // 4, args.d_sae]
    steps = _matryoshka_steps(batches, widths, args)
    for step in steps.values():
        step(batches[0])                                     # first step untimed (allocation, lazy init)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(args.rounds):
        for name, step in steps.items():                     # interleaved: ours, theirs, ours, ...
            t = time.perf_counter()
            for i in range(1 + r * args.steps, 1 + (r + 1) * args.steps):
                step(batches[i])
            times[name].append(time.perf_counter() - t)
    tok = args.steps * args.batch
    tps = {name: tok / statistics.median(ts) for name, ts in times.items()}
    (a, ta), (b, tb) = tps.items()
    rows = [f"| {name} | {tps[name]:,.0f} | {', '.join(f'{t:.2f}' for t in ts)} |" for name, ts in times.items()]
    print(f"matryoshka: ours {ta:.0f} tok/s, sae-lens {tb:.0f} tok/s, ratio {ta / tb:.2f}")
    return "\n".join([
        heading, "",
        f"`nice -n 5 python benchmarks/bench_features.py --sections matryoshka --threads {args.threads} --d-sae "
        f"{args.d_sae} --k {args.k} --batch {args.batch} --steps {args.steps} --rounds {args.rounds}` ({machine()}; "
        f"sae-lens {sae_lens.__version__}). The machine was shared with other jobs (1-minute load average {load:.1f} at "
        f"the start) while this ran, so the ratio is the figure, not the absolute rates.", "",
        f"Width {args.d}, d_sae {args.d_sae}, k {args.k} (BatchTopK), nested widths {widths}, batch {args.batch} "
        f"tokens of seeded sparse synthetic data; {args.rounds} interleaved rounds of {args.steps} steps per side on "
        f"the same batches in the same order, each side's first step untimed; tokens/s are medians over rounds. Both "
        f"steps are a full training step (forward, the summed nested MSE + AuxK loss, backward, Adam, decoder "
        f"normalisation as each does it).", "",
        "| trainer | tokens/s (median) | rounds (s) |", "|---|---|---|", *rows, "",
        f"Ratio ours / sae-lens: **{ta / tb:.2f}x** tokens/s.", ""])


matryoshka_section.results = RESULTS_FEATURES  # type: ignore[attr-defined]


def explain_section(args) -> str:
    """Latents explained and scored per minute by ``sae.explain`` with a local 135M chat model (explainer and scorer:
    SmolLM2-135M-Instruct through ``steering.generate``) on a small TopK SAE of ``smollm2-aligned``."""
    import interp
    import sae
    import steering
    from interp.data import load_prompts
    from sae.explain import ExplainConfig, LocalChatClient, explain_latents

    heading = "### Scoring throughput with a local model (sae.explain)"
    load = os.getloadavg()[0]
    model, chat = interp.load_model("smollm2-aligned"), interp.load_model("smollm2-base")
    site = "blocks.9.hook_resid_post"
    prompts = [r["instruction"] for r in load_prompts("harmless_realistic")][:40]
    acts = interp.capture(model, prompts, sites=[site], positions="all", runtime=interp.Runtime(progress=False))
    s = sae.train_sae(acts, arch="topk", d_sae=256, k=16, total_tokens=10_000, batch_size=256, site=site,
                      progress=False).sae
    freq = sae.evaluate(s, acts.flat_tokens(site)).frequency
    latents = ((freq > 0.01) & (freq < 0.2)).nonzero().flatten().tolist()[:args.n_explain]
    cfg = ExplainConfig(n_explain=8, n_explain_random=2, n_test=3, n_test_random=3, n_shown=1, window=(8, 2),
                        few_shot=False)
    t = time.perf_counter()
    res = explain_latents(model, s, latents, prompts, LocalChatClient(chat, steering.generate, max_new_tokens=32),
                          scorer=LocalChatClient(chat, steering.generate, max_new_tokens=6), cfg=cfg)
    sec = time.perf_counter() - t
    n_prompts = sum(len(v.labels) for k in ("detection", "fuzzing") for c in ("explanation", "shuffled")
                    for v in res.verdicts(k, c))
    print(f"explain: {len(latents)} latents in {sec:.0f} s = {60 * len(latents) / sec:.2f} latents/min")
    return "\n".join([
        heading, "",
        f"`nice -n 5 python benchmarks/bench_features.py --sections explain --threads {args.threads} --n-explain "
        f"{args.n_explain}` ({machine()}; 1-minute load average {load:.1f} at the start: the machine was shared with "
        f"other jobs, so this is a loaded-machine figure).", "",
        f"Model under study `smollm2-aligned`, TopK SAE d_sae 256, k 16 on `{site}` (10k tokens of 40 harmless "
        f"requests); explainer and scorer SmolLM2-135M-Instruct, greedy, 32 / 6 new tokens; per latent 8 top + 2 "
        f"non-activating contexts to the explainer, 3 + 3 held-out contexts to each of detection and fuzzing, each "
        f"also with a shuffled explanation ({n_prompts} scorer prompts in all).", "",
        f"**{len(latents)} latents explained and scored in {sec:.0f} s: {60 * len(latents) / sec:.2f} latents/min.** "
        f"(A 135M model does not do the task well: see RESULTS_explain.md; this is the pipeline's cost only.)", ""])


explain_section.results = RESULTS_FEATURES  # type: ignore[attr-defined]


SECTIONS = {"crosscoder": crosscoder_section, "matryoshka": matryoshka_section, "explain": explain_section}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {sorted(SECTIONS)}")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--d", type=int, default=576, help="each model's width (synthetic data)")
    ap.add_argument("--d-sae", type=int, default=2048)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", default=None, help="a saved tensor [n, 2d] of paired tokens to use as the batches")
    ap.add_argument("--n-explain", type=int, default=3, help="latents explained (section explain)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.sections.split(","):
        if name not in SECTIONS:
            raise SystemExit(f"unknown section {name!r}; choose from {sorted(SECTIONS)}")
        text = SECTIONS[name](args)
        print(text)
        if not args.no_write:
            replace_section(getattr(SECTIONS[name], "results", RESULTS), text.splitlines()[0], text)


if __name__ == "__main__":
    main()
