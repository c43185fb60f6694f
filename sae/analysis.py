"""Find latents: aligned with a direction, separating two prompt sets, changed by fine-tuning."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float

from interp.bundle import Result
from interp.coerce import token_rows
from interp.evals.metrics import auroc
from interp.forward import Inputs
from sae.model import SAE

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class LatentRanking(Result):
    """Latents ranked best first: ``indices [top]`` and their ``scores [top]``; ``all_scores [d_sae]``."""

    indices: torch.Tensor
    scores: torch.Tensor
    all_scores: torch.Tensor
    what: str = ""

    def __iter__(self):
        return iter(zip(self.indices.tolist(), self.scores.tolist()))

    def __len__(self) -> int:
        return len(self.indices)

    def summary(self) -> dict[str, Any]:
        """What was ranked, over how many latents, and the top ten with their scores."""
        return {"what": self.what, "n_latents": self.all_scores.numel(), "top": self.indices[:10].tolist(),
                "top_scores": self.scores[:10].tolist()}

    def to_frame(self) -> pd.DataFrame:
        """One row per ranked latent: ``rank`` (0 = best), ``latent`` and ``score`` (what ``what`` names)."""
        import pandas as pd

        return pd.DataFrame({"rank": range(len(self)), "latent": self.indices.tolist(),
                             "score": self.scores.tolist()})

    def plot(self, title: str | None = None) -> Any:
        """Bars of the ranked latents' scores, best first."""
        from interp.viz.sae import latent_bars

        return latent_bars(self.indices.tolist(), {self.what or "score": self.scores.tolist()},
                           title=title or f"latents ranked by {self.what or 'score'}", yaxis=self.what or "score")


def _per_latent(ranking: LatentRanking, **cols: torch.Tensor) -> Any:
    """A frame with one row per latent (``latent``, the given ``[d_sae]`` columns, ``rank``: nullable, set for
    the ranked latents only)."""
    import pandas as pd

    n = next(iter(cols.values())).numel()
    frame = pd.DataFrame({"latent": range(n), **{k: v.tolist() for k, v in cols.items()}})
    rank = pd.Series(pd.NA, index=frame.index, dtype="Int64")
    rank.iloc[ranking.indices.tolist()] = list(range(len(ranking)))
    frame["rank"] = rank
    return frame


def _as_vector(direction: Any, d: int) -> torch.Tensor:
    v = direction
    for attr in ("vector", "unit", "direction"):
        if not isinstance(v, torch.Tensor) and hasattr(v, attr):
            v = getattr(v, attr)
            v = v() if callable(v) else v
    v = torch.as_tensor(v).detach().float().reshape(-1)
    if v.numel() != d:
        raise ValueError(f"direction has {v.numel()} entries but the SAE reads width {d}; take the direction of "
                         f"the SAE's site/layer")
    if not torch.isfinite(v).all() or float(v.norm()) == 0:
        raise ValueError("direction is zero or not finite")
    return v


@torch.no_grad()
def aligned_latents(sae: SAE, direction: Float[torch.Tensor, " d"] | Any, top: int = 10, use: str = "decoder",
                    absolute: bool = False) -> LatentRanking:
    """Latents whose decoder (or encoder) vector has the largest cosine with ``direction`` ``[d_in]``."""
    v = _as_vector(direction, sae.d_in).to(sae.device)
    if use == "decoder":
        W = sae.W_dec.float()
    elif use == "encoder":
        W = sae.W_enc.T.float()
    else:
        raise ValueError(f"use must be 'decoder' or 'encoder', got {use!r}")
    cos = (W @ v) / (W.norm(dim=1).clamp_min(1e-12) * v.norm())
    key = cos.abs() if absolute else cos
    order = key.argsort(descending=True)[: min(top, sae.d_sae)]
    return LatentRanking(order.cpu(), cos[order].cpu(), cos.cpu(), what=f"{use} cosine")


def encode_tokens(sae: SAE, x: torch.Tensor | Any, batch_size: int = 4096, site: str | None = None) -> torch.Tensor:
    """Latents of ``x`` (tensor ``[n, d]`` or ``Activations``: real tokens at ``site``) -> ``[n, d_sae]``."""
    x = token_rows(x, site or sae.site)
    with torch.no_grad():
        return torch.cat([sae.encode(x[a:a + batch_size].to(sae.device)).float().cpu()
                          for a in range(0, x.shape[0], batch_size)])


@dataclass
class LatentSeparation(Result):
    """Per latent ``[d_sae]``: mean activation on set A and B, their difference and the AUROC (A positive);
    ``ranking`` orders latents by ``by``."""

    mean_a: torch.Tensor
    mean_b: torch.Tensor
    diff: torch.Tensor
    auroc: torch.Tensor
    ranking: LatentRanking

    def summary(self) -> dict[str, Any]:
        """The top latents by the ranking, the largest mean difference and the AUROC range over latents."""
        return {"n_latents": self.diff.numel(), "ranked_by": self.ranking.what, "top": self.ranking.indices[:10].tolist(),
                "max_abs_diff": float(self.diff.abs().max()), "max_auroc": float(self.auroc.max()),
                "min_auroc": float(self.auroc.min())}

    def to_frame(self) -> pd.DataFrame:
        """One row per latent: ``latent``, ``mean_a``, ``mean_b``, ``diff``, ``auroc`` and ``rank``."""
        return _per_latent(self.ranking, mean_a=self.mean_a, mean_b=self.mean_b, diff=self.diff, auroc=self.auroc)

    def plot(self, names: tuple[str, str] = ("set A", "set B"), title: str | None = None) -> Any:
        """The ranked latents' mean activation on each set, side by side, best first (AUROC in the hover)."""
        from interp.viz.sae import latent_bars

        idx = self.ranking.indices
        return latent_bars(idx.tolist(), {names[0]: self.mean_a[idx].tolist(), names[1]: self.mean_b[idx].tolist()},
                           title=title or f"latents separating {names[0]} from {names[1]} (by {self.ranking.what})",
                           yaxis="mean activation")


def separating_latents(sae: SAE, acts_a: torch.Tensor | Any, acts_b: torch.Tensor | Any, top: int = 10,
                       by: str = "auroc", site: str | None = None) -> LatentSeparation:
    """Latents most separating two prompt sets (activations ``[n, d]`` at the SAE's site, e.g. the last token
    of harmful vs harmless prompts). ``by``: ``auroc`` (most > 0.5 first), ``diff`` or ``abs_auroc``."""
    za, zb = encode_tokens(sae, acts_a, site=site), encode_tokens(sae, acts_b, site=site)
    mean_a, mean_b = za.mean(0), zb.mean(0)
    diff = mean_a - mean_b
    y = torch.cat([torch.ones(za.shape[0], dtype=torch.long), torch.zeros(zb.shape[0], dtype=torch.long)])
    au = auroc(torch.cat([za, zb]).T, y)  # [d_sae], set A positive
    keys = {"auroc": au + 1e-6 * diff.sign(), "diff": diff, "abs_auroc": (au - 0.5).abs()}
    if by not in keys:
        raise ValueError(f"by must be one of {sorted(keys)}, got {by!r}")
    order = keys[by].argsort(descending=True)[: min(top, sae.d_sae)]
    score = au if by != "diff" else diff
    return LatentSeparation(mean_a, mean_b, diff, au, LatentRanking(order, score[order], score, what=by))


@dataclass
class LatentDiff(Result):
    """Model diffing with one SAE on the same prompts: per latent ``[d_sae]`` mean activation in the base and
    fine-tuned model, the change, firing frequencies, and a ranking by ``by``."""

    mean_base: torch.Tensor
    mean_tuned: torch.Tensor
    delta: torch.Tensor
    freq_base: torch.Tensor
    freq_tuned: torch.Tensor
    ranking: LatentRanking

    def summary(self) -> dict[str, Any]:
        """The top latents by the ranking, the largest change and the mean firing frequency in each model."""
        return {"n_latents": self.delta.numel(), "ranked_by": self.ranking.what,
                "top": self.ranking.indices[:10].tolist(), "max_abs_delta": float(self.delta.abs().max()),
                "mean_freq_base": float(self.freq_base.mean()), "mean_freq_tuned": float(self.freq_tuned.mean())}

    def to_frame(self) -> pd.DataFrame:
        """One row per latent: ``latent``, ``mean_base``, ``mean_tuned``, ``delta``, ``freq_base``,
        ``freq_tuned`` and ``rank``."""
        return _per_latent(self.ranking, mean_base=self.mean_base, mean_tuned=self.mean_tuned, delta=self.delta,
                           freq_base=self.freq_base, freq_tuned=self.freq_tuned)

    def plot(self, title: str | None = None) -> Any:
        """The ranked latents' mean activation in the base and the tuned model, side by side."""
        from interp.viz.sae import latent_bars

        idx = self.ranking.indices
        return latent_bars(idx.tolist(), {"base": self.mean_base[idx].tolist(), "tuned": self.mean_tuned[idx].tolist()},
                           title=title or f"latents ranked by {self.ranking.what}", yaxis="mean activation")


def diff_latents(sae: SAE, acts_base: torch.Tensor | Any, acts_tuned: torch.Tensor | Any, top: int = 20,
                 by: str = "delta", site: str | None = None) -> LatentDiff:
    """Rank latents by how fine-tuning changed their activation on the same prompts.

    ``acts_*``: ``[n, d]`` at the SAE's site, row ``i`` of both from prompt ``i``. ``by``: ``delta``
    (increase first), ``abs_delta`` or ``decrease``."""
    zb, zt = encode_tokens(sae, acts_base, site=site), encode_tokens(sae, acts_tuned, site=site)
    if zb.shape != zt.shape:
        raise ValueError(f"base and tuned activations must come from the same prompts: {tuple(zb.shape)} vs "
                         f"{tuple(zt.shape)}")
    mb, mt = zb.mean(0), zt.mean(0)
    delta = mt - mb
    keys = {"delta": delta, "abs_delta": delta.abs(), "decrease": -delta}
    if by not in keys:
        raise ValueError(f"by must be one of {sorted(keys)}, got {by!r}")
    order = keys[by].argsort(descending=True)[: min(top, sae.d_sae)]
    return LatentDiff(mb, mt, delta, (zb > 0).float().mean(0), (zt > 0).float().mean(0),
                      LatentRanking(order, delta[order], delta, what=f"activation change ({by})"))


def latent_acts_on_prompts(model: Any, sae: SAE, inputs: Inputs, latents: Sequence[int],
                           batch_size: int = 8, site: str | None = None) -> list[dict[str, Any]]:
    """Per prompt: ``ids [T]`` (real tokens) and ``acts [T, len(latents)]`` of the chosen latents."""
    from sae.edits import check_site
    from sae.runner import site_tokens

    site = check_site(sae, model, site)
    idx = torch.as_tensor(list(latents), dtype=torch.long)
    out: list[dict[str, Any]] = []
    with torch.no_grad():
        for x, b in site_tokens(model, site, inputs, batch_size):
            z = sae.encode(x.to(sae.device, sae.dtype))[..., idx.to(sae.device)].float().cpu()
            for i in range(x.shape[0]):
                m = b.attention_mask[i].bool()
                out.append({"ids": b.input_ids[i].cpu()[m], "acts": z[i][m]})
    return out
