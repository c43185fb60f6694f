"""One training forward pass: the kind's forward (:meth:`sae.kinds.Kind.train_forward`: reconstruction and its own
loss terms), the reconstruction MSE, and AuxK for dead latents.

An SAE reconstructs its input; a transcoder (``target`` given) predicts another activation from it: its encoder
reads ``x`` itself (``apply_b_dec_to_input=False``), ``b_dec`` lives in the target space and a skip ``x @ W_skip``
(if the model has one) is added to the prediction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from interp import distributed as dist
from sae.kinds.base import enc_shift
from sae.sparse_decoder import Active, sparse_decode, sparse_encode

if TYPE_CHECKING:
    from sae.model import SAE


@dataclass
class StepOut:
    loss: torch.Tensor
    mse: torch.Tensor
    aux: torch.Tensor
    sparsity: torch.Tensor
    x_hat: torch.Tensor
    fired: torch.Tensor   # [d_sae] bool: latent active somewhere in the batch
    l0: float
    terms: dict[str, torch.Tensor] = field(default_factory=dict)  # the kind's weighted loss terms (detached)
    stats: dict[str, Any] = field(default_factory=dict)  # what the kind's after_step reads

    @property
    def min_active(self) -> float | None:
        """BatchTopK's smallest active value (its threshold statistic), ``None`` for other kinds."""
        return self.stats.get("min_active")


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
        pv = sparse_encode(x, enc_shift(sae, x), sae.W_enc, sae.b_enc, vals.reshape(-1), act, backend=backend)
        e_hat = sparse_decode(torch.relu(pv), sae.W_dec, act, backend=backend)
    else:
        pre_g = (x - enc_shift(sae, x)) @ sae.W_enc + sae.b_enc
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
    """Loss of one batch ``x [B, d_in]`` (inputs already normalised) reconstructing ``target`` (default ``x``):
    MSE + the kind's terms + ``coeffs["aux"]`` AuxK. ``opts``: ``sparse``, ``backend``, ``k_aux``, ``bandwidth``,
    ``target_l0``. ``coeffs``: ``sparsity``, ``aux`` and ``preact`` weights for this step."""
    y = x if target is None else target
    kind = sae.kind
    out = kind.train_forward(sae, x, y, dead, coeffs, opts)
    x_hat = out.x_hat
    skip = getattr(sae, "W_skip", None)
    if skip is not None:
        x_hat = x_hat + x @ skip
    mse = (x_hat - y).pow(2).sum(-1).mean()
    aux = x.new_zeros(())
    if coeffs["aux"] > 0 and kind.aux_k and bool(dead.any()):
        aux = _aux_k(sae, x, y, out.pre, x_hat, dead, opts["k_aux"], out.sparse, opts["backend"])
    loss = mse + coeffs["aux"] * aux
    for t in out.terms.values():
        loss = loss + t
    sparsity = out.sparsity if out.sparsity is not None else x.new_zeros(())
    return StepOut(loss=loss, mse=mse.detach(), aux=aux.detach(), sparsity=sparsity, x_hat=x_hat.detach(),
                   fired=out.fired, l0=out.l0, terms={k: v.detach() for k, v in out.terms.items()}, stats=out.stats)
