"""Matryoshka BatchTopK SAE (Bussmann et al. 2025; sae-lens ``matryoshka_batchtopk``): BatchTopK whose nested
prefixes of the dictionary, latents ``[0, w)`` for each width ``w`` in ``options["widths"]``, each reconstruct the
input; the loss sums the MSE of every prefix (the full width's is the main MSE). Saved as a sae-lens ``jumprelu``."""

from __future__ import annotations

from typing import Any

import torch

from sae.kinds.base import KindOut, enc_shift
from sae.kinds.batchtopk import BatchTopKKind
from sae.kinds.topk import active_stats


class MatryoshkaKind(BatchTopKKind):
    """BatchTopK plus one reconstruction loss per inner prefix width; ``options={"widths": [w1, w2, ..., d_sae]}``."""

    name = "matryoshka_batchtopk"
    k_sparse = False
    saelens_reads = ("matryoshka_batchtopk",)

    def check(self, cfg: Any) -> None:
        super().check(cfg)
        widths = [int(w) for w in cfg.options.get("widths") or []]
        if not widths:
            raise ValueError("arch 'matryoshka_batchtopk' needs options={'widths': [...]}: the nested prefix widths, "
                             f"e.g. [{max(1, cfg.d_sae // 8)}, {max(1, cfg.d_sae // 2)}, {cfg.d_sae}]")
        if widths[-1] != cfg.d_sae:
            widths.append(cfg.d_sae)  # the whole dictionary is the last level (as sae-lens adds it)
        if widths[0] <= 0 or any(b <= a for a, b in zip(widths, widths[1:])) or widths[-1] != cfg.d_sae:
            raise ValueError(f"matryoshka widths {cfg.options['widths']} must be positive, strictly increasing and at "
                             f"most d_sae={cfg.d_sae}")
        cfg.options["widths"] = widths

    def from_saelens(self, cfg: dict[str, Any], md: dict[str, Any]) -> tuple[int | None, dict[str, Any]]:
        k, options = super().from_saelens(cfg, md)
        if "widths" not in options and cfg.get("matryoshka_widths"):
            options["widths"] = [int(w) for w in cfg["matryoshka_widths"]]  # a sae-lens training checkpoint
        return k, options

    def train_forward(self, sae: Any, x: torch.Tensor, y: torch.Tensor, dead: torch.Tensor,
                      coeffs: dict[str, float], opts: dict[str, Any]) -> KindOut:
        pre_g = (x - enc_shift(sae, x)) @ sae.W_enc + sae.b_enc
        with torch.no_grad():
            pre = pre_g.detach().clone()
            act, _ = self.select(sae, pre)
        v = torch.relu(pre_g[act.rows, act.cols])
        z = torch.zeros_like(pre_g).index_put((act.rows, act.cols), v)
        fired, l0, on = active_stats(sae, act, v, x.shape[0])
        out, prev, terms = sae.b_dec, 0, {}
        for w in sae.cfg.options["widths"]:
            out = out + z[:, prev:w] @ sae.W_dec[prev:w]
            if w < sae.d_sae:
                terms[f"inner_mse_{w}"] = (out - y).pow(2).sum(-1).mean()
            prev = w
        return KindOut(x_hat=out, pre=pre, fired=fired, l0=l0, terms=terms, stats=self.stats(v, on))
