"""Crosscoder kinds (Lindsey et al. 2024; Minder et al. 2025): one dictionary over ``n`` models' activations at a
site, read side by side (``d_in = n * d``, model ``m``'s block ``[m * d, (m + 1) * d)``); one encoder reads them all,
each latent has one decoder vector per model. Their sparsity weighs a latent by the SUM of its per-model decoder
norms (an L1 over models, so a latent used by one model alone is cheaper than a shared one):

- ``crosscoder_relu`` (the L1 crosscoder): ``relu(pre)``, penalty ``sum_j f_j sum_m ||d_j^m||``;
- ``crosscoder_batchtopk``: the ``B * k`` largest ``relu(pre_j) * sum_m ||d_j^m||`` of a batch of ``B`` rows kept
  (values ``relu(pre_j)``); at inference a JumpReLU on that same score at a threshold estimated while training.

The kinds need ``options["n_models"]`` (set by :class:`sae.crosscoder.Crosscoder`)."""

from __future__ import annotations

from typing import Any

import torch

from sae.kinds.base import KindOut, enc_shift
from sae.kinds.batchtopk import BatchTopKKind
from sae.kinds.relu import ReluKind
from sae.kinds.topk import active_stats, k_sparse_forward
from sae.sparse_decoder import Active


def n_models(cfg: Any) -> int:
    return int((cfg.options or {}).get("n_models", 0))


def model_norms(sae: Any) -> torch.Tensor:
    """Each latent's decoder norm in each model ``[d_sae, n_models]``."""
    n = n_models(sae.cfg)
    return sae.W_dec.reshape(sae.d_sae, n, sae.d_in // n).norm(dim=-1)


def check_cross(kind: Any, cfg: Any) -> None:
    n = n_models(cfg)
    if n < 2:
        raise ValueError(f"arch {kind.name!r} is a crosscoder: set options={{'n_models': 2}} (or build it with "
                         f"sae.crosscoder.Crosscoder / train_crosscoder)")
    if cfg.d_in % n:
        raise ValueError(f"a crosscoder over {n} models reads their activations side by side: d_in={cfg.d_in} must "
                         f"be a multiple of {n}")


class CrossReluKind(ReluKind):
    """The L1 crosscoder: ``relu(pre)``; penalty weighted by the sum of the per-model decoder norms."""

    name = "crosscoder_relu"
    transcoder = False
    saelens = None
    saelens_reads = ()
    saelens_transcoder = None
    circuit_tracer = None
    crosscoder = True

    def check(self, cfg: Any) -> None:
        check_cross(self, cfg)

    def penalty_norms(self, sae: Any) -> torch.Tensor:
        return model_norms(sae).sum(-1)


class CrossBatchTopKKind(BatchTopKKind):
    """BatchTopK on ``relu(pre) * sum_m ||d^m||``; inference keeps latents whose score passes ``threshold``."""

    name = "crosscoder_batchtopk"
    saelens = None
    saelens_reads = ()
    circuit_tracer = None
    crosscoder = True

    def check(self, cfg: Any) -> None:
        super().check(cfg)
        check_cross(self, cfg)

    def activate(self, sae: Any, pre: torch.Tensor) -> torch.Tensor:
        v = torch.relu(pre)
        return v * (v * model_norms(sae).sum(-1) > sae.threshold).to(pre.dtype)

    def train_forward(self, sae: Any, x: torch.Tensor, y: torch.Tensor, dead: torch.Tensor,
                      coeffs: dict[str, float], opts: dict[str, Any]) -> KindOut:
        with torch.no_grad():
            w = model_norms(sae).sum(-1)
            pre = (x - enc_shift(sae, x)) @ sae.W_enc + sae.b_enc
            flat = (torch.relu(pre) * w).reshape(-1)
            top = flat.topk(min(x.shape[0] * sae.cfg.k, flat.numel()), sorted=False)
            act = Active.from_flat(top.indices[top.values > 0], x.shape[0], sae.d_sae)
            pre_vals = pre.reshape(-1)[act.rows * sae.d_sae + act.cols]
        x_hat, v = k_sparse_forward(sae, x, act, pre, pre_vals, opts["sparse"], opts["backend"])
        fired, l0, on = active_stats(sae, act, v, x.shape[0])
        with torch.no_grad():
            score = v.detach() * w[act.cols]
            stats = {"min_active": float(score[on].min()) if bool(on.any()) else None}
        return KindOut(x_hat=x_hat, pre=pre, fired=fired, l0=l0, sparse=opts["sparse"], stats=stats)
