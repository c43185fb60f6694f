"""One training forward pass per architecture: reconstruction, sparsity penalty and AuxK for dead latents.

An SAE reconstructs its input; a transcoder (``target`` given) predicts another activation from it: its encoder
reads ``x`` itself (``apply_b_dec_to_input=False``), ``b_dec`` lives in the target space and a skip ``x @ W_skip``
(if the model has one) is added to the prediction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from interp import distributed as dist
from sae.model import SAE
from sae.sparse_decoder import Active, sparse_decode, sparse_encode


def _rect(x: torch.Tensor) -> torch.Tensor:
    return ((x > -0.5) & (x < 0.5)).to(x.dtype)


class _JumpReLU(torch.autograd.Function):
    """``pre * (pre > threshold)``; straight-through gradient to the threshold (Rajamanoharan et al. 2024)."""

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


class _Step(torch.autograd.Function):
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


@dataclass
class StepOut:
    loss: torch.Tensor
    mse: torch.Tensor
    aux: torch.Tensor
    sparsity: torch.Tensor
    x_hat: torch.Tensor
    fired: torch.Tensor   # [d_sae] bool: latent active somewhere in the batch
    l0: float
    min_active: float | None = None  # smallest positive latent value (BatchTopK threshold statistic)


def _enc_shift(sae: SAE, x: torch.Tensor) -> torch.Tensor:
    """What the encoder subtracts from its input: ``b_dec``, or zeros where it reads ``x`` itself."""
    return sae.b_dec if sae.cfg.apply_b_dec_to_input else x.new_zeros(x.shape[-1])


def _aux_k(sae: SAE, x: torch.Tensor, y: torch.Tensor, pre: torch.Tensor, x_hat: torch.Tensor, dead: torch.Tensor,
           k_aux: int, sparse: bool, backend: str) -> torch.Tensor:
    """AuxK (Gao et al. 2024): the top ``k_aux`` dead latents of input ``x`` reconstruct the residual of the
    prediction ``x_hat`` of ``y``; normalised MSE."""
    n_dead = int(dead.sum())
    if n_dead == 0 or k_aux <= 0:
        return x.new_zeros(())
    k = min(k_aux, n_dead)
    masked = pre.masked_fill_(~dead, float("-inf"))  # pre is not needed after this point
    vals, idx = masked.topk(k, dim=-1, sorted=False)
    resid = (y - x_hat).detach()
    if sparse:
        act = Active.from_topk(idx)
        pv = sparse_encode(x, _enc_shift(sae, x), sae.W_enc, sae.b_enc, vals.reshape(-1), act, backend=backend)
        e_hat = sparse_decode(torch.relu(pv), sae.W_dec, act, backend=backend)
    else:
        pre_g = (x - _enc_shift(sae, x)) @ sae.W_enc + sae.b_enc
        z = torch.zeros_like(pre_g).scatter(-1, idx, torch.relu(pre_g.gather(-1, idx)))
        e_hat = z @ sae.W_dec
    return (e_hat - resid).pow(2).sum(-1).mean() / _batch_variance(resid).clamp_min(1e-12)


def _batch_variance(r: torch.Tensor) -> torch.Tensor:
    """``E ||r - E r||^2`` over the batch; data parallel, over the global batch (every rank's rows), so AuxK's
    normaliser is the one a single process would use (``r`` carries no gradient)."""
    if not dist.active():
        return (r - r.mean(0)).pow(2).sum(-1).mean()
    n = r.shape[0] * dist.world_size()
    mean = dist.all_reduce_(r.sum(0)) / n
    return dist.all_reduce_((r - mean).pow(2).sum()) / n


def train_step(sae: SAE, x: torch.Tensor, dead: torch.Tensor, coeffs: dict[str, float], opts: dict[str, Any],
               target: torch.Tensor | None = None) -> StepOut:
    """Loss of one batch ``x [B, d_in]`` (inputs already normalised) reconstructing ``target`` (default ``x``).
    ``opts``: ``sparse``, ``backend``, ``k_aux``, ``bandwidth``, ``target_l0``. ``coeffs``: ``sparsity`` and
    ``aux`` weights for this step."""
    y = x if target is None else target
    arch, sparse, backend = sae.arch, opts["sparse"], opts["backend"]
    zero = x.new_zeros(())
    min_active = None
    sparsity = preact = zero
    if arch in ("topk", "batchtopk"):
        pre, x_hat, fired, l0, min_active = _k_sparse_forward(sae, x, sparse, backend)
    else:
        pre, x_hat, fired, l0, sparsity, preact = _penalised_forward(sae, x, dead, coeffs, opts)
    skip = getattr(sae, "W_skip", None)
    if skip is not None:
        x_hat = x_hat + x @ skip
    mse = (x_hat - y).pow(2).sum(-1).mean()
    aux = zero
    if coeffs["aux"] > 0 and bool(dead.any()):
        aux = _aux_k(sae, x, y, pre, x_hat, dead, opts["k_aux"], sparse and arch in ("topk", "batchtopk"), backend)
    loss = mse + coeffs["sparsity"] * sparsity + coeffs["aux"] * aux + coeffs.get("preact", 0.0) * preact
    return StepOut(loss=loss, mse=mse.detach(), aux=aux.detach(), sparsity=sparsity.detach(), x_hat=x_hat.detach(),
                   fired=fired, l0=l0, min_active=min_active)


def _k_sparse_forward(sae: SAE, x: torch.Tensor, sparse: bool, backend: Any
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, float | None]:
    """TopK / BatchTopK: pick the active latents without grad, then encode/decode only those (sparse kernels
    or a dense scatter). Returns ``pre`` (no grad), ``x_hat``, latents fired, L0 and the smallest active value."""
    arch, B = sae.arch, x.shape[0]
    min_active = None
    shift = _enc_shift(sae, x)
    with torch.no_grad():
        pre = (x - shift) @ sae.W_enc + sae.b_enc
        if arch == "topk":
            vals, idx = pre.topk(sae.cfg.k, dim=-1, sorted=False)
            act = Active.from_topk(idx)
            pre_vals = vals.reshape(-1)
        else:
            flat = torch.relu(pre).reshape(-1)
            top = flat.topk(min(B * sae.cfg.k, flat.numel()), sorted=False)
            keep = top.indices[top.values > 0]
            act = Active.from_flat(keep, B, sae.d_sae)
            pre_vals = pre.reshape(-1)[act.rows * sae.d_sae + act.cols]
    if sparse:
        pv = sparse_encode(x, shift, sae.W_enc, sae.b_enc, pre_vals, act, backend=backend)
        v = torch.relu(pv)
        x_hat = sparse_decode(v, sae.W_dec, act, backend=backend) + sae.b_dec
    else:
        pre_g = (x - shift) @ sae.W_enc + sae.b_enc
        v = torch.relu(pre_g[act.rows, act.cols])
        z = torch.zeros_like(pre_g).index_put((act.rows, act.cols), v)
        x_hat = z @ sae.W_dec + sae.b_dec
    with torch.no_grad():
        on = v > 0
        fired = torch.zeros(sae.d_sae, dtype=torch.bool, device=x.device)
        fired[act.cols[on]] = True
        l0 = float(on.sum()) / B
        if arch == "batchtopk" and bool(on.any()):
            min_active = float(v[on].min())
    return pre, x_hat, fired, l0, min_active


def _penalised_forward(sae: SAE, x: torch.Tensor, dead: torch.Tensor, coeffs: dict[str, float], opts: dict[str, Any]
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, torch.Tensor, torch.Tensor]:
    """ReLU (L1 penalty) / JumpReLU (L0 penalty, straight-through): dense forward with its sparsity terms.
    Returns ``pre`` (detached copy), ``x_hat``, latents fired, L0, the sparsity and the pre-activation terms."""
    preact = x.new_zeros(())
    pre = (x - _enc_shift(sae, x)) @ sae.W_enc + sae.b_enc
    if sae.arch == "relu":
        z = torch.relu(pre)
        sparsity = z.sum(-1).mean()  # decoder rows are unit norm, so this is Anthropic's sum |z| ||W_dec||
    else:
        thr = sae.threshold
        z = _JumpReLU.apply(pre, thr, opts["bandwidth"])
        l0_per = _Step.apply(pre, thr, opts["bandwidth"]).sum(-1)
        target = opts.get("target_l0")
        if target:
            sparsity = (l0_per.mean() / target - 1.0).pow(2) * target
        else:
            sparsity = l0_per.mean()
        if coeffs.get("preact", 0) > 0 and bool(dead.any()):
            # dead latents: pull pre-activations up to (and thresholds down to) the jump (Anthropic 2025)
            preact = (torch.relu(thr - pre) * dead).sum(-1).mean()
    x_hat = z @ sae.W_dec + sae.b_dec
    with torch.no_grad():
        on = z > 0
        fired = on.any(0)
        l0 = float(on.sum()) / x.shape[0]
    return pre.detach().clone(), x_hat, fired, l0, sparsity, preact
