"""Benchmark: batched probes vs per-layer scikit-learn / concept-erasure loops on the same data, interleaved.

30 layers x width 576 x 4,000 samples of synthetic activations (low-rank + noise covariance, a large
constant offset on a few dimensions, a planted direction whose strength grows with depth).

* logistic probes, held-out 80/20 split: ``probes.fit_logistic`` (all layers in one solve) vs a loop of
  ``StandardScaler + LogisticRegression`` per layer with the same objective (``C = 1 / (l2 * n_train)``) and
  the same stopping rule (max |gradient| of the mean objective < tol);
* logistic probes, 5-fold CV: ``probes.cross_validate`` (all folds and layers in one solve) vs 150 sklearn fits;
* difference of means: ``probes.diff_of_means`` vs a numpy loop per layer;
* LEACE: ``probes.fit_leace`` + erase vs ``concept_erasure.LeaceFitter`` + erase per layer.

Run: ``python benchmarks/bench_probes.py`` (writes ``benchmarks/RESULTS_probes.md``; ``--no-write`` to skip).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import probes  # noqa: E402
from interp.io import atomic_write  # noqa: E402


def make_data(n: int, L: int, d: int, seed: int = 0, update: float = 0.1, s0: float = 0.02,
              s1: float = 0.4) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic residual stream shaped like SmolLM2-135M's (measured on its Big Five activations).

    Layer 0 has a power-law covariance spectrum (eigenvalues ~ 70 i^-1.3 e^(-i/120), condition ~1e5 after
    standardising, as in the real model), per-dimension scales that vary 10x, and a few "massive"
    dimensions with large means. Each later layer adds a low-rank update to the previous one, so
    neighbouring layers are correlated. A concept direction, drifting slowly with depth, is planted with a
    strength that grows with depth (held-out accuracy from ~0.5 at layer 0 to ~0.85 at the last).
    """
    g = torch.Generator().manual_seed(seed)
    i = torch.arange(1, d + 1, dtype=torch.float32)
    evals = 70.0 * i ** -1.3 * torch.exp(-i / 120.0) + 1e-4
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    mix = (Q * evals.sqrt()) @ Q.T                                       # covariance Q diag(evals) Q^T
    scale = torch.exp(0.6 * torch.randn(d, generator=g))
    y = (torch.rand(n, generator=g) < 0.5).long()
    u = torch.randn(d, generator=g)
    X = torch.empty(n, L, d)
    cur = (torch.randn(n, d, generator=g) @ mix) * scale
    for layer in range(L):                                               # data generation, not a solver
        if layer:
            k = 16
            A = torch.randn(d, k, generator=g) / d ** 0.5
            B = torch.randn(k, d, generator=g) * scale * update
            cur = cur + torch.tanh(cur @ A) @ B
        u = u + 0.3 * torch.randn(d, generator=g)
        unit = u / u.norm()
        strength = s0 + s1 * layer / max(1, L - 1)
        X[:, layer] = cur + (y.float() - 0.5)[:, None] * strength * unit * scale
    offset = torch.randn(d, generator=g) * 2.0
    offset[:4] = torch.tensor([480.0, -300.0, 120.0, 60.0])              # massive activations
    X += offset
    return X, y


def split(y: torch.Tensor, frac: float = 0.8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    train = torch.zeros(len(y), dtype=torch.bool)
    for c in (0, 1):
        idx = (y == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        train[idx[: int(frac * len(idx))]] = True
    return train.nonzero().flatten(), (~train).nonzero().flatten()


def sk_logistic(Xtr, ytr, Xte, yte, C, tol):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    accs, iters = [], []
    for layer in range(Xtr.shape[1]):
        pipe = make_pipeline(StandardScaler(), LogisticRegression(C=C, tol=tol, max_iter=2000))
        pipe.fit(Xtr[:, layer], ytr)
        accs.append(pipe.score(Xte[:, layer], yte))
        iters.append(int(pipe[-1].n_iter_[0]))
    return np.array(accs), iters


def sk_cv(X, y, folds, l2, tol):
    accs = []
    for f in folds:
        tr, te = f.train.numpy(), f.test.numpy()
        a, _ = sk_logistic(X[tr], y[tr], X[te], y[te], probes.logistic.sklearn_C(l2, len(tr)), tol)
        accs.append(a)
    return np.stack(accs)


def timed(fn, *args, **kw):
    t = time.perf_counter()
    out = fn(*args, **kw)
    return time.perf_counter() - t, out


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), "
            f"Python {platform.python_version()}, load average {load[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--d", type=int, default=576)
    ap.add_argument("--l2", type=float, default=1e-3)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--rounds", type=int, default=3, help="rounds for difference of means and LEACE")
    ap.add_argument("--logistic-rounds", type=int, default=2, help="rounds of the single-split logistic comparison")
    ap.add_argument("--cv-rounds", type=int, default=1, help="rounds of the 5-fold comparison (0 skips it)")
    ap.add_argument("--cv-layers", type=int, default=6, help="evenly spaced layers used in the 5-fold comparison")
    ap.add_argument("--threads", type=int, default=1, help="torch / BLAS threads for both sides")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from concept_erasure import LeaceFitter
    from threadpoolctl import threadpool_limits

    threadpool_limits(args.threads)                                      # sklearn / numpy BLAS and OpenMP too

    X, y = make_data(args.n, args.layers, args.d)
    tr, te = split(y)
    Xtr, ytr, Xte, yte = X[tr], y[tr], X[te], y[te]
    Xnp, ynp = X.numpy(), y.numpy()
    Xtr_np, ytr_np, Xte_np, yte_np = Xtr.numpy(), ytr.numpy(), Xte.numpy(), yte.numpy()
    C = probes.logistic.sklearn_C(args.l2, len(tr))
    rows: list[tuple[str, list[float], list[float], str]] = []
    # warm-up (imports, thread pools, first-call allocations) on a small slice, untimed
    small = slice(0, 400)
    probes.fit_logistic(Xtr[small, :2], ytr[small], l2=args.l2)
    sk_logistic(Xtr_np[small, :2], ytr_np[small], Xte_np[:100, :2], yte_np[:100], C, args.tol)
    probes.fit_leace(X[small, :2], y[small])
    LeaceFitter.fit(X[small, 0], y[small].float())

    # --- logistic, one split -----------------------------------------------------------------------------
    t_ours, t_sk = [], []
    for _ in range(args.logistic_rounds):
        dt, probe = timed(lambda: probes.fit_logistic(Xtr, ytr, l2=args.l2, tol=args.tol))
        acc_ours = probe.score(Xte, yte).numpy()
        t_ours.append(dt)
        dt, (acc_sk, sk_iters) = timed(sk_logistic, Xtr_np, ytr_np, Xte_np, yte_np, C, args.tol)
        t_sk.append(dt)
    gap = np.abs(acc_ours - acc_sk)
    rows.append((f"logistic probes, 80/20 split ({args.layers} fits)", t_ours, t_sk,
                 f"held-out acc ours {acc_ours.mean():.4f} vs sklearn {acc_sk.mean():.4f} (mean over layers), "
                 f"max per-layer gap {100 * gap.max():.2f} pt; iterations ours {probe.n_iter} (all layers), "
                 f"sklearn median {int(np.median(sk_iters))} per layer"))

    # --- logistic, 5-fold CV -------------------------------------------------------------------------------
    if args.cv_rounds > 0:
        keep = torch.linspace(0, args.layers - 1, min(args.cv_layers, args.layers)).round().long().unique()
        Xcv, Xcv_np = X[:, keep], Xnp[:, keep.numpy()]
        folds = probes.folds.make_folds(y, 5, seed=0)
        t_ours, t_sk = [], []
        for _ in range(args.cv_rounds):
            dt, cv = timed(lambda: probes.cross_validate(
                Xcv, y, tol=args.tol, config=probes.CVConfig(n_folds=5, control=False, l2=args.l2)))
            t_ours.append(dt)
            dt, cv_sk = timed(sk_cv, Xcv_np, ynp, folds, args.l2, args.tol)
            t_sk.append(dt)
        gap = np.abs(cv.accuracy.numpy() - cv_sk)
        rows.append((f"logistic probes, 5-fold CV on {len(keep)} layers ({5 * len(keep)} fits)", t_ours, t_sk,
                     f"CV acc ours {cv.accuracy.mean():.4f} vs sklearn {cv_sk.mean():.4f}; "
                     f"max per-fold-layer gap {100 * gap.max():.2f} pt"))

    # --- difference of means -------------------------------------------------------------------------------
    def np_diff():
        return np.stack([Xnp[ynp == 1, i].mean(0) - Xnp[ynp == 0, i].mean(0) for i in range(args.layers)])

    t_ours, t_np = [], []
    for _ in range(max(args.rounds, 5)):
        dt, dm = timed(probes.diff_of_means, X, y)
        t_ours.append(dt)
        dt, ref = timed(np_diff)
        t_np.append(dt)
    err = float(np.abs(dm.raw.numpy() - ref).max())
    rows.append(("difference of means (all layers) vs numpy loop", t_ours, t_np, f"max abs diff {err:.1e}"))

    # --- LEACE ---------------------------------------------------------------------------------------------
    def ce_leace():
        out = torch.empty_like(X)
        for i in range(args.layers):
            out[:, i] = LeaceFitter.fit(X[:, i], y.float()).eraser(X[:, i])
        return out

    t_ours, t_ce = [], []
    for _ in range(args.rounds):
        dt, erased = timed(lambda: probes.fit_leace(X, y)(X))
        t_ours.append(dt)
        dt, ref = timed(ce_leace)
        t_ce.append(dt)
    scale = X.abs().max()
    err = float((erased - ref).abs().max() / scale)
    check = [0, args.layers // 2, args.layers - 1]                       # float64 reference on three layers
    err64 = max(float((erased[:, i].double() - LeaceFitter.fit(X[:, i].double(), y.double()).eraser(
        X[:, i].double())).abs().max() / scale) for i in check)
    rows.append(("LEACE fit + erase (all layers) vs concept-erasure loop", t_ours, t_ce,
                 f"max abs diff / max abs x: {err64:.1e} vs concept-erasure run in float64 (layers {check}); "
                 f"{err:.1e} vs its float32 run timed here (that gap is concept-erasure's own float32 error "
                 f"on this ill-conditioned data; ours solves in float64)"))

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cmd = "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:])
    lines = [
        "# probes benchmark",
        "",
        f"Command: `{cmd}`",
        "",
        f"Machine: {machine()}. Data: {args.n} samples x {args.layers} layers x width {args.d} (float32), "
        f"l2 = {args.l2} (sklearn C = {C:.4g}), tol = {args.tol} on both sides. Peak RSS {peak:.0f} MiB.",
        "",
        "| task | ours (median s) | reference (median s) | reference / ours | rounds | notes |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, a, b, note in rows:
        ma, mb = statistics.median(a), statistics.median(b)
        lines.append(f"| {name} | {ma:.3f} | {mb:.3f} | {mb / ma:.1f}x | {len(a)} | {note} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        out = Path(__file__).resolve().parent / "RESULTS_probes.md"
        atomic_write(out, lambda tmp: Path(tmp).write_text(text))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
