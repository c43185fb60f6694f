"""SAE training benchmark: our trainer against sae-lens ``SAETrainer`` (and EleutherAI sparsify with ``--sparsify``)
on the same synthetic activations.

TopK SAE, d_in 512, 16,384 latents, k=32, batch 4096 and 1024. Both trainers get the identical batches,
interleaved round by round (rotating order); we report median tokens/s, peak memory growth, and the FVU of
both SAEs on held-out tokens after the same number of tokens. Writes ``benchmarks/RESULTS_sae.md``.

    python benchmarks/bench_sae.py                      # CPU, a few steps per round (~4 min on 2 cores)
    python benchmarks/bench_sae.py --device cuda --rounds 5 --steps 20 --fvu-steps 500   # GPU machine
    python benchmarks/bench_sae.py --sparsify ...        # also EleutherAI sparsify (skipped when not importable)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo before this folder: `sae` is the package

from _common import PeakRSS, cuda_wanted, machine, skipped, table, write_text  # noqa: E402

from sae.synthetic import planted_fixed_k  # noqa: E402
from sae.trainer import TrainConfig, Trainer  # noqa: E402

D_IN, D_SAE, K, N_FEATURES = 512, 16_384, 32, 16_384
NOTES = """
Notes:
- Why faster: our TopK step computes the dense encoder matmul once and touches only the k active latents after
  it (sparse decode forward and backward, sparse encoder-weight gradient: `embedding_bag` on CPU, Triton on
  GPU); sae-lens multiplies the dense `[batch, 16384]` latent matrix through the decoder forward and backward.
  Fused Adam is used where torch supports it.
- FVU after equal tokens compares both SAEs after the same (few, on CPU) batches: this is early training.
  Ours starts from `b_dec` = data mean and normalised inputs, which is most of its lead here; run with
  `--fvu-steps N` for a longer comparison.
- Peak memory: {device} peak growth during the timed steps (CPU: sampled resident memory; CUDA: allocator peak).
- GPU variant (`--device cuda`, Triton kernels for the sparse decoder; `benchmarks/gpu_all.sh` runs it with
  `--sparsify`): ready, not run in this task (no GPU).
"""


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class _Mem:
    """Peak memory growth of a block: CUDA allocator peak on GPU, sampled resident memory on CPU."""

    def __init__(self, device: str):
        self.device = device

    def __enter__(self) -> _Mem:
        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            self.rss = PeakRSS().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.startswith("cuda"):
            self.mb = (torch.cuda.max_memory_allocated() - self.start) / 2**20
        else:
            self.rss.__exit__(*exc)
            self.mb = self.rss.growth_mb


def ours(x0: torch.Tensor, batch: int, lr: float, device: str) -> tuple[Trainer, Any]:
    cfg = TrainConfig(arch="topk", d_sae=D_SAE, k=K, batch_size=batch, total_tokens=10**9, lr=lr, warmup_steps=0,
                      decay_frac=0.0, dead_after_tokens=1000 * batch, progress=False, log_every=10**9, device=device)
    tr = Trainer(x0, cfg)
    tr.prepare()  # input scale and b_dec from the first batches (one-off, not timed)
    return tr, tr.train_one


def saelens(batch: int, lr: float, device: str) -> tuple[Any, Any]:
    from sae_lens.config import SAETrainerConfig
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.training.sae_trainer import SAETrainer

    sae = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=D_IN, d_sae=D_SAE, k=K, device=device))
    cfg = SAETrainerConfig(total_training_samples=10**9, train_batch_size_samples=batch, lr=lr, lr_end=lr,
                           device=device, dead_feature_window=1000)  # logging is off by default
    tr = SAETrainer(cfg, sae, data_provider=iter(()))
    sae.to(device)

    def step(b: torch.Tensor) -> None:
        tr.step(b)
        tr.n_training_steps += 1

    return tr, step


def sparsify(batch: int, lr: float, device: str) -> tuple[Any, Any]:
    """EleutherAI sparsify's TopK ``SparseCoder`` (PyPI ``eai-sparsify``) trained the way its trainer steps: FVU
    plus AuxK loss, gradient parallel to the decoder rows removed, Adam, decoder rows renormalised."""
    import os

    if not device.startswith("cuda"):
        os.environ.setdefault("SPARSIFY_DISABLE_TRITON", "1")  # its Triton path looks for a GPU driver at import
    from sparsify import SparseCoder, SparseCoderConfig

    sae = SparseCoder(D_IN, SparseCoderConfig(num_latents=D_SAE, k=K), device=device)
    opt = torch.optim.Adam(sae.parameters(), lr=lr)

    def step(b: torch.Tensor) -> None:
        out = sae(b)
        (out.fvu + getattr(out, "auxk_loss", 0.0)).backward()
        if hasattr(sae, "remove_gradient_parallel_to_decoder_directions"):
            sae.remove_gradient_parallel_to_decoder_directions()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if hasattr(sae, "set_decoder_norm_to_unit_norm"):
            sae.set_decoder_norm_to_unit_norm()

    return sae, step


def _trainers(x0: torch.Tensor, batch: int, args: argparse.Namespace) -> tuple[dict, dict, list[str]]:
    """``{name: step}``, ``{name: fvu(x_eval)}`` and notes; sparsify only with ``--sparsify`` and when importable."""
    dev, notes = args.device, []
    t_ours, step_ours = ours(x0, batch, args.lr, dev)
    t_theirs, step_theirs = saelens(batch, args.lr, dev)
    fns = {"ours (interp sae)": step_ours, "sae-lens SAETrainer": step_theirs}
    fvus = {"ours (interp sae)": lambda x: fvu_ours(t_ours, x), "sae-lens SAETrainer": lambda x: fvu_theirs(t_theirs, x)}
    if args.sparsify:
        try:
            sparsify(batch, args.lr, dev)[1](x0[:batch])  # one trial step: an API drift becomes a note, not a crash
            sp, step_sp = sparsify(batch, args.lr, dev)
            fns["EleutherAI sparsify SparseCoder"] = step_sp
            fvus["EleutherAI sparsify SparseCoder"] = lambda x: fvu_sparsify(sp, x)
        except Exception as e:  # not installed, or its import fails beside our stack: say so, do not stop
            notes.append(skipped("EleutherAI sparsify", f"not importable here ({type(e).__name__}: {str(e)[:160]}); "
                                 "`pip install --no-deps eai-sparsify schedulefree natsort` adds it"))
    return fns, fvus, notes


@torch.no_grad()
def fvu_sparsify(sae: Any, x: torch.Tensor) -> float:
    out = torch.cat([sae(x[a:a + 1024]).sae_out for a in range(0, len(x), 1024)])
    return float((out - x).pow(2).sum() / (x - x.mean(0)).pow(2).sum())


@torch.no_grad()
def fvu_ours(tr: Trainer, x: torch.Tensor) -> float:
    xs = x * tr.scale  # the SAE is still in normalised units while training; FVU is scale-free
    out = torch.cat([tr.sae(xs[a:a + 1024]) for a in range(0, len(xs), 1024)])
    return float((out - xs).pow(2).sum() / (xs - xs.mean(0)).pow(2).sum())


@torch.no_grad()
def fvu_theirs(tr: Any, x: torch.Tensor) -> float:
    out = torch.cat([tr.sae(x[a:a + 1024]) for a in range(0, len(x), 1024)])
    return float((out - x).pow(2).sum() / (x - x.mean(0)).pow(2).sum())


def run(batch: int, args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str]]:
    dev = args.device
    n_steps = 1 + args.rounds * args.steps + args.fvu_steps
    x, _ = planted_fixed_k(n_steps * batch + 4096, D_IN, N_FEATURES, 24, seed=0, device=dev)
    x_eval, x = x[-4096:], x[:-4096]
    batches = [x[i * batch:(i + 1) * batch] for i in range(n_steps)]
    torch.manual_seed(0)
    fns, fvus, notes = _trainers(x[: 16 * batch], batch, args)
    for fn in fns.values():  # warm-up step, same batch for all
        fn(batches[0])
    _sync(dev)
    times: dict[str, list[float]] = {k: [] for k in fns}
    mem: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(args.rounds):
        chunk = batches[1 + r * args.steps: 1 + (r + 1) * args.steps]
        for name in names[r % len(names):] + names[:r % len(names)]:
            with _Mem(dev) as m:
                t0 = time.perf_counter()
                for b in chunk:
                    fns[name](b)
                _sync(dev)
                times[name].append(len(chunk) * batch / (time.perf_counter() - t0))
            mem[name].append(m.mb)
        print(f"  batch {batch} round {r + 1}: " + ", ".join(f"{k} {times[k][-1]:.0f} tok/s" for k in names),
              flush=True)
    for b in batches[1 + args.rounds * args.steps:]:  # optional extra (untimed) training before FVU
        for fn in fns.values():
            fn(b)
    tokens = n_steps * batch
    fv = {k: fvus[k](x_eval) for k in names}
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = []
    for k in names:
        rows.append({"batch": batch, "trainer": k, "tokens/s (median)": med[k],
                     "ours / this (speed)": med[names[0]] / med[k], "FVU after equal tokens": fv[k],
                     "tokens trained": tokens, "peak mem growth MB": max(mem[k])})
    return rows, notes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (GPU variant: Triton sparse decoder)")
    ap.add_argument("--batches", default="4096,1024")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1, help="timed steps per trainer per round")
    ap.add_argument("--fvu-steps", type=int, default=0, help="extra untimed steps for both before measuring FVU")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--sparsify", action="store_true", help="also time EleutherAI sparsify (skipped if not importable)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "RESULTS_sae.md"))
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    if not cuda_wanted(args.device, "SAE training tokens/s", args.out):
        return
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    t0 = time.time()
    for b in [int(v) for v in args.batches.split(",")]:
        r, n = run(b, args)
        rows, notes = rows + r, notes + [x for x in n if x not in notes]
    cols = ["batch", "trainer", "tokens/s (median)", "ours / this (speed)", "FVU after equal tokens", "tokens trained",
            "peak mem growth MB"]
    cmd = "python benchmarks/bench_sae.py " + " ".join(sys.argv[1:])
    text = (table(f"SAE training: TopK, d_in {D_IN}, {D_SAE} latents, k={K} (synthetic activations, "
                  f"{N_FEATURES} planted features, 24 active per token)", rows, cols)
            + f"\nMachine: {machine()}. Command: `{cmd.strip()}`. Wall time {time.time() - t0:.0f} s.\n"
            "Both trainers see identical batches, interleaved per round in rotating order; medians over rounds. "
            "`ours / this` > 1 means we are faster. Target: >= 2x sae-lens tokens/s, FVU no worse.\n"
            + NOTES.format(device=args.device) + "".join(f"- {n}\n" for n in notes))
    print("\n" + text)
    write_text(args.out, text)


if __name__ == "__main__":
    main()
