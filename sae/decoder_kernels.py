"""Triton kernels for the sparse decoder (see :mod:`sae.sparse_decoder`). Imported lazily.

Kernels are built on first use, so ``import sae`` works without Triton, and ``TRITON_INTERPRET=1`` set
before first use runs them on CPU tensors (how the tests check them without a GPU). Accumulation is in
float32 whatever the storage dtype.
"""

from __future__ import annotations

import functools

import torch

from interp._triton import triton_available  # noqa: F401  (re-exported)
from interp._triton import triton_interpret as _interpret

BLOCK_M = 32
BLOCK_D = 64




@functools.lru_cache(maxsize=2)
def _build(interpret: bool) -> dict:
    try:
        import triton
        import triton.language as tl
    except Exception as e:  # pragma: no cover - depends on the install
        raise ImportError(f"the Triton sparse decoder needs the `triton` package ({e}); use backend='torch'") from e

    @triton.jit
    def gather_sum_kernel(table, w, cols, row_ptr, out, D, stride_t, stride_o,
                          BM: tl.constexpr, BD: tl.constexpr):
        n = tl.program_id(0)
        d = tl.program_id(1) * BD + tl.arange(0, BD)
        dmask = d < D
        start = tl.load(row_ptr + n)
        end = tl.load(row_ptr + n + 1)
        acc = tl.zeros((BD,), dtype=tl.float32)
        for m0 in range(start, end, BM):
            m = m0 + tl.arange(0, BM)
            mmask = m < end
            c = tl.load(cols + m, mask=mmask, other=0)
            wv = tl.load(w + m, mask=mmask, other=0.0).to(tl.float32)
            tile = tl.load(table + c[:, None] * stride_t + d[None, :], mask=mmask[:, None] & dmask[None, :],
                           other=0.0).to(tl.float32)
            acc += tl.sum(tile * wv[:, None], axis=0)
        tl.store(out + n * stride_o + d, acc.to(out.dtype.element_ty), mask=dmask)

    @triton.jit
    def gather_dot_kernel(table, src, rows, cols, out, M, D, stride_t, stride_s,
                          BM: tl.constexpr, BD: tl.constexpr):
        m = tl.program_id(0) * BM + tl.arange(0, BM)
        mmask = m < M
        r = tl.load(rows + m, mask=mmask, other=0)
        c = tl.load(cols + m, mask=mmask, other=0)
        acc = tl.zeros((BM,), dtype=tl.float32)
        for d0 in range(0, D, BD):
            d = d0 + tl.arange(0, BD)
            msk = mmask[:, None] & (d < D)[None, :]
            t = tl.load(table + c[:, None] * stride_t + d[None, :], mask=msk, other=0.0).to(tl.float32)
            s = tl.load(src + r[:, None] * stride_s + d[None, :], mask=msk, other=0.0).to(tl.float32)
            acc += tl.sum(t * s, axis=1)
        tl.store(out + m, acc.to(out.dtype.element_ty), mask=mmask)

    @triton.jit
    def scatter_outer_kernel(w, src, rows, cols, out, M, D, stride_s, stride_ol, stride_od,
                             BM: tl.constexpr, BD: tl.constexpr):
        m = tl.program_id(0) * BM + tl.arange(0, BM)
        d = tl.program_id(1) * BD + tl.arange(0, BD)
        mmask = m < M
        msk = mmask[:, None] & (d < D)[None, :]
        r = tl.load(rows + m, mask=mmask, other=0)
        c = tl.load(cols + m, mask=mmask, other=0)
        wv = tl.load(w + m, mask=mmask, other=0.0).to(tl.float32)
        s = tl.load(src + r[:, None] * stride_s + d[None, :], mask=msk, other=0.0).to(tl.float32)
        tl.atomic_add(out + c[:, None] * stride_ol + d[None, :] * stride_od, s * wv[:, None], mask=msk)

    return {"triton": triton, "gather_sum": gather_sum_kernel, "gather_dot": gather_dot_kernel,
            "scatter_outer": scatter_outer_kernel}


def _k() -> dict:
    return _build(_interpret())


def _c(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def gather_sum_triton(table: torch.Tensor, w: torch.Tensor, act) -> torch.Tensor:
    """``out[n] = sum_{m in row n} w[m] * table[cols[m]]`` -> ``[n_rows, d]``."""
    k = _k()
    table, w = _c(table), _c(w)
    n, d = act.n_rows, table.shape[1]
    out = torch.empty(n, d, dtype=table.dtype, device=table.device)
    if n == 0:
        return out
    grid = (n, k["triton"].cdiv(d, BLOCK_D))
    k["gather_sum"][grid](table, w, _c(act.cols), _c(act.row_ptr), out, d, table.stride(0), out.stride(0),
                          BM=BLOCK_M, BD=BLOCK_D)
    return out


def gather_dot_triton(table: torch.Tensor, src: torch.Tensor, act) -> torch.Tensor:
    """``out[m] = <src[rows[m]], table[cols[m]]>`` -> ``[M]``."""
    k = _k()
    table, src = _c(table), _c(src)
    m, d = act.cols.numel(), table.shape[1]
    out = torch.empty(m, dtype=table.dtype, device=table.device)
    if m == 0:
        return out
    grid = (k["triton"].cdiv(m, BLOCK_M),)
    k["gather_dot"][grid](table, src, _c(act.rows), _c(act.cols), out, m, d, table.stride(0), src.stride(0),
                          BM=BLOCK_M, BD=BLOCK_D)
    return out


def scatter_outer_triton(n_out: int, w: torch.Tensor, src: torch.Tensor, act, transpose: bool = False) -> torch.Tensor:
    """``out[cols[m]] += w[m] * src[rows[m]]`` into zeros ``[n_out, d]`` (or ``[d, n_out]`` if ``transpose``).

    Accumulates in float32 with atomics, then casts to the source dtype."""
    k = _k()
    w, src = _c(w), _c(src)
    m, d = act.cols.numel(), src.shape[1]
    if transpose:
        out = torch.zeros(d, n_out, dtype=torch.float32, device=src.device)
        s_l, s_d = 1, n_out
    else:
        out = torch.zeros(n_out, d, dtype=torch.float32, device=src.device)
        s_l, s_d = d, 1
    if m:
        grid = (k["triton"].cdiv(m, BLOCK_M), k["triton"].cdiv(d, BLOCK_D))
        k["scatter_outer"][grid](w, src, _c(act.rows), _c(act.cols), out, m, d, src.stride(0), s_l, s_d,
                                 BM=BLOCK_M, BD=BLOCK_D)
    return out.to(src.dtype)
