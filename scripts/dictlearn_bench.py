"""Worker run by benchmarks/bench_features.py with .dictlearn-venv's python (scripts/dictlearn_venv.sh): PyPI
dictionary_learning 0.1.0's BatchTopKTrainer on the batches saved by the benchmark, timed in rounds on command.

    .dictlearn-venv/bin/python scripts/dictlearn_bench.py BATCHES.pt D_SAE K THREADS

Reads lines ``START N`` on stdin, runs ``trainer.update`` on batches START..START+N-1 and prints the seconds; step 0
(its geometric-median initialisation of b_dec) runs once, untimed, before the first line is read.
"""

import sys
import time

import torch
from dictionary_learning.trainers.batch_top_k import BatchTopKTrainer


def main() -> None:
    path, d_sae, k, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(threads)
    batches = torch.load(path)
    tr = BatchTopKTrainer(steps=10 ** 6, activation_dim=batches.shape[-1], dict_size=d_sae, k=k, layer=0,
                          lm_name="bench", warmup_steps=10, seed=0, device="cpu")
    tr.update(0, batches[0])
    print("ready", flush=True)
    for line in sys.stdin:
        start, n = (int(v) for v in line.split())
        t = time.perf_counter()
        for i in range(start, start + n):
            tr.update(i + 1, batches[i])
        print(f"{time.perf_counter() - t:.6f}", flush=True)


if __name__ == "__main__":
    main()
