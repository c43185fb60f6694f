"""The residual edit as one low-rank affine map, and its dispatch (Triton on CUDA, torch elsewhere).

Every edit this package makes to a residual-width activation has the form

    y = x + g * (b - U^T (W x))        U, W: [k, d]   b: [d]   g in {0, 1} per token

Projecting out an orthonormal basis Q is ``U = W = Q``; clamping the projection on unit ``r`` to ``c``
is ``U = W = r, b = c r``; adding ``alpha v`` is ``k = 0, b = alpha v``. A sequence of such edits is
again of this form (:meth:`LowRankEdit.then`), so a whole stack of interventions at one site runs as one
pass over the activations. The gate ``g`` is a per-token mask and/or a condition ``x.c > t`` (or ``<``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from jaxtyping import Bool, Float
from torch import Tensor

TRITON_MAX_K = 16


@dataclass(eq=False)
class LowRankEdit:
    """``x -> x + b - U^T (W x)``; ``U, W [k, d]`` (k may be 0), ``b [d]`` or None. Stored in float32 or 64."""

    U: Tensor
    W: Tensor
    b: Tensor | None = None
    _moved: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.U.shape != self.W.shape or self.U.dim() != 2:
            raise ValueError(f"U and W must both be [k, d], got {tuple(self.U.shape)} and {tuple(self.W.shape)}")
        if self.b is not None and self.b.shape != (self.d,):
            raise ValueError(f"b must be [d={self.d}], got {tuple(self.b.shape)}")

    @property
    def k(self) -> int:
        return self.U.shape[0]

    @property
    def d(self) -> int:
        return self.U.shape[1]

    @classmethod
    def project_out(cls, Q: Float[Tensor, "k d"]) -> LowRankEdit:
        """Remove the span of the orthonormal rows of ``Q``."""
        Q = Q.float() if Q.dtype != torch.float64 else Q
        return cls(Q, Q.clone())

    @classmethod
    def clamp(cls, r: Float[Tensor, " d"], value: float) -> LowRankEdit:
        """Set the projection on unit ``r`` to ``value``."""
        r = r.float() if r.dtype != torch.float64 else r
        return cls(r[None], r[None].clone(), value * r)

    @classmethod
    def add(cls, v: Float[Tensor, " d"]) -> LowRankEdit:
        v = v.float() if v.dtype != torch.float64 else v
        empty = v.new_zeros(0, v.shape[0])
        return cls(empty, empty.clone(), v.clone())

    def then(self, other: LowRankEdit) -> LowRankEdit:
        """The edit ``other(self(x))`` as one map (rank adds up)."""
        if other.d != self.d:
            raise ValueError(f"cannot compose edits of widths {self.d} and {other.d}")
        dt = torch.promote_types(self.U.dtype, other.U.dtype)
        U1, W1, U2, W2 = (t.to(dt) for t in (self.U, self.W, other.U, other.W))
        U = torch.cat([U1, U2])
        W = torch.cat([W1, W2 - (W2 @ U1.T) @ W1])
        b = None
        if self.b is not None or other.b is not None:
            b = torch.zeros(self.d, dtype=dt)
            if self.b is not None:
                b1 = self.b.to(dt)
                b = b + b1 - U2.T @ (W2 @ b1)
            if other.b is not None:
                b = b + other.b.to(dt)
        return LowRankEdit(U, W, b)

    def on(self, device: torch.device) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(U, W, b)`` as contiguous float32 on ``device`` (cached)."""
        got = self._moved.get(device)
        if got is None:
            got = self._moved[device] = tuple(None if t is None else t.to(device, torch.float32).contiguous()
                                              for t in (self.U, self.W, self.b))
        return got


def pick_backend(x: Tensor, k: int, backend: str = "auto") -> str:
    """``triton`` for CUDA tensors with ``k <= 16`` when Triton imports, else ``torch``."""
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    if backend != "auto":
        return backend
    if x.is_cuda and k <= TRITON_MAX_K:
        from steering.kernels import triton_available

        if triton_available():
            return "triton"
    return "torch"


def apply_edit(x: Float[Tensor, "... d"], U: Float[Tensor, "k d"] | None, W: Float[Tensor, "k d"] | None,
               b: Float[Tensor, " d"] | None = None, row_mask: Bool[Tensor, "..."] | None = None,
               cond: Float[Tensor, " d"] | None = None, threshold: float = 0.0, above: bool = True,
               backend: str = "auto") -> Float[Tensor, "... d"]:
    """``x + g * (b - U^T (W x))`` over the last dim, out of place; ``g = row_mask & (x.cond >|< threshold)``.

    ``x``: fp32/bf16/fp16/fp64 ``[..., d]``; ``row_mask``: bool over ``x.shape[:-1]``. Math in float32.
    """
    d = x.shape[-1]
    if U is None:
        U = W = x.new_zeros(0, d, dtype=torch.float32)
    if U.shape[-1] != d or W is None or W.shape != U.shape:
        raise ValueError(f"U/W must be [k, {d}] and match; got {tuple(U.shape)} and "
                         f"{None if W is None else tuple(W.shape)}")
    if b is not None and b.shape != (d,):
        raise ValueError(f"b must be [{d}], got {tuple(b.shape)}")
    if row_mask is not None and row_mask.shape != x.shape[:-1]:
        raise ValueError(f"row_mask must have shape {tuple(x.shape[:-1])}, got {tuple(row_mask.shape)}")
    if U.shape[0] == 0 and b is None:
        return x
    which = pick_backend(x, U.shape[0], backend)
    if which == "triton":
        from steering.kernels import edit_triton

        return edit_triton(x, U, W, b, row_mask, cond, threshold, above)
    return edit_torch(x, U, W, b, row_mask, cond, threshold, above)


def edit_torch(x: Tensor, U: Tensor, W: Tensor, b: Tensor | None, row_mask: Tensor | None, cond: Tensor | None,
               threshold: float, above: bool) -> Tensor:
    """The reference implementation (float32 math, or float64 for float64 input)."""
    shape, d = x.shape, x.shape[-1]
    x2 = x.reshape(-1, d)
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x2 if x2.dtype == cdt else x2.to(cdt)
    U, W = U.to(xf.device, cdt), W.to(xf.device, cdt)
    y = torch.addmm(xf, xf @ W.T, U, alpha=-1) if U.shape[0] else xf
    if b is not None:
        y = y + b.to(xf.device, cdt)
    gate = None if row_mask is None else row_mask.reshape(-1).to(xf.device)
    if cond is not None:
        proj = xf @ cond.to(xf.device, cdt)
        g = proj > threshold if above else proj < threshold
        gate = g if gate is None else gate & g
    if gate is not None:
        y = torch.where(gate[:, None], y, xf)
    return y.to(x.dtype).reshape(shape)
