"""TopK SAE (Gao et al. 2024): the ``k`` largest pre-activations of each row, their positive part; trained through
the sparse encode/decode kernels (only the selected latents are computed)."""

from __future__ import annotations

from typing import Any

import torch

from sae.kinds.base import Kind, KindOut, enc_shift
from sae.sparse_decoder import Active, sparse_decode, sparse_encode


def k_sparse_forward(sae: Any, x: torch.Tensor, act: Active, pre: torch.Tensor, pre_vals: torch.Tensor,
                     sparse: bool, backend: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode / decode only the selected latents ``act`` (sparse kernels or a dense scatter): ``(x_hat, values)``."""
    shift = enc_shift(sae, x)
    if sparse:
        v = torch.relu(sparse_encode(x, shift, sae.W_enc, sae.b_enc, pre_vals, act, backend=backend))
        return sparse_decode(v, sae.W_dec, act, backend=backend) + sae.b_dec, v
    pre_g = (x - shift) @ sae.W_enc + sae.b_enc
    v = torch.relu(pre_g[act.rows, act.cols])
    z = torch.zeros_like(pre_g).index_put((act.rows, act.cols), v)
    return z @ sae.W_dec + sae.b_dec, v


def active_stats(sae: Any, act: Active, v: torch.Tensor, B: int) -> tuple[torch.Tensor, float, torch.Tensor]:
    """Latents fired ``[d_sae]``, mean L0 and the mask of selected entries that are positive."""
    with torch.no_grad():
        on = v > 0
        fired = torch.zeros(sae.d_sae, dtype=torch.bool, device=v.device)
        fired[act.cols[on]] = True
        return fired, float(on.sum()) / B, on


class TopKKind(Kind):
    """Per row, the top ``k`` pre-activations kept (their positive part), the rest zero (sae-lens ``topk``)."""

    name = "topk"
    needs_k = True
    k_sparse = True
    transcoder = True
    saelens = "topk"
    saelens_reads = ("topk",)
    circuit_tracer = "topk"

    def activate(self, sae: Any, pre: torch.Tensor) -> torch.Tensor:
        vals, idx = pre.topk(sae.cfg.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter_(-1, idx, torch.relu(vals))

    def select(self, sae: Any, pre: torch.Tensor) -> tuple[Active, torch.Tensor]:
        """The latents a training batch keeps (no grad) and their pre-activations, flat."""
        vals, idx = pre.topk(sae.cfg.k, dim=-1, sorted=False)
        return Active.from_topk(idx), vals.reshape(-1)

    def train_forward(self, sae: Any, x: torch.Tensor, y: torch.Tensor, dead: torch.Tensor,
                      coeffs: dict[str, float], opts: dict[str, Any]) -> KindOut:
        with torch.no_grad():
            pre = (x - enc_shift(sae, x)) @ sae.W_enc + sae.b_enc
            act, pre_vals = self.select(sae, pre)
        x_hat, v = k_sparse_forward(sae, x, act, pre, pre_vals, opts["sparse"], opts["backend"])
        fired, l0, on = active_stats(sae, act, v, x.shape[0])
        dense = None
        if opts.get("latents") and not opts["sparse"]:
            dense = torch.zeros_like(pre).index_put((act.rows, act.cols), v)
        return KindOut(x_hat=x_hat, pre=pre, fired=fired, l0=l0, sparse=opts["sparse"],
                       stats=self.stats(v, on), latents=dense)

    def stats(self, v: torch.Tensor, on: torch.Tensor) -> dict[str, Any]:
        return {}

    def saelens_config(self, sae: Any) -> dict[str, Any]:
        return {"k": int(sae.cfg.k), "rescale_acts_by_decoder_norm": False}
