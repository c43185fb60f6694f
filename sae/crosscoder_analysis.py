"""Reading a crosscoder for model diffing: per-latent decoder-norm ratios, latent scaling (Minder et al. 2025), the
classes they give (fine-tune-only, base-only, shared), latent activations on tokens of both models and top contexts.

Models are indexed as the crosscoder reads them: ``base`` (0) and ``tuned`` (1) by default.

Norm ratio: ``r_j = ||d_j^tuned|| / (||d_j^base|| + ||d_j^tuned||)`` (1: the latent writes only in the fine-tuned
model, 0: only in the base, 0.5: equally).

Latent scaling: for latent ``j`` with decoder vector ``d`` (default its fine-tuned-model vector ``d_j^tuned``) and a
target ``t_m`` in model ``m``, ``beta_m = argmin_b sum_tokens ||t_m - b f_j d||^2
= sum f_j <d, t_m> / (||d||^2 sum f_j^2)``. Two targets: ``error`` ``t_m = x_m - x_hat_m + f_j d_j^m`` (what the other
latents leave unexplained in model m, plus j's own part) and ``reconstruction`` ``t_m = x_hat_m - f_j d_j^m`` (what
the other latents write). ``nu = beta_base / beta_tuned`` per target: a truly fine-tune-only latent has both near 0;
a high ``nu_error`` says the base still carries the direction in its error (latent decoupling), a high
``nu_reconstruction`` that other latents write it in the base (complete shrinkage).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from sae.contexts import Context, window_context
from sae.crosscoder import Crosscoder, check_models

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Classes:
    """Thresholds on the norm ratio: ``>= tuned_only`` fine-tune-only, ``<= base_only`` base-only, within
    ``shared`` shared, else ``other``; a fine-tune-only latent is ``true`` when both its ``nu`` are below ``nu_max``."""

    tuned_only: float = 0.9
    base_only: float = 0.1
    shared: tuple[float, float] = (0.4, 0.6)
    nu_max: float = 0.3

    def __post_init__(self) -> None:
        lo, hi = self.shared
        if not 0 <= self.base_only < lo <= hi < self.tuned_only <= 1:
            raise ValueError(f"thresholds must satisfy 0 <= base_only < shared[0] <= shared[1] < tuned_only <= 1, got "
                             f"base_only={self.base_only}, shared={self.shared}, tuned_only={self.tuned_only}")


def norm_ratios(cc: Crosscoder, tuned: int = 1, base: int = 0) -> torch.Tensor:
    """``||d^tuned|| / (||d^base|| + ||d^tuned||)`` per latent ``[d_sae]`` (NaN where both are zero)."""
    n = cc.decoder_norms().detach().float()
    tot = n[:, base] + n[:, tuned]
    return torch.where(tot > 0, n[:, tuned] / tot.clamp_min(1e-30), torch.full_like(tot, float("nan")))


def classify(ratios: torch.Tensor, classes: Classes | None = None) -> list[str]:
    """``tuned-only`` / ``base-only`` / ``shared`` / ``other`` per latent (``dead`` where the ratio is NaN)."""
    c = classes or Classes()
    out = []
    for r in ratios.tolist():
        if r != r:
            out.append("dead")
        elif r >= c.tuned_only:
            out.append("tuned-only")
        elif r <= c.base_only:
            out.append("base-only")
        elif c.shared[0] <= r <= c.shared[1]:
            out.append("shared")
        else:
            out.append("other")
    return out


@torch.no_grad()
def encode_pairs(cc: Crosscoder, xs: Sequence[torch.Tensor], batch_size: int = 4096) -> torch.Tensor:
    """Latents ``[n, d_sae]`` of token rows ``xs`` (one ``[n, d]`` per model)."""
    n = xs[0].shape[0]
    return torch.cat([cc.encode(cc.join(*(x[i:i + batch_size].to(cc.device) for x in xs))).float().cpu()
                      for i in range(0, n, batch_size)]) if n else torch.zeros(0, cc.d_sae)


@dataclass
class LatentScaling(Result):
    """``beta [len(latents), 2 targets, n_models]`` (targets: ``error``, ``reconstruction``) and the ratios
    ``nu_error``, ``nu_reconstruction`` (base over tuned) of ``latents``; ``n_active``: tokens where each fired."""

    latents: list[int]
    beta: torch.Tensor
    n_active: torch.Tensor
    base: int = 0
    tuned: int = 1

    @property
    def nu_error(self) -> torch.Tensor:
        return self.beta[:, 0, self.base] / self.beta[:, 0, self.tuned]

    @property
    def nu_reconstruction(self) -> torch.Tensor:
        return self.beta[:, 1, self.base] / self.beta[:, 1, self.tuned]

    def summary(self) -> dict[str, Any]:
        return {"latents": len(self.latents), "median_nu_error": float(self.nu_error.nanmedian()),
                "median_nu_reconstruction": float(self.nu_reconstruction.nanmedian())}

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame({"latent": self.latents, "nu_error": self.nu_error.tolist(),
                             "nu_reconstruction": self.nu_reconstruction.tolist(), "n_active": self.n_active.tolist()})

    def plot(self, title: str = "latent scaling") -> Any:
        from interp.viz.sae import latent_bars

        return latent_bars(self.latents, {"nu error": self.nu_error.tolist(),
                                          "nu reconstruction": self.nu_reconstruction.tolist()}, title=title,
                           yaxis="beta base / beta tuned")


@torch.no_grad()
def latent_scaling(cc: Crosscoder, xs: Sequence[torch.Tensor], latents: Sequence[int], decoder_of: int = 1,
                   batch_size: int = 4096, base: int = 0, tuned: int = 1) -> LatentScaling:
    """Latent scaling (module docstring) of ``latents`` over token rows ``xs`` (one ``[n, d]`` per model, same
    tokens), with each latent's decoder vector in model ``decoder_of``. Closed-form least squares, accumulated in
    float64 over batches."""
    idx = torch.as_tensor(list(latents), dtype=torch.long)
    if idx.numel() == 0:
        raise ValueError("no latents given")
    if int(idx.min()) < 0 or int(idx.max()) >= cc.d_sae:
        raise ValueError(f"latents must be in 0..{cc.d_sae - 1}")
    D = cc.decoders().detach().double().cpu()[idx]           # [J, n, d]
    d = D[:, decoder_of]                                      # [J, d]
    own = (D * d[:, None]).sum(-1)                            # [J, n]: <d, d_j^m>
    J, n = len(idx), cc.n_models
    num = torch.zeros(J, 2, n, dtype=torch.float64)
    f2 = torch.zeros(J, dtype=torch.float64)
    count = torch.zeros(J, dtype=torch.long)
    N = xs[0].shape[0]
    for i in range(0, N, batch_size):
        x = cc.join(*(t[i:i + batch_size].to(cc.device) for t in xs))
        z = cc.encode(x)
        rec = cc.decode(z).double().cpu().unflatten(-1, (n, cc.d_model))          # [B, n, d]
        x = x.double().cpu().unflatten(-1, (n, cc.d_model))
        f = z.double().cpu()[:, idx]                                               # [B, J]
        err_proj = torch.einsum("bmd,jd->bjm", x - rec, d)                         # <d, x_m - x_hat_m>
        rec_proj = torch.einsum("bmd,jd->bjm", rec, d)
        sq = (f * f).sum(0)
        num[:, 0] += (f[..., None] * err_proj).sum(0) + sq[:, None] * own
        num[:, 1] += (f[..., None] * rec_proj).sum(0) - sq[:, None] * own
        f2 += sq
        count += (f > 0).sum(0)
    den = (d * d).sum(-1) * f2                                                     # [J]
    beta = torch.where(den[:, None, None] > 0, num / den.clamp_min(1e-300)[:, None, None],
                       torch.full_like(num, float("nan")))
    return LatentScaling(idx.tolist(), beta.float(), count, base=base, tuned=tuned)


@torch.no_grad()
def cross_contexts(models: Sequence[Any], cc: Crosscoder, latents: Sequence[int], prompts: Any, top: int = 5,
                   window: tuple[int, int] = (12, 4), batch_size: int = 8) -> dict[int, list[Context]]:
    """Per latent, the ``top`` prompts where it fires hardest (read in both models on the same tokens), one
    :class:`~sae.contexts.Context` per prompt at its peak token (tokens from the first model's tokenizer)."""
    from sae.runner import site_tokens

    check_models(*models)
    if cc.site is None:
        raise ValueError("this crosscoder does not record its site")
    idx = torch.as_tensor(list(latents), dtype=torch.long)
    per: list[tuple[torch.Tensor, torch.Tensor]] = []
    for (xa, b), (xb, _) in zip(site_tokens(models[0], cc.site, prompts, batch_size),
                                site_tokens(models[1], cc.site, prompts, batch_size)):
        z = cc.encode(cc.join(xa.to(cc.device), xb.to(cc.device)))[..., idx.to(cc.device)].float().cpu()
        for i in range(xa.shape[0]):
            m = b.attention_mask[i].bool()
            per.append((b.input_ids[i].cpu()[m], z[i][m]))
    out: dict[int, list[Context]] = {}
    for col, lat in enumerate(idx.tolist()):
        peaks = sorted(((float(a[:, col].max()), p, int(a[:, col].argmax())) for p, (_, a) in enumerate(per)
                        if a.numel()), key=lambda t: -t[0])[:top]
        out[lat] = []
        for val, p, pos in peaks:
            if val <= 0:
                break
            out[lat].append(window_context(models[0].tokenizer, per[p][0], per[p][1][:, col], p, pos, window))
    return out


@dataclass
class CrossDiff(Result):
    """A crosscoder read for model diffing: ``ratios [d_sae]``, ``classes`` per latent, firing ``freq [d_sae]`` on
    the tokens read, and the latent scaling of the fine-tune-only latents (``scaling``, may be ``None``)."""

    ratios: torch.Tensor
    classes: list[str]
    freq: torch.Tensor
    scaling: LatentScaling | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.classes:
            out[c] = out.get(c, 0) + 1
        return out

    def of(self, cls: str) -> list[int]:
        return [i for i, c in enumerate(self.classes) if c == cls]

    def true_tuned_only(self, nu_max: float | None = None) -> list[int]:
        """Fine-tune-only latents whose ``nu_error`` and ``nu_reconstruction`` are both below ``nu_max``."""
        if self.scaling is None:
            return []
        cap = Classes().nu_max if nu_max is None else nu_max
        s = self.scaling
        ok = (s.nu_error.abs() < cap) & (s.nu_reconstruction.abs() < cap)
        return [lat for lat, k in zip(s.latents, ok.tolist()) if k]

    def summary(self) -> dict[str, Any]:
        return {"counts": self.counts(), "true_tuned_only": len(self.true_tuned_only()),
                **({"scaling": self.scaling.summary()} if self.scaling is not None else {})}

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame({"latent": range(len(self.classes)), "ratio": self.ratios.tolist(), "class": self.classes,
                             "freq": self.freq.tolist()})

    def plot(self, title: str = "decoder norm ratio (tuned / (base + tuned))") -> Any:
        from interp.viz.sae import frequency_histogram

        r = self.ratios[~self.ratios.isnan()]
        return frequency_histogram(r, title=title)


def cross_diff(cc: Crosscoder, xs: Sequence[torch.Tensor], classes: Classes | None = None,
               batch_size: int = 4096) -> CrossDiff:
    """Norm ratios and classes of every latent, firing frequencies on the token rows ``xs`` and latent scaling of the
    fine-tune-only latents that fire there."""
    r = norm_ratios(cc)
    cls = classify(r, classes)
    z = encode_pairs(cc, xs, batch_size)
    freq = (z > 0).float().mean(0) if len(z) else torch.zeros(cc.d_sae)
    only = [i for i, c in enumerate(cls) if c == "tuned-only" and freq[i] > 0]
    scaling = latent_scaling(cc, xs, only, batch_size=batch_size) if only else None
    return CrossDiff(r, cls, freq, scaling, meta={"tokens": int(xs[0].shape[0])})


__all__ = ["Classes", "CrossDiff", "LatentScaling", "classify", "cross_contexts", "cross_diff", "latent_scaling",
           "norm_ratios"]
