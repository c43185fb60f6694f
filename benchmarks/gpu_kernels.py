"""GPU benchmark of the fused residual edit: Triton kernel vs eager torch on 1e6 x 4096 bf16 activations.

Reports achieved bandwidth (one read + one write of the activations) against the card's copy bandwidth
(``y.copy_(x)`` on the same tensor; target >= 80%), for k = 1, 4 and 16 projected-out directions plus an
addition and a token mask, and checks the result against a float64 reference on a slice. Needs CUDA;
on a machine without one it says "skipped: no CUDA" (also into ``--out``) and exits 0.

    python benchmarks/gpu_kernels.py                  # 1e6 x 4096 bf16
    python benchmarks/gpu_kernels.py --rows 200000 --write
    python benchmarks/gpu_kernels.py --out runs/gpu/kernels.md      # as benchmarks/gpu_all.sh runs it
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))
_spec = importlib.util.spec_from_file_location("_bench_common", HERE / "_common.py")
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)

from steering.fused import edit_torch  # noqa: E402

RESULTS = HERE / "RESULTS_steering.md"
BEGIN, END = "<!-- begin:gpu_kernels -->", "<!-- end:gpu_kernels -->"


def cuda_time(fn, reps: int = 10, warmup: int = 3) -> float:
    """Median seconds of ``fn()`` measured with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)


def reference(x, U, W, b, mask):
    x64 = x.double()
    y = x64 - (x64 @ W.double().T) @ U.double() + b.double()
    return torch.where(mask[:, None], y, x64)


def bench_k(x: torch.Tensor, mask: torch.Tensor, k: int, copy_bw: float, io_bytes: int) -> list[dict]:
    """Fused kernel (default tiles and a small sweep) and eager torch for ``k`` projected-out directions."""
    from steering.kernels import block_sizes, edit_triton

    d, dev, rows = x.shape[1], x.device, []
    Q = torch.linalg.qr(torch.randn(d, k, device=dev, dtype=torch.float64))[0].T.float().contiguous()
    b = torch.randn(d, device=dev)
    sl = slice(0, 4096)  # correctness on a slice first
    got = edit_triton(x[sl], Q, Q, b, mask[sl], None, 0.0, True)
    err = (got.double() - reference(x[sl], Q, Q, b, mask[sl])).abs().max().item()
    best = None
    for cfg in (None, (4, 256), (8, 128), (16, 64), (2, 512)):
        kw = {} if cfg is None else {"block_m": cfg[0], "block_d": cfg[1]}
        try:
            t = cuda_time(lambda kw=kw: edit_triton(x, Q, Q, b, mask, None, 0.0, True, **kw))
        except Exception as e:  # a tile that does not compile on this card is skipped, not fatal
            print(f"k={k} tile {cfg}: {type(e).__name__}: {str(e)[:120]}")
            continue
        label = f"triton fused {'default ' + str(block_sizes(k, d)[:2]) if cfg is None else cfg}"
        if cfg is None:
            rows.append({"method": label, "k": k, "ms": 1e3 * t, "GB/s": io_bytes / t / 1e9,
                         "% of copy": 100 * io_bytes / t / copy_bw, "max err vs f64": err})
        if best is None or t < best[0]:
            best = (t, label)
    if best is not None:
        rows.append({"method": f"best: {best[1]}", "k": k, "ms": 1e3 * best[0], "GB/s": io_bytes / best[0] / 1e9,
                     "% of copy": 100 * io_bytes / best[0] / copy_bw})
    Qb, bb = Q.bfloat16(), b.bfloat16()
    eager = {
        "eager torch fallback (fp32 math)": lambda: edit_torch(x, Q, Q, b, mask, None, 0.0, True),
        "eager torch bf16 (addmm + where)": lambda: torch.where(
            mask[:, None], torch.addmm(x, x @ Qb.T, Qb, alpha=-1) + bb, x),
    }
    for name, fn in eager.items():
        try:
            t = cuda_time(fn, reps=5, warmup=1)
            rows.append({"method": name, "k": k, "ms": 1e3 * t, "GB/s": io_bytes / t / 1e9,
                         "% of copy": 100 * io_bytes / t / copy_bw})
        except torch.cuda.OutOfMemoryError:
            rows.append({"method": name, "k": k, "ms": "OOM"})
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--ks", default="1,4,16")
    ap.add_argument("--write", action="store_true", help="put the table into benchmarks/RESULTS_steering.md")
    ap.add_argument("--out", help="also write the table (or the line saying why it did not run) to this file")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        _common.skipped("fused edit kernel bandwidth", "no CUDA device (it needs an NVIDIA GPU with Triton)", args.out)
        return
    n, d = args.rows, args.width
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(n, d, device=dev, dtype=torch.bfloat16, generator=g)
    mask = torch.rand(n, device=dev, generator=g) > 0.1
    io_bytes = 2 * x.numel() * x.element_size()
    y = torch.empty_like(x)
    t_copy = cuda_time(lambda: y.copy_(x))
    copy_bw = io_bytes / t_copy
    rows = [{"method": "copy (y.copy_(x))", "k": "", "ms": 1e3 * t_copy, "GB/s": copy_bw / 1e9, "% of copy": 100.0}]
    for k in (int(v) for v in args.ks.split(",")):
        rows += bench_k(x, mask, k, copy_bw, io_bytes)
    text = _common.table(f"Fused residual edit on {n} x {d} bf16 ({torch.cuda.get_device_name()})", rows,
                         ["method", "k", "ms", "GB/s", "% of copy", "max err vs f64"])
    text += (f"\nBandwidth counts one read and one write of the activations ({io_bytes / 1e9:.1f} GB). Target: "
             f"fused >= 80% of copy. Command: `python benchmarks/gpu_kernels.py --rows {n} --width {d}`. "
             f"Machine: {_common.machine()}.\n")
    print(text)
    if args.out:
        _common.write_text(args.out, text)
    if args.write:
        old = RESULTS.read_text() if RESULTS.exists() else ""
        block = f"{BEGIN}\n{text}{END}\n"
        if BEGIN in old and END in old:
            new = old[:old.index(BEGIN)] + block + old[old.index(END) + len(END) + 1:]
        else:
            new = old + ("\n" if old else "") + block
        from interp.io import atomic_write

        atomic_write(RESULTS, lambda p: Path(p).write_text(new))


if __name__ == "__main__":
    main()
