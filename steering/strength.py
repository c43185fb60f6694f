"""A unit for steering strength: the mean residual-stream norm at each layer, measured on your prompts.

A probes Direction is unit length, so ``AddVector(d, alpha=8, magnitude="unit")`` adds a vector of norm 8;
SmolLM2's residual stream has norms of 110-185 in its middle layers, so that does close to nothing. Measure the norms once,

    norms = steering.residual_norms(model, prompts, site="resid_post")
    iv = steering.AddVector(d, layers=range(10, 20), alpha=0.5, unit="residual", norms=norms)

and ``alpha`` becomes a fraction of the typical residual norm at each layer (0.5: half of it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from tqdm.auto import tqdm

from interp.bundle import Result
from interp.capturing import capture
from interp.forward import prepare
from interp.io import content_hash
from interp.models import Model
from interp.positions import Positions
from interp.values import Prompts, Runtime, moved_keywords
from steering._args import Layers, resolve_kinds, resolve_layers

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class ResidualNorms(Result):
    """Per-layer L2 norms of the residual stream at ``site``: ``mean``, ``std`` and ``max`` ``[n_layers_measured]``
    over ``n_tokens`` token positions of ``n_prompts`` prompts, for ``layers``.

    Provenance: the ``prompts`` (and their hash), the ``positions`` rule, whether special tokens (BOS, chat
    markers: attention sinks with norms 100x the rest) were left out, and the model.
    """

    mean: Float[torch.Tensor, " n_layers"]
    std: Float[torch.Tensor, " n_layers"]
    max: Float[torch.Tensor, " n_layers"]
    layers: list[int]
    site: str
    positions: str
    exclude_special: bool
    n_tokens: int
    model_id: str
    prompts: list[str] = field(repr=False, default_factory=list)

    @property
    def n_prompts(self) -> int:
        return len(self.prompts)

    @property
    def prompts_hash(self) -> str:
        """Short hash of the prompts the norms were measured on."""
        return content_hash(list(self.prompts), length=12)

    def at(self, layer: int) -> float:
        """Mean norm at ``layer`` (a clear error when it was not measured)."""
        if layer not in self.layers:
            raise ValueError(f"residual norms were measured at layers {self.layers}, not {layer}; measure it with "
                             f"steering.residual_norms(model, prompts, layers=[..., {layer}])")
        return float(self.mean[self.layers.index(layer)])

    def summary(self) -> dict[str, Any]:
        """The site, positions and counts, and the mean residual norm at each measured layer."""
        return {"site": self.site, "positions": self.positions, "n_prompts": self.n_prompts,
                "n_tokens": self.n_tokens, "mean_norm": {str(k): float(v) for k, v in zip(self.layers, self.mean)}}

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame({"layer": self.layers, "site": self.site, "mean_norm": self.mean.tolist(),
                             "std_norm": self.std.tolist(), "max_norm": self.max.tolist(), "n_tokens": self.n_tokens,
                             "n_prompts": self.n_prompts, "positions": self.positions,
                             "exclude_special": self.exclude_special, "model_id": self.model_id})

    def plot(self) -> Any:
        from interp.viz.steering import norms_by_layer

        return norms_by_layer(self.layers, self.mean, self.std, self.max,
                              title=f"Residual norm at {self.site} ({self.model_id}, {self.n_prompts} prompts, "
                                    f"{self.n_tokens} tokens)")

    def __repr__(self) -> str:
        lo, hi = float(self.mean.min()), float(self.mean.max())
        return (f"ResidualNorms({self.site}, layers {self.layers[0]}..{self.layers[-1]}, mean {lo:.1f}..{hi:.1f}, "
                f"{self.n_prompts} prompts / {self.n_tokens} tokens, positions={self.positions!r}, "
                f"exclude_special={self.exclude_special}, prompts {self.prompts_hash})")


MOVED = {"exclude_special": 'positions=interp.Positions("all", skip_special=...)',
         **{k: f"runtime=interp.Runtime({k}=...)" for k in ("batch_size", "progress")},
         **{k: f"prompts=interp.Prompts(texts, {k}=...)" for k in ("chat", "system")}}
"""The keywords :func:`residual_norms` took before its value types, and where each went."""


def _keep_mask(model: Model, chunk: list[str], mask: torch.Tensor, specials: set[int], chat: bool,
               system: str | None) -> torch.Tensor:
    """``mask [n, P]`` (left padded) with the special tokens' positions turned off."""
    keep = mask.clone()
    if not specials:
        return keep
    _, encs = prepare(model, chunk, chat=chat, system=system)
    for i, enc in enumerate(encs):
        cols = mask[i].nonzero().squeeze(-1)
        if len(cols) != len(enc.ids):
            raise RuntimeError(f"prompt {i}: {len(cols)} captured positions for {len(enc.ids)} tokens")
        special = torch.tensor([t in specials for t in enc.ids], dtype=torch.bool)
        keep[i, cols[special]] = False
    return keep


@moved_keywords(MOVED)
def residual_norms(model: Model, prompts: Prompts | Sequence[str], layers: Layers = "all", site: str = "resid_post",
                   positions: Positions | Any = "all", runtime: Runtime | None = None) -> ResidualNorms:
    """Mean L2 norm of ``site`` per layer over the tokens of ``prompts`` (captured with ``interp.capture``).

    ``positions="all"`` averages every real prompt token, leaving out special tokens
    (``interp.Positions("all", skip_special=False)`` keeps them) whose attention-sink norms would otherwise
    dominate the mean; other rules (``"last"``, ``"post_instruction"``, ints) average what ``capture`` returns for
    them. Prompts (chat formatting from :class:`interp.Prompts`) are captured ``runtime.batch_size`` at a time, so
    memory stays at one batch.
    """
    given, pos = Prompts.of(prompts), Positions.of(positions)
    run = runtime if runtime is not None else Runtime(progress=False)    # quiet unless asked
    chat, system, prompts, positions = given.chat, given.system, list(given.texts), pos.rule
    exclude_special, batch_size = pos.skip_special, run.batch_size
    if not prompts:
        raise ValueError("residual_norms needs at least one prompt")
    kinds = resolve_kinds(site)
    if len(kinds) != 1:
        raise ValueError(f"give one site kind (e.g. 'resid_post'), got {site!r}")
    layer_list = resolve_layers(layers, model.n_layers, what="residual_norms")
    tok = model.tokenizer
    specials = set(tok.all_special_ids) if exclude_special and positions == "all" and tok is not None else set()
    total = torch.zeros(len(layer_list), dtype=torch.float64)
    total_sq, peak, count = torch.zeros_like(total), torch.zeros_like(total), 0
    for start in tqdm(range(0, len(prompts), batch_size), desc="residual norms", disable=not run.progress, leave=False):
        chunk = prompts[start:start + batch_size]
        acts = capture(model, Prompts(chunk, chat=chat, system=system), sites=kinds[0], layers=layer_list,
                       positions=positions, runtime=Runtime(batch_size=batch_size, progress=False))
        norms = acts.tensor.double().norm(dim=-1)  # [n, L, P] or [n, L]
        if norms.dim() == 3:
            mask = acts.mask if acts.mask is not None else torch.ones(norms.shape[0], norms.shape[2], dtype=torch.bool)
            keep = _keep_mask(model, chunk, mask.bool(), specials, chat, system) if specials else mask.bool()
            vals = norms.permute(1, 0, 2)[:, keep]  # [L, tokens]
        else:
            vals = norms.T
        total += vals.sum(1)
        total_sq += (vals ** 2).sum(1)
        peak = torch.maximum(peak, vals.amax(1)) if vals.shape[1] else peak
        count += vals.shape[1]
    if count == 0:
        raise ValueError("no token positions left to average (all special?); pass "
                         "positions=interp.Positions('all', skip_special=False)")
    mean = total / count
    std = (total_sq / count - mean ** 2).clamp_min(0).sqrt()
    return ResidualNorms(mean.float(), std.float(), peak.float(), layer_list, kinds[0], str(positions),
                         bool(exclude_special and positions == "all"), count, model.name, prompts)


def norm_table(norms: Any, n_layers: int, what: str = "norms") -> dict[int, float]:
    """``{layer: norm}`` from :class:`ResidualNorms`, a ``{layer: norm}`` dict, or one number per layer."""
    if isinstance(norms, ResidualNorms):
        table = {layer: float(v) for layer, v in zip(norms.layers, norms.mean.tolist(), strict=True)}
    elif isinstance(norms, Mapping):
        table = {resolve_layers(int(k), n_layers, what=what)[0]: float(v) for k, v in norms.items()}
    else:
        t = torch.as_tensor(norms, dtype=torch.float64).reshape(-1)
        if t.numel() != n_layers:
            raise ValueError(f"{what}: {t.numel()} numbers for a model of {n_layers} layers; give one per layer, a "
                             f"{{layer: norm}} dict, or steering.residual_norms(model, prompts, ...)")
        table = dict(enumerate(t.tolist()))
    bad = {k: v for k, v in table.items() if not (v > 0 and v < float("inf"))}
    if bad:
        raise ValueError(f"{what}: norms must be positive and finite, got {bad}")
    return table


__all__ = ["ResidualNorms", "norm_table", "residual_norms"]
