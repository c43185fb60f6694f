"""Triton kernel for the fused residual edit (see :mod:`steering.fused`). Imported and built lazily.

One program owns ``BM`` rows. Pass 1 streams the rows once to form the ``k`` dot products with ``W`` (and
the condition's dot product); pass 2 streams them again (from L2: a program's rows are a few tens of KB)
and writes ``x + g * (b - U^T dots)``. HBM traffic is one read and one write of the activations. All
accumulation is float32 whatever the storage dtype (fp32, bf16, fp16). ``TRITON_INTERPRET=1`` set before
first use runs it on CPU tensors, which is how the tests check it without a GPU.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from interp._triton import triton_available  # noqa: F401  (re-exported)
from interp._triton import triton_interpret as _interpret

MAX_K = 16




@functools.lru_cache(maxsize=2)
def _build(interpret: bool):
    try:
        import triton
        import triton.language as tl
    except Exception as e:  # pragma: no cover - depends on the install
        raise ImportError(f"the fused steering kernel needs `triton` ({e}); use backend='torch'") from e

    @triton.jit
    def edit_kernel(X, Y, U, W, B, M, C, N, D, K, stride_x, stride_y, thr,
                    HAS_B: tl.constexpr, HAS_M: tl.constexpr, HAS_C: tl.constexpr, ABOVE: tl.constexpr,
                    BM: tl.constexpr, BD: tl.constexpr, KP: tl.constexpr):
        pid = tl.program_id(0)
        rows = pid * BM + tl.arange(0, BM)
        rmask = rows < N
        ks = tl.arange(0, KP)
        kmask = ks < K
        xrow = X + rows.to(tl.int64)[:, None] * stride_x
        yrow = Y + rows.to(tl.int64)[:, None] * stride_y
        dots = tl.zeros((BM, KP), dtype=tl.float32)
        cdot = tl.zeros((BM,), dtype=tl.float32)
        for d0 in range(0, D, BD):
            cols = d0 + tl.arange(0, BD)
            cmask = cols < D
            x = tl.load(xrow + cols[None, :], mask=rmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)
            w = tl.load(W + ks[:, None] * D + cols[None, :], mask=kmask[:, None] & cmask[None, :], other=0.0)
            dots += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
            if HAS_C:
                c = tl.load(C + cols, mask=cmask, other=0.0)
                cdot += tl.sum(x * c[None, :], axis=1)
        gate = rmask
        if HAS_M:
            m = tl.load(M + rows, mask=rmask, other=0)
            gate = gate & (m != 0)
        if HAS_C:
            if ABOVE:
                gate = gate & (cdot > thr)
            else:
                gate = gate & (cdot < thr)
        g = gate.to(tl.float32)
        for d0 in range(0, D, BD):
            cols = d0 + tl.arange(0, BD)
            cmask = cols < D
            io_mask = rmask[:, None] & cmask[None, :]
            x = tl.load(xrow + cols[None, :], mask=io_mask, other=0.0).to(tl.float32)
            u = tl.load(U + ks[:, None] * D + cols[None, :], mask=kmask[:, None] & cmask[None, :], other=0.0)
            delta = -tl.sum(dots[:, :, None] * u[None, :, :], axis=1)
            if HAS_B:
                bb = tl.load(B + cols, mask=cmask, other=0.0)
                delta += bb[None, :]
            y = x + g[:, None] * delta
            tl.store(yrow + cols[None, :], y.to(Y.dtype.element_ty), mask=io_mask)

    return triton, edit_kernel


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def block_sizes(k: int, d: int) -> tuple[int, int, int]:
    """``(BM, BD, KP)``: the 3-D product tile ``BM x KP x BD`` stays near 4K float32 values per program."""
    kp = _next_pow2(max(k, 1))
    bd = min(_next_pow2(d), 256 if kp <= 2 else 128 if kp <= 4 else 64)
    bm = max(1, min(16, 4096 // (kp * bd)))
    return bm, bd, kp


def edit_triton(x: Tensor, U: Tensor, W: Tensor, b: Tensor | None, row_mask: Tensor | None, cond: Tensor | None,
                threshold: float, above: bool, block_m: int | None = None, block_d: int | None = None) -> Tensor:
    """The fused edit on ``x [..., d]`` (fp32/bf16/fp16); same contract as :func:`steering.fused.edit_torch`."""
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"the Triton edit supports float32/bfloat16/float16, got {x.dtype}; use backend='torch'")
    k = U.shape[0]
    if k > MAX_K:
        raise ValueError(f"the Triton edit supports k <= {MAX_K} directions, got {k}; use backend='torch'")
    if not (x.is_cuda or _interpret()):
        raise RuntimeError("the Triton edit needs a CUDA tensor (or TRITON_INTERPRET=1 for CPU checks)")
    triton, kernel = _build(_interpret())
    shape, d = x.shape, x.shape[-1]
    x2 = x.reshape(-1, d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    n = x2.shape[0]
    y = torch.empty((n, d), dtype=x.dtype, device=x.device)
    dev = x.device
    Uf = U.to(dev, torch.float32).contiguous()
    Wf = W.to(dev, torch.float32).contiguous()
    if k == 0:  # keep valid pointers; every load is masked off
        Uf = Wf = torch.zeros(1, d, dtype=torch.float32, device=dev)
    bf = b.to(dev, torch.float32).contiguous() if b is not None else Uf
    mf = row_mask.reshape(-1).to(dev, torch.uint8).contiguous() if row_mask is not None else Uf
    cf = cond.to(dev, torch.float32).contiguous() if cond is not None else Uf
    bm, bd, kp = block_sizes(k, d)
    bm, bd = block_m or bm, block_d or bd
    if n > 0:
        grid = (triton.cdiv(n, bm),)
        kernel[grid](x2, y, Uf, Wf, bf, mf, cf, n, d, k, x2.stride(0), y.stride(0), float(threshold),
                     HAS_B=b is not None, HAS_M=row_mask is not None, HAS_C=cond is not None, ABOVE=bool(above),
                     BM=bm, BD=bd, KP=kp)
    return y.reshape(shape)
