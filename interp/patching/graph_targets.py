"""What an attribution graph explains: its target nodes, each a linear readout of the residual stream.

Every target is ``value = vector . x_site[position] + const`` in the linearised model, so a graph's rows for
targets are one gradient injection each. :class:`TopLogits` (the default): the top tokens' logits minus the mean
logit (as circuit-tracer), weighted by their probabilities; :class:`LogitDiff`: ``logit(a) - logit(b)``;
:class:`Projection`: the projection of the residual at a site and position on a vector (e.g. a refusal direction).
Logits are read at the unembedding's input (``ln_final.hook_out``) before any final soft-capping (Gemma-2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float

from interp.patching.replacement import ReplacementModel, ReplacementRun
from interp.sites import parse_site
from interp.weights import token_id, unembed

FINAL = "ln_final.hook_out"


@dataclass
class Readout:
    """One target node: ``vector . x[site][position] + const``; ``weight`` is its share in node influence."""

    label: str
    kind: str
    site: str
    position: int
    vector: Float[torch.Tensor, "d"]  # noqa: F821
    const: float = 0.0
    weight: float = 1.0

    def value(self, sites: dict[str, torch.Tensor]) -> torch.Tensor:
        """The readout of every batch row ``[b]`` from a pass's stashed site tensors ``{site: [b, T, d]}``."""
        x = sites[self.site][:, self.position]
        return x.to(self.vector.dtype) @ self.vector.to(x.device) + self.const


@dataclass
class TopLogits:
    """The most likely next tokens at the last position: at most ``k``, stopping once their probabilities sum to
    ``prob``; each target is its logit minus the mean logit, weighted by its probability. ``tokens`` (ids or
    one-token strings) names the tokens instead, in that order (``k`` and ``prob`` are then unused), as
    circuit-tracer's ``attribute(attribution_targets=ids)``."""

    k: int = 10
    prob: float = 0.95
    tokens: Sequence[int | str] | None = None


@dataclass
class LogitDiff:
    """``logit(a) - logit(b)`` at ``position`` (default the last); ``a`` / ``b`` are token ids or one-token
    strings."""

    a: int | str
    b: int | str
    position: int = -1


@dataclass
class Projection:
    """``vector . x[site][position]``: the residual at ``site`` (``resid_pre`` / ``resid_mid`` / ``resid_post`` at a
    layer, or ``ln_final.hook_out``) projected on ``vector [d_model]`` (not normalised: pass a unit vector for a
    projection)."""

    vector: Any
    site: str
    position: int = -1
    label: str = "direction"


Target = TopLogits | LogitDiff | Projection


def _position(pos: int, n: int) -> int:
    p = pos + n if pos < 0 else pos
    if not 0 <= p < n:
        raise ValueError(f"target position {pos} is outside the prompt's {n} tokens")
    return p


def _top_logits(rm: ReplacementModel, run: ReplacementRun, t: TopLogits) -> list[Readout]:
    if t.k < 1 or not 0.0 < t.prob <= 1.0:
        raise ValueError(f"TopLogits needs k >= 1 and 0 < prob <= 1, got k={t.k}, prob={t.prob}")
    W, b = unembed(rm.model)
    probs = run.logits[-1].double().softmax(-1)
    tok = rm.model.tokenizer
    if t.tokens is not None:
        given = [t.tokens] if isinstance(t.tokens, (str, int)) else list(t.tokens)
        if not given:
            raise ValueError("TopLogits(tokens=...) needs at least one token")
        ids = torch.tensor([token_id(tok, x, W.shape[0]) for x in given], dtype=torch.long)
        chosen = probs[ids].tolist(), ids.tolist()
    else:
        top = probs.topk(min(t.k, probs.shape[0]))
        n = int((top.values.cumsum(0) < t.prob).sum()) + 1
        chosen = top.values[:n].tolist(), top.indices[:n].tolist()
    mean_w, mean_b = W.mean(0), (0.0 if b is None else float(b.mean()))
    out = []
    for p, i in zip(*chosen):
        name = (tok.convert_ids_to_tokens(i) if tok is not None else None) or str(i)
        const = 0.0 if b is None else float(b[i]) - mean_b
        out.append(Readout(f"logit {name!r}", "logit", FINAL, run.n_positions - 1,
                           (W[i] - mean_w).detach(), const, float(p)))
    return out


def _logit_diff(rm: ReplacementModel, run: ReplacementRun, t: LogitDiff) -> list[Readout]:
    W, b = unembed(rm.model)
    a, c = (token_id(rm.model.tokenizer, x, W.shape[0]) for x in (t.a, t.b))
    const = 0.0 if b is None else float(b[a] - b[c])
    return [Readout(f"logit diff {t.a!r} - {t.b!r}", "logit_diff", FINAL, _position(t.position, run.n_positions),
                    (W[a] - W[c]).detach(), const)]


def _direction(rm: ReplacementModel, run: ReplacementRun, t: Projection) -> list[Readout]:
    v = torch.as_tensor(getattr(t.vector, "vectors", t.vector))
    if v.dim() != 1 or v.shape[0] != rm.d_model:
        raise ValueError(f"the target direction has shape {tuple(v.shape)} but the residual of "
                         f"{rm.model.name} has width {rm.d_model}; pass one vector [d_model] (select a layer's row)")
    if not torch.isfinite(v).all() or float(v.abs().max()) == 0.0:
        raise ValueError("the target direction is zero or not finite")
    site = parse_site(t.site, rm.n_layers).name
    rm.check_read(site)
    return [Readout(t.label, "direction", site, _position(t.position, run.n_positions),
                    v.to(rm.model.dtype).detach())]


def resolve_targets(rm: ReplacementModel, run: ReplacementRun, target: Target | Sequence[Target] | None
                    ) -> list[Readout]:
    """The target nodes of a graph: one :class:`Readout` per target (a :class:`TopLogits` gives several)."""
    items = [TopLogits()] if target is None else ([target] if not isinstance(target, (list, tuple)) else target)
    out: list[Readout] = []
    for t in items:
        if isinstance(t, TopLogits):
            out += _top_logits(rm, run, t)
        elif isinstance(t, LogitDiff):
            out += _logit_diff(rm, run, t)
        elif isinstance(t, Projection):
            out += _direction(rm, run, t)
        else:
            raise TypeError(f"a graph target is TopLogits(), LogitDiff(a, b) or Projection(vector, site), got "
                            f"{type(t).__name__}")
    if not out:
        raise ValueError("no target given")
    return out


__all__ = ["FINAL", "LogitDiff", "Projection", "Readout", "Target", "TopLogits", "resolve_targets", "token_id"]
