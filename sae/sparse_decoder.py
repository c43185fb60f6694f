"""Sparse encode/decode for TopK and BatchTopK SAEs: only the active latents are touched.

The active set is a row-sorted COO list ``(rows, cols)`` with ``row_ptr`` (CSR offsets). Forward and
backward reduce to three primitives, each with a torch path (CPU: ``embedding_bag`` / ``index_add``) and
a Triton path (GPU, :mod:`sae.decoder_kernels`, imported lazily):

- ``gather_sum``:   ``out[n] = sum_{m in row n} w[m] * table[cols[m]]``          (decode forward)
- ``gather_dot``:   ``out[m] = <src[rows[m]], table[cols[m]]>``                   (grad of the values)
- ``scatter_outer``: ``out[cols[m]] += w[m] * src[rows[m]]``                       (grad of W_dec / W_enc)

Gradients equal dense autograd's (tested to 1e-5); the dense decoder costs ``N * d_sae * d`` per matmul,
this one ``N * k * d``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int

_CHUNK_ELEMS = 1 << 24  # bound temporary memory of the torch path (~64 MB of float32)


@dataclass
class Active:
    """Active latents of a batch: ``rows``/``cols`` ``[M]`` sorted by row, ``row_ptr`` ``[N+1]``."""

    rows: torch.Tensor
    cols: torch.Tensor
    row_ptr: torch.Tensor
    n_rows: int
    _by_col: tuple[torch.Tensor, torch.Tensor] | None = None

    def by_col(self, n_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Entry order grouped by column and the column offsets ``[n_cols+1]`` (cached)."""
        if self._by_col is None or self._by_col[1].numel() != n_cols + 1:
            order = torch.argsort(self.cols, stable=True)
            ptr = torch.zeros(n_cols + 1, dtype=torch.long, device=self.cols.device)
            ptr[1:] = torch.bincount(self.cols, minlength=n_cols).cumsum(0)
            self._by_col = (order, ptr)
        return self._by_col

    @classmethod
    def from_topk(cls, idx: Int[torch.Tensor, "n k"]) -> Active:
        """Fixed ``k`` per row (TopK)."""
        n, k = idx.shape
        rows = torch.arange(n, device=idx.device).repeat_interleave(k)
        row_ptr = torch.arange(0, n * k + 1, k, device=idx.device)
        return cls(rows, idx.reshape(-1), row_ptr, n)

    @classmethod
    def from_flat(cls, flat: Int[torch.Tensor, " m"], n_rows: int, d_sae: int) -> Active:
        """From flat indices ``row * d_sae + col`` in any order (BatchTopK, AuxK)."""
        flat = flat.sort().values
        rows, cols = flat // d_sae, flat % d_sae
        counts = torch.bincount(rows, minlength=n_rows)
        row_ptr = torch.zeros(n_rows + 1, dtype=torch.long, device=flat.device)
        row_ptr[1:] = counts.cumsum(0)
        return cls(rows, cols, row_ptr, n_rows)


def _use_triton(t: torch.Tensor, backend: str) -> bool:
    if backend == "triton":
        return True
    if backend == "torch":
        return False
    if backend != "auto":
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    if t.device.type != "cuda":
        return False
    from sae.decoder_kernels import triton_available

    return triton_available()


# --- primitives: torch path ---------------------------------------------------------------------
def _gather_sum_torch(table: torch.Tensor, w: torch.Tensor, act: Active) -> torch.Tensor:
    if w.numel() == 0:
        return table.new_zeros(act.n_rows, table.shape[1])
    return torch.nn.functional.embedding_bag(act.cols, table, act.row_ptr[:-1], mode="sum",
                                             per_sample_weights=w.to(table.dtype))


def _gather_dot_torch(table: torch.Tensor, src: torch.Tensor, act: Active) -> torch.Tensor:
    if act.cols.numel() == 0:
        return table.new_zeros(0)
    try:  # embedding_bag's own per-sample-weight gradient: exactly this contraction, no [M, d] temporary
        return torch.ops.aten._embedding_bag_per_sample_weights_backward(
            src.to(table.dtype), table, act.cols, act.row_ptr[:-1], act.rows, 0, -1)
    except (AttributeError, RuntimeError):  # pragma: no cover - older/newer torch without the op
        m = act.cols.numel()
        out = table.new_empty(m)
        step = max(1, _CHUNK_ELEMS // max(1, table.shape[1]))
        for a in range(0, m, step):
            b = min(m, a + step)
            out[a:b] = (table[act.cols[a:b]] * src[act.rows[a:b]]).sum(-1)
        return out


def _scatter_outer_torch(n_out: int, w: torch.Tensor, src: torch.Tensor, act: Active) -> torch.Tensor:
    # group the entries by column, then it is a gather-sum over src rows: no [M, d] temporary
    order, col_ptr = act.by_col(n_out)
    if order.numel() == 0:
        return src.new_zeros(n_out, src.shape[1])
    return torch.nn.functional.embedding_bag(act.rows[order], src, col_ptr[:-1], mode="sum",
                                             per_sample_weights=w[order].to(src.dtype))


# --- primitives: dispatch -----------------------------------------------------------------------
def gather_sum(table: Float[torch.Tensor, "L d"], w: Float[torch.Tensor, " m"], act: Active,
               backend: str = "auto") -> Float[torch.Tensor, "n d"]:
    """``out[n] = sum_{m in row n} w[m] * table[cols[m]]``."""
    if _use_triton(table, backend):
        from sae.decoder_kernels import gather_sum_triton

        return gather_sum_triton(table, w, act)
    return _gather_sum_torch(table, w, act)


def gather_dot(table: Float[torch.Tensor, "L d"], src: Float[torch.Tensor, "n d"], act: Active,
               backend: str = "auto") -> Float[torch.Tensor, " m"]:
    """``out[m] = <src[rows[m]], table[cols[m]]>``."""
    if _use_triton(table, backend):
        from sae.decoder_kernels import gather_dot_triton

        return gather_dot_triton(table, src, act)
    return _gather_dot_torch(table, src, act)


def scatter_outer(n_out: int, w: Float[torch.Tensor, " m"], src: Float[torch.Tensor, "n d"], act: Active,
                  backend: str = "auto", transpose: bool = False) -> torch.Tensor:
    """``out[cols[m]] += w[m] * src[rows[m]]`` into a zero ``[n_out, d]`` (``[d, n_out]`` if ``transpose``)."""
    if _use_triton(src, backend):
        from sae.decoder_kernels import scatter_outer_triton

        return scatter_outer_triton(n_out, w, src, act, transpose=transpose)
    out = _scatter_outer_torch(n_out, w, src, act)
    return out.t() if transpose else out


# --- autograd functions -------------------------------------------------------------------------
class _SparseEncode(torch.autograd.Function):
    """Pre-activations at the active entries: ``((x - b_dec) @ W_enc + b_enc)[rows, cols]``."""

    @staticmethod
    def forward(ctx, x, b_dec, W_enc, b_enc, pre_vals, act, backend):
        ctx.save_for_backward(x, b_dec, W_enc)
        ctx.act, ctx.backend = act, backend
        return pre_vals.clone()

    @staticmethod
    def backward(ctx, g):
        x, b_dec, W_enc = ctx.saved_tensors
        act, backend = ctx.act, ctx.backend
        g = g.contiguous()
        need_x, need_bdec, need_W, need_benc = ctx.needs_input_grad[:4]
        grad_x = grad_bdec = grad_W = grad_benc = None
        col_sum = None
        if need_benc or need_bdec:
            col_sum = torch.zeros(W_enc.shape[1], dtype=g.dtype, device=g.device).index_add_(0, act.cols, g)
            grad_benc = col_sum if need_benc else None
        if need_W:
            xc = (x - b_dec).contiguous()
            grad_W = scatter_outer(W_enc.shape[1], g, xc, act, backend=backend, transpose=True)
        if need_x:
            grad_x = gather_sum(W_enc.t().contiguous(), g, act, backend=backend)
        if need_bdec:
            grad_bdec = -(W_enc @ col_sum)
        return grad_x, grad_bdec, grad_W, grad_benc, None, None, None


class _SparseDecode(torch.autograd.Function):
    """``out[n] = sum_{m in row n} vals[m] * W_dec[cols[m]]`` (no bias)."""

    @staticmethod
    def forward(ctx, vals, W_dec, act, backend):
        ctx.save_for_backward(vals, W_dec)
        ctx.act, ctx.backend = act, backend
        return gather_sum(W_dec, vals, act, backend=backend)

    @staticmethod
    def backward(ctx, g):
        vals, W_dec = ctx.saved_tensors
        act, backend = ctx.act, ctx.backend
        g = g.contiguous()
        grad_vals = gather_dot(W_dec, g, act, backend=backend) if ctx.needs_input_grad[0] else None
        grad_W = scatter_outer(W_dec.shape[0], vals, g, act, backend=backend) if ctx.needs_input_grad[1] else None
        return grad_vals, grad_W, None, None


def sparse_encode(x: Float[torch.Tensor, "n d"], b_dec: torch.Tensor, W_enc: torch.Tensor, b_enc: torch.Tensor,
                  pre_vals: Float[torch.Tensor, " m"], act: Active, backend: str = "auto") -> Float[torch.Tensor, " m"]:
    """Differentiable pre-activations at ``act`` (``pre_vals`` from a no-grad dense pass); sparse backward."""
    return _SparseEncode.apply(x, b_dec, W_enc, b_enc, pre_vals, act, backend)


def sparse_decode(vals: Float[torch.Tensor, " m"], W_dec: Float[torch.Tensor, "L d"], act: Active,
                  backend: str = "auto") -> Float[torch.Tensor, "n d"]:
    """Differentiable ``sum vals * W_dec[cols]`` per row; sparse backward."""
    return _SparseDecode.apply(vals, W_dec, act, backend)
