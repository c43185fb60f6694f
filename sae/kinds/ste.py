"""Straight-through estimators of JumpReLU training (Rajamanoharan et al. 2024): a rectangle kernel of width
``bandwidth`` gives the threshold a gradient through the step's jump."""

from __future__ import annotations

import torch


def _rect(x: torch.Tensor) -> torch.Tensor:
    return ((x > -0.5) & (x < 0.5)).to(x.dtype)


class JumpReLUSTE(torch.autograd.Function):
    """``pre * (pre > threshold)``; straight-through gradient to the threshold."""

    @staticmethod
    def forward(ctx, pre, threshold, bandwidth):
        ctx.save_for_backward(pre, threshold)
        ctx.bw = bandwidth
        return pre * (pre > threshold).to(pre.dtype)

    @staticmethod
    def backward(ctx, g):
        pre, thr = ctx.saved_tensors
        bw = ctx.bw
        grad_pre = (pre > thr).to(g.dtype) * g
        grad_thr = -(thr / bw) * _rect((pre - thr) / bw) * g
        return grad_pre, grad_thr.reshape(-1, thr.shape[-1]).sum(0), None


class StepSTE(torch.autograd.Function):
    """Heaviside ``pre > threshold`` with a straight-through gradient to the threshold only."""

    @staticmethod
    def forward(ctx, pre, threshold, bandwidth):
        ctx.save_for_backward(pre, threshold)
        ctx.bw = bandwidth
        return (pre > threshold).to(pre.dtype)

    @staticmethod
    def backward(ctx, g):
        pre, thr = ctx.saved_tensors
        grad_thr = -(1.0 / ctx.bw) * _rect((pre - thr) / ctx.bw) * g
        return None, grad_thr.reshape(-1, thr.shape[-1]).sum(0), None
