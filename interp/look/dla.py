"""Direct logit attribution: which embedding, layer, head or neuron writes a logit (difference).

The residual stream at the chosen positions is the sum of its writes (the embedding, each layer's ``attn_out`` and
``mlp_out``); with the final norm's scale frozen from the clean run (as TransformerLens's ``apply_ln_to_stack``:
centre for a LayerNorm, divide by the run's RMS / std, multiply by the gain) the logit is linear in them, so each
write gets its share exactly. Heads: ``attn_z`` of a head times its slice of ``W_O``; neurons: ``mlp_post`` times
rows of the down projection; the biases are parts of their own. A mixture-of-experts layer's MLP write is two parts:
the routed experts' weighted sum (``experts_out``) and, where the family has one, the shared expert's gated write
(Qwen2-MoE; ``mlp_out - experts_out``). Where a norm follows the sublayer (Gemma-2/3,
OLMo-2) its per-token scale is frozen from the clean run too. Frozen: the final norm's scale (and those post norms);
constant: the final norm's bias and the unembedding bias projected on the target (``DLA.constant``). Gemma-2's
final logit softcap is left out: the parts sum to the logit before the cap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float

from interp.arch import has_module
from interp.bundle import Result
from interp.capturing import capture
from interp.hooking import norm_parts
from interp.models import Model, onloaded
from interp.positions import Positions, PositionSpec
from interp.sites import Site
from interp.values import Prompts, Runtime
from interp.weights import down_weights, head_weights, rms_multiplier, token_id, unembed, unembed_module

if TYPE_CHECKING:
    import pandas as pd

BY = ("layer", "head", "neuron")
Target = int | str | tuple[Any, Any]
"""A token (string or id), a pair ``(a, b)`` for ``logit(a) - logit(b)``, or a pair of per-prompt lists."""
FROZEN = ("final norm scale from the clean run ({norm}); {post}constant: final norm bias and unembedding bias "
          "on the target")



@dataclass
class DLA(Result):
    """``parts [n, P, K]``: each part's share of the target logit (difference) at each prompt and position;
    ``labels`` / ``kinds`` / ``layers`` / ``units`` (head or neuron index, -1 for none) describe the ``K`` parts;
    ``total [n, P]`` the logit (difference) before any softcap; ``constant [n, P]`` what no part owns, so
    ``parts.sum(-1) + constant == total``; ``mask [n, P]`` the real positions."""

    parts: torch.Tensor
    total: torch.Tensor
    constant: torch.Tensor
    mask: torch.Tensor
    labels: list[str]
    kinds: list[str]
    layers: list[int]
    units: list[int]
    by: str = "layer"
    target: str = ""
    frozen: str = ""
    n_heads: int = 0
    n_layers: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def mean(self) -> Float[torch.Tensor, "K"]:  # noqa: F821
        """Each part's mean over the real positions of every prompt."""
        m = self.mask.to(self.parts.dtype)[..., None]
        return (self.parts * m).sum((0, 1)) / m.sum((0, 1)).clamp_min(1)

    def top(self, k: int = 10) -> list[tuple[str, float]]:
        """The ``k`` parts with the largest mean share in absolute value, as ``(label, mean)``, largest first."""
        mean = self.mean()
        idx = mean.abs().argsort(descending=True)[:k]
        return [(self.labels[i], float(mean[i])) for i in idx]

    def by_layer(self) -> tuple[list[str], torch.Tensor]:
        """The mean shares summed per writer: ``embed``, then ``L{i} attn`` and ``L{i} mlp`` per layer."""
        mean = self.mean()
        names = ["embed"] + [f"L{la} {w}" for la in range(self.n_layers) for w in ("attn", "mlp")]
        out = torch.zeros(len(names), dtype=mean.dtype)
        for j, (kind, la) in enumerate(zip(self.kinds, self.layers, strict=True)):
            w = "embed" if kind == "embed" else ("attn" if kind.startswith(("attn", "head")) else "mlp")
            out[0 if w == "embed" else 1 + 2 * la + (w == "mlp")] += mean[j]
        return names, out

    def head_grid(self) -> torch.Tensor | None:
        """``[n_layers, n_heads]`` mean shares of the heads (``None`` unless ``by='head'``)."""
        if self.by != "head":
            return None
        grid = torch.zeros(self.n_layers, self.n_heads)
        mean = self.mean()
        for j, (kind, la, h) in enumerate(zip(self.kinds, self.layers, self.units, strict=True)):
            if kind == "head":
                grid[la, h] = mean[j]
        return grid

    def to_frame(self) -> pd.DataFrame:
        """One row per prompt, real position and part: ``prompt``, ``position``, ``part``, ``kind``, ``layer``,
        ``head`` (or ``neuron``; -1 for none) and ``value``."""
        import pandas as pd

        n, P, K = self.parts.shape
        keep = self.mask[..., None].expand(n, P, K)
        idx = keep.nonzero()
        k = idx[:, 2].tolist()
        unit = "neuron" if self.by == "neuron" else "head"
        return pd.DataFrame({"prompt": idx[:, 0].tolist(), "position": idx[:, 1].tolist(),
                             "part": [self.labels[i] for i in k], "kind": [self.kinds[i] for i in k],
                             "layer": [self.layers[i] for i in k], unit: [self.units[i] for i in k],
                             **({"head": [-1] * len(k)} if unit == "neuron" else {}),
                             "value": self.parts[keep].tolist()})

    def summary(self) -> dict[str, Any]:
        """The target, what is frozen, the mean total and the top writers."""
        tot = float((self.total * self.mask).sum() / self.mask.sum().clamp_min(1))
        return {"target": self.target, "by": self.by, "frozen": self.frozen, "mean_total": tot,
                "top": [{"part": p, "mean": v} for p, v in self.top(10)]}

    def plot(self, title: str | None = None) -> Any:
        """Bars of the mean share per writer (embedding, each layer's attention and MLP) and, ``by='head'``, a
        layer x head heatmap of the heads' mean shares."""
        from interp.viz.looks import dla_figure

        names, vals = self.by_layer()
        return dla_figure(names, vals, self.head_grid(), title or f"direct logit attribution: {self.target}")


def direct_logit_attribution(model: Model, prompts: Prompts | Sequence[str] | torch.Tensor, target: Target, *,
                             positions: Positions | PositionSpec = "last", by: str = "head",
                             runtime: Runtime | None = None) -> DLA:
    """Split the ``target`` logit (``"Paris"`` or an id) or logit difference (``("Mary", "John")``, or two
    per-prompt lists) at ``positions`` among the embedding, each layer's attention (``by='head'``: per head, plus
    the output bias) and MLP (``by='neuron'``: per neuron, plus the down bias); ``by='layer'``: one part per
    writer. Exact: ``parts.sum(-1) + constant == total`` (see the module docstring for what is frozen)."""
    if by not in BY:
        raise ValueError(f"by must be one of {BY}, got {by!r}")
    pos = Positions.of(positions)
    if pos.mean:
        raise ValueError(f"positions={pos.describe()!r} averages over tokens, but the final norm's scale is per "
                         f"token; use 'last', 'all' or explicit positions and average the DLA parts")
    if by == "neuron" and model.spec.is_moe:
        down_weights(model, 0)                                              # the clear error
    run = replace(Runtime.of(runtime), dtype=torch.float32, progress=False)
    n = _n_prompts(prompts)
    a, b, described = _target_ids(model, target, n)
    with torch.no_grad():
        return _attribute(model, prompts, pos, by, run, a, b, described)


def _n_prompts(prompts: Any) -> int:
    if isinstance(prompts, Prompts):
        return len(prompts.texts)
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of strings (or an interp.Prompts / token ids), not one string")
    return len(prompts)


def _target_ids(model: Model, target: Target, n: int) -> tuple[torch.Tensor, torch.Tensor | None, str]:
    """``a [n]`` (and ``b [n]`` for a difference) token ids, and the target in words."""
    vocab = unembed(model)[0].shape[0]

    def ids(x: Any, what: str) -> torch.Tensor:
        if isinstance(x, (list, tuple, torch.Tensor)) and not isinstance(x, str):
            if len(x) != n:
                raise ValueError(f"target {what}: {len(x)} tokens for {n} prompts; give one target per prompt")
            return torch.tensor([token_id(model.tokenizer, t, vocab) for t in list(x)])
        return torch.full((n,), token_id(model.tokenizer, x, vocab))

    if isinstance(target, tuple):
        if len(target) != 2:
            raise ValueError(f"a logit-difference target is a pair (a, b), got {len(target)} items")
        return ids(target[0], "a"), ids(target[1], "b"), f"logit({target[0]!r}) - logit({target[1]!r})"
    return ids(target, "token"), None, f"logit({target!r})"


def _positions(acts: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``[n, S, P, width]`` float32 and the mask ``[n, P]`` from an Activations of any position rule."""
    t = acts.tensor.float()
    if not acts.has_positions:
        t = t[:, :, None]
    mask = acts.mask if acts.mask is not None else torch.ones(t.shape[0], t.shape[2], dtype=torch.bool)
    return t, mask.bool()


@dataclass
class _Parts:
    """The parts as they are built: values ``[n, P, k]`` per group and the matching descriptions."""

    values: list[torch.Tensor] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)
    units: list[int] = field(default_factory=list)

    def add(self, v: torch.Tensor, labels: list[str], kind: str, layer: int, units: Sequence[int] | None = None) -> None:
        self.values.append(v if v.dim() == 3 else v[..., None])
        self.labels += labels
        self.kinds += [kind] * len(labels)
        self.layers += [layer] * len(labels)
        self.units += list(units) if units is not None else [-1] * len(labels)


def _attribute(model: Model, prompts: Any, pos: Positions, by: str, run: Runtime, a: torch.Tensor,
               b: torch.Tensor | None, described: str) -> DLA:
    L, post = model.n_layers, model.spec.post_sublayer_norms
    sites = [Site("resid_pre", 0)] + [Site(k, la) for la in range(L) for k in ("attn_out", "mlp_out")]
    sites += [Site("resid_post", L - 1), Site("ln_final_out", None)]
    sites += [Site("mlp_module_out", la) for la in range(L)] if post and by == "neuron" else []
    moe = _moe_layers(model)
    sites += [Site("experts_out", la) for la in moe]
    R, mask = _positions(capture(model, prompts, sites, positions=pos, runtime=run))   # [n, S, P, d]
    u, const = _direction(model, a, b)                                                  # [n, d], [n]
    s, w, fbias = _frozen_final(model, R[:, 1 + 2 * L], u)                             # [n, P], [n, d], [n]
    total = (R[:, 2 + 2 * L] * u[:, None]).sum(-1) + const[:, None]
    v = w[:, None].expand(R.shape[0], R.shape[2], -1)                                  # [n, P, d]
    parts = _Parts()
    parts.add(s * (R[:, 0] * v).sum(-1), ["embed"], "embed", -1)
    z = _positions(capture(model, prompts, "attn_z", positions=pos, runtime=run))[0] if by == "head" else None
    mp = _positions(capture(model, prompts, "mlp_post", positions=pos, runtime=run))[0] if by == "neuron" else None
    for la in range(L):
        if z is None:
            parts.add(s * (R[:, 1 + 2 * la] * v).sum(-1), [f"L{la} attn"], "attn", la)
        else:
            _head_parts(model, la, z[:, la], s, v, parts)
        if la in moe:
            _moe_parts(model, R[:, 2 + 2 * la], R[:, len(sites) - len(moe) + moe.index(la)], s, v, la, parts)
        elif mp is None:
            parts.add(s * (R[:, 2 + 2 * la] * v).sum(-1), [f"L{la} mlp"], "mlp", la)
        else:
            _neuron_parts(model, la, mp[:, la], R[:, 3 + 2 * L + la] if post else None, s, v, parts)
    constant = (fbias + const)[:, None].expand_as(total)
    mask_f = mask.to(total.dtype)[..., None]
    values = torch.cat(parts.values, -1) * mask_f
    post_note = "post-attention / post-MLP norm scales from the clean run; " if post and by != "layer" else ""
    kind = "LayerNorm: centred, divided by the std" if norm_parts(model.module(model.spec.final_norm)).centre \
        else "RMSNorm: divided by the RMS"
    return DLA(values, total * mask_f[..., 0], constant * mask_f[..., 0], mask, parts.labels, parts.kinds,
               parts.layers, parts.units, by, described, FROZEN.format(norm=kind, post=post_note),
               model.n_heads, L, {"model_id": model.name, "positions": pos.describe(),
                                  "softcap": getattr(model.config, "final_logit_softcapping", None)})


def _moe_layers(model: Model) -> list[int]:
    """The mixture-of-experts layers (dense layers of a mixed model keep one ``mlp`` part); none with post-MLP
    norms, whose frozen scale is not split here."""
    spec = model.spec
    if not spec.is_moe or spec.post_sublayer_norms:
        return []
    return [la for la in range(model.n_layers) if has_module(model.block(la), spec.experts)]


def _moe_parts(model: Model, mlp_out: torch.Tensor, experts_out: torch.Tensor, s: torch.Tensor, v: torch.Tensor, la: int,
               parts: _Parts) -> None:
    """A mixture-of-experts layer's write ``mlp_out [n, P, d]`` as the routed experts' weighted sum
    (``experts_out``) and, where the family has one, the shared expert's gated write (the rest: ``mlp_out -
    experts_out``), each read along ``v [n, P, d]`` at the frozen scale ``s [n, P]``."""
    parts.add(s * (experts_out * v).sum(-1), [f"L{la} experts"], "experts", la)
    if model.spec.shared_expert is not None:
        parts.add(s * ((mlp_out - experts_out) * v).sum(-1), [f"L{la} shared expert"], "shared_expert", la)


def _direction(model: Model, a: torch.Tensor, b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The unembedding direction ``u [n, d]`` of each prompt's target and its bias ``[n]`` (zeros without one)."""
    with onloaded(unembed_module(model)):
        W, bias = unembed(model)
        u = W[a.to(W.device)].float().cpu()
        c = torch.zeros(len(a)) if bias is None else bias[a.to(bias.device)].float().cpu()
        if b is not None:
            u = u - W[b.to(W.device)].float().cpu()
            c = c if bias is None else c - bias[b.to(bias.device)].float().cpu()
    return u, c


def _frozen_final(model: Model, x: torch.Tensor, u: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The final norm frozen on its input ``x [n, P, d]``: the scale ``[n, P]`` (1 / RMS or 1 / std), the direction
    a write is read along ``[n, d]`` (gain times ``u``, centred for a LayerNorm) and the norm bias on ``u`` ``[n]``."""
    with onloaded(model.module(model.spec.final_norm)):
        fp = norm_parts(model.module(model.spec.final_norm), model.spec.norm_offset)
        xf = x - x.mean(-1, keepdim=True) if fp.centre else x
        scale = torch.rsqrt(xf.pow(2).mean(-1) + fp.eps)
        w = u if fp.weight is None else u * (fp.offset + fp.weight.float().cpu())
        w = w - w.mean(-1, keepdim=True) if fp.centre else w
        fbias = torch.zeros(len(u)) if fp.bias is None else u @ fp.bias.float().cpu()
    return scale, w, fbias


def _head_parts(model: Model, la: int, z: torch.Tensor, s: torch.Tensor, v: torch.Tensor, parts: _Parts) -> None:
    """Per-head shares at layer ``la`` from ``z [n, P, H*dh]``: ``z_h W_O[h]`` read along ``v [n, P, d]`` (times the
    frozen post-attention norm where there is one), and the output bias as its own part."""
    with onloaded(model.block(la)):
        W, bias = head_weights(model, la)
        W = W.float().cpu()
        bo = torch.zeros(W.shape[-1]) if bias is None else bias.float().cpu()
        zh = z.reshape(*z.shape[:2], W.shape[0], W.shape[1])
        if model.spec.post_sublayer_norms:
            o = torch.einsum("nphk,hkd->npd", zh, W) + bo
            v = v * _post_scale(model.module(model.spec.attn_out, la), o, model.dtype)
    heads = s[..., None] * torch.einsum("nphk,hkd,npd->nph", zh, W, v)
    parts.add(heads, [f"L{la}H{h}" for h in range(W.shape[0])], "head", la, range(W.shape[0]))
    parts.add(s * (v * bo).sum(-1), [f"L{la} attn bias"], "attn_bias", la)


def _post_scale(norm: Any, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A post-sublayer RMS norm frozen on its input ``x [n, P, d]``: the per-channel factor ``[n, P, d]`` (CPU)."""
    return rms_multiplier(norm, x.to(device=norm.weight.device, dtype=dtype)).cpu()


def _neuron_parts(model: Model, la: int, mp: torch.Tensor, module_out: torch.Tensor | None, s: torch.Tensor,
                  v: torch.Tensor, parts: _Parts) -> None:
    """Per-neuron shares at layer ``la`` from ``mlp_post [n, P, m]``: ``mlp_post_i W_down[i]`` read along ``v``
    (times the frozen post-MLP norm, from the MLP module's output, where there is one), and the down bias."""
    with onloaded(model.block(la)):
        W, bias = down_weights(model, la)
        W = W.float().cpu()
        bd = torch.zeros(W.shape[-1]) if bias is None else bias.float().cpu()
        if module_out is not None:
            v = v * _post_scale(model.module(model.spec.mlp_out, la), module_out, model.dtype)
    neurons = s[..., None] * mp * torch.einsum("md,npd->npm", W, v)
    parts.add(neurons, [f"L{la}N{i}" for i in range(W.shape[0])], "neuron", la, range(W.shape[0]))
    parts.add(s * (v * bd).sum(-1), [f"L{la} mlp bias"], "mlp_bias", la)


__all__ = ["BY", "DLA", "Target", "direct_logit_attribution"]
