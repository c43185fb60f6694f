"""The result of a logit or tuned lens: per prompt, site (layer) and position, the top tokens and probabilities,
the targets' log-probs, KL to the final distribution and entropy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Bool, Float, Int

from interp.bundle import Result

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class LogitLens(Result):
    """Lens grids ``[n_prompts, n_rows, n_positions, ...]``; rows are ``sites`` (the last one, ``ln_final.hook_out``
    at layer ``n_layers``, is the model's own output). ``mask [n, P]``: real positions (padding cells hold ``nan``);
    ``tokens[i][p]``: the input token at that position; ``vocab``: id -> token string of every top id."""

    model_id: str
    lens: str                                            # "logit" or "tuned"
    sites: list[str]
    layers: list[int]
    positions: str
    tokens: list[list[str]]
    mask: Bool[torch.Tensor, "n P"]
    top_ids: Int[torch.Tensor, "n S P k"]
    top_probs: Float[torch.Tensor, "n S P k"]
    vocab: dict[str, str]
    targets: list[str]
    target_ids: Int[torch.Tensor, " m"]
    target_logprobs: Float[torch.Tensor, "n S P m"]
    kl: Float[torch.Tensor, "n S P"]                     # KL(final || lens), nats
    entropy: Float[torch.Tensor, "n S P"]                # of the lens distribution, nats
    logprobs: Float[torch.Tensor, "n S P V"] | None = None

    def top_tokens(self, prompt: int = 0, rank: int = 0) -> list[list[str]]:
        """The rank-``rank`` token strings of one prompt, ``[n_rows][n_positions]`` (``""`` at padding)."""
        ids, m = self.top_ids[prompt, :, :, rank], self.mask[prompt]
        return [[self.vocab[str(int(i))] if m[p] else "" for p, i in enumerate(row)] for row in ids]

    def mean_kl(self) -> Float[torch.Tensor, " S"]:
        """KL(final || lens) per row, averaged over every real position of every prompt."""
        m = self.mask[:, None].expand_as(self.kl)
        return torch.stack([self.kl[:, j][m[:, j]].mean() for j in range(self.kl.shape[1])])

    def summary(self) -> dict[str, Any]:
        """Lens kind, sizes, mean KL and mean entropy by site, and the targets' mean log-prob by site."""
        m = self.mask[:, None].expand_as(self.kl)
        ent = [float(self.entropy[:, j][m[:, j]].mean()) for j in range(len(self.sites))]
        out: dict[str, Any] = {"model_id": self.model_id, "lens": self.lens, "positions": self.positions,
                               "n_prompts": int(self.mask.shape[0]), "n_sites": len(self.sites),
                               "mean_kl": dict(zip(self.sites, [float(x) for x in self.mean_kl()])),
                               "mean_entropy": dict(zip(self.sites, ent))}
        for t, name in enumerate(self.targets):
            lp = self.target_logprobs[..., t]
            out.setdefault("target_mean_logprob", {})[name] = {
                s: float(lp[:, j][m[:, j]].mean()) for j, s in enumerate(self.sites)}
        return out

    def to_frame(self) -> pd.DataFrame:
        """Long format: one row per prompt, site and real position with ``layer``, the input ``token``, the top
        token and its ``top_prob``, ``kl``, ``entropy`` and a ``logprob:<target>`` column per target."""
        import pandas as pd

        recs = []
        for i in range(self.mask.shape[0]):
            for j, site in enumerate(self.sites):
                for p in self.mask[i].nonzero()[:, 0].tolist():
                    rec = {"prompt": i, "site": site, "layer": self.layers[j], "position": p,
                           "token": self.tokens[i][p], "top_token": self.vocab[str(int(self.top_ids[i, j, p, 0]))],
                           "top_prob": float(self.top_probs[i, j, p, 0]), "kl": float(self.kl[i, j, p]),
                           "entropy": float(self.entropy[i, j, p])}
                    for t, name in enumerate(self.targets):
                        rec[f"logprob:{name}"] = float(self.target_logprobs[i, j, p, t])
                    recs.append(rec)
        return pd.DataFrame(recs)

    def plot(self, kind: str = "top", prompt: int = 0, position: int = -1, title: str | None = None) -> Any:
        """``"top"``: site x position grid of top tokens coloured by probability (one prompt); ``"target"``: each
        target's probability by layer at ``position``; ``"kl"``: mean KL to the final distribution by layer."""
        from interp.viz.lens import lens_grid, lens_kl, lens_targets

        if not 0 <= prompt < self.mask.shape[0]:
            raise ValueError(f"prompt {prompt} is out of range; this result has prompts 0..{self.mask.shape[0] - 1}")
        label = f"{self.lens} lens, {self.model_id}"
        if kind == "top":
            real = self.mask[prompt].nonzero()[:, 0].tolist()
            tops = self.top_tokens(prompt)
            return lens_grid([[tops[j][p] for p in real] for j in range(len(self.sites))],
                             self.top_probs[prompt, :, real, 0], [f"{p}: {self.tokens[prompt][p]}" for p in real],
                             self.sites, title or f"{label}: top token by site and position (prompt {prompt})")
        if kind == "target":
            if not self.targets:
                raise ValueError("this lens was run without targets; pass targets=[' Paris', ...] to logit_lens")
            col = self.mask[prompt].nonzero()[:, 0].tolist()[position]
            probs = self.target_logprobs[prompt, :, col].exp().T
            return lens_targets(probs, self.targets, self.layers, self.sites,
                                title or f"{label}: target probability by layer (prompt {prompt}, position {col})")
        if kind == "kl":
            return lens_kl(self.mean_kl(), self.layers, self.sites, title or f"{label}: KL(final || lens) by layer")
        raise ValueError(f"unknown plot kind {kind!r}; use 'top', 'target' or 'kl'")

    def __repr__(self) -> str:
        n, S, P = self.kl.shape
        return (f"LogitLens({self.lens}, {self.model_id!r}, prompts={n}, sites={S}, positions={P} ({self.positions}), "
                f"targets={self.targets})")


__all__ = ["LogitLens"]
