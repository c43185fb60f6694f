"""Per-head outputs and head ablation.

Head ``h`` writes ``z_h @ W_O[:, h]`` into the residual stream (GPT-2 Conv1D stores ``W_O`` as ``[in, out]``);
the output bias is added once, not per head. Where a norm follows the projection (Gemma-2/3, OLMo-2) it is
distributed linearly with the full sum's RMS scale, so the heads (plus the scaled bias) still sum exactly to
the attention output.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float

from interp.bundle import Result
from interp.chat import Batch
from interp.forward import batch_of, last_logits
from interp.hooking import hooks
from interp.models import Model, onloaded
from interp.patching.activation import Edit, run_variants
from interp.patching.edits import HeadAblation, ablation_values
from interp.patching.measures import Metric, call_metric, metric_name
from interp.patching.results import Sweep
from interp.patching.runs import CHAT_MOVED, Prompts, run_with_capture
from interp.sites import Site, resolve_layers
from interp.values import Runtime, moved_keywords
from interp.weights import head_weights, rms_multiplier

if TYPE_CHECKING:
    import pandas as pd


def _layers(model: Model, layers: Sequence[int] | None) -> list[int]:
    return resolve_layers(layers, model.n_layers, what="heads", keep_order=layers is not None)


@dataclass
class HeadOutputs(Result):
    """``per_head [n, L, T, H, d]``: what each head writes (padding positions included, see ``mask``);
    ``bias [n, L, T, d]``: the part no head owns (output bias, through the post-norm); ``attn_out`` the
    captured attention output, so ``per_head.sum(-2) + bias == attn_out``."""

    per_head: torch.Tensor
    bias: torch.Tensor
    attn_out: torch.Tensor
    mask: torch.Tensor
    layers: list[int]

    def summary(self) -> dict[str, Any]:
        """Headline numbers: shape, and per layer the head writing the largest mean norm over real positions."""
        n = self.norms().detach()                                                     # [n, L, T, H]
        m = (n * self.mask[:, None, :, None]).sum((0, 2)) / self.mask.sum().clamp_min(1)   # [L, H]
        return {"n_prompts": int(self.per_head.shape[0]), "layers": list(self.layers),
                "n_heads": int(self.per_head.shape[3]),
                "top_head": {str(la): int(m[i].argmax()) for i, la in enumerate(self.layers)},
                "top_head_norm": {str(la): float(m[i].max()) for i, la in enumerate(self.layers)},
                "max_abs_reconstruction_error": float((self.total() - self.attn_out).detach()[
                    self.mask[:, None].expand(-1, len(self.layers), -1)].abs().max())}

    def total(self) -> torch.Tensor:
        return self.per_head.sum(-2) + self.bias

    def norms(self) -> torch.Tensor:
        """``[n, L, T, H]``: the L2 norm of each head's write at each position."""
        return self.per_head.norm(dim=-1)

    def to_frame(self) -> pd.DataFrame:
        """One row per real token, layer and head: ``prompt``, ``layer``, ``position`` (index in the padded
        batch), ``head``, ``norm`` (of the head's write) and ``share`` (that norm over the sum of all heads'
        norms at that token; the direction-free share of the attention output it carries)."""
        import pandas as pd

        nrm = self.norms()
        share = nrm / nrm.sum(-1, keepdim=True).clamp_min(1e-30)
        n, L, T, H = nrm.shape
        keep = self.mask[:, None, :, None].expand(n, L, T, H)
        idx = keep.nonzero()
        layers = torch.tensor(self.layers)[idx[:, 1]]
        return pd.DataFrame({"prompt": idx[:, 0].tolist(), "layer": layers.tolist(), "position": idx[:, 2].tolist(),
                             "head": idx[:, 3].tolist(), "norm": nrm[keep].tolist(), "share": share[keep].tolist()})

    def plot(self, title: str | None = None) -> Any:
        """Heatmap, layers x heads, of each head's mean write norm over the real tokens."""
        from interp.viz.patching import grid_heatmap

        m = self.mask[:, None, :, None].to(self.per_head.dtype)
        mean = (self.norms() * m).sum((0, 2)) / m.sum((0, 2)).clamp_min(1)
        return grid_heatmap(mean, [str(h) for h in range(mean.shape[1])], [str(la) for la in self.layers], "head",
                            "layer", "mean write norm", title or "what each head writes: mean norm over real tokens")


def split_heads(model: Model, layer: int, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Head outputs ``[..., H, d]`` and the shared bias term ``[..., d]`` of ``z [..., H, dh]`` at ``layer``
    (weights offloaded by a ``device_map`` are loaded for the call)."""
    with onloaded(model.block(layer)):
        return _split_heads(model, layer, z)


def _split_heads(model: Model, layer: int, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    W, b = head_weights(model, layer)
    heads = torch.einsum("...hk,hkd->...hd", z.float(), W.float())
    bias = torch.zeros(heads.shape[:-2] + heads.shape[-1:], device=heads.device) if b is None else \
        b.float().expand(heads.shape[:-2] + heads.shape[-1:])
    if model.spec.post_sublayer_norms:
        norm = model.module(model.spec.attn_out, layer)
        o = heads.sum(-2) + bias
        m = rms_multiplier(norm, o.to(z.dtype) if z.dtype != torch.float32 else o)
        heads, bias = heads * m[..., None, :], bias * m
    return heads, bias


@moved_keywords(CHAT_MOVED)
def head_outputs(model: Model, prompts: Prompts, layers: Sequence[int] | None = None) -> HeadOutputs:
    """Capture every head's write into the residual stream at ``layers`` (all positions); ``prompts``: texts (a list: the chat template; ``interp.Prompts(texts, chat=False)``: raw) or a batch."""
    batch = batch_of(model, prompts)
    layer_list = _layers(model, layers)
    sites = [Site("attn_z", la) for la in layer_list] + [Site("attn_out", la) for la in layer_list]
    acts, _ = run_with_capture(model, batch, sites)
    with torch.no_grad():                                                # W_O is a parameter: keep no graph
        per, bias = zip(*(split_heads(model, la, acts[Site("attn_z", la)]) for la in layer_list), strict=True)
    out = torch.stack([acts[Site("attn_out", la)].float() for la in layer_list], 1).cpu()
    return HeadOutputs(torch.stack(per, 1).cpu(), torch.stack(bias, 1).cpu(), out,
                       batch.attention_mask.bool(), layer_list)


@moved_keywords(CHAT_MOVED)
def head_means(model: Model, prompts: Prompts, layers: Sequence[int] | None = None) -> Float[torch.Tensor, "L H dh"]:
    """Mean ``z`` of every head over the real tokens of ``prompts`` (for mean ablation), ``[n_layers, H, dh]``;
    ``prompts``: texts (a list: the chat template; ``interp.Prompts(texts, chat=False)``: raw) or a batch."""
    batch = batch_of(model, prompts)
    layer_list = list(range(model.n_layers)) if layers is None else _layers(model, layers)
    acts, _ = run_with_capture(model, batch, [Site("attn_z", la) for la in layer_list])
    mask = batch.attention_mask.bool().to(model.device)
    out = torch.zeros(model.n_layers, model.n_heads, model.d_head)
    for la in layer_list:
        z = acts[Site("attn_z", la)]
        out[la] = z[mask].float().mean(0).cpu()
    return out


@contextmanager
def ablate_heads(model: Model, heads: Iterable[tuple[int, int]], mode: str = "zero",
                 means: torch.Tensor | None = None) -> Iterator[None]:
    """Within the block, heads ``[(layer, head), ...]`` output zero (``mode='zero'``) or their mean ``z``
    (``mode='mean'`` with ``means`` from :func:`head_means`) at every position: a :class:`HeadAblation` alone."""
    with hooks(model, HeadAblation(list(heads), mode, means).hook_fns(model)):
        yield


def ablation_sweep(model: Model, batch: Batch, metric: Metric, cells: Sequence[tuple[Site, int | None]],
                   values: dict[Site, torch.Tensor], batch_size: int, progress: bool = False,
                   desc: str = "ablating") -> torch.Tensor:
    """Metric with each ``(site, component)`` replaced by ``values[site]`` (``[*shape]``) at every position."""
    n, T = batch.input_ids.shape
    allpos = torch.arange(T)
    full = {s: v.expand(n, T, *v.shape) for s, v in values.items()}
    variants = [[Edit(s, allpos, c)] for s, c in cells]
    return run_variants(model, batch, variants, full, allpos.expand(n, T), metric,
                        Runtime(batch_size=batch_size, progress=progress), desc=desc)


@moved_keywords(CHAT_MOVED)
def head_ablation_sweep(model: Model, prompts: Prompts, metric: Metric, mode: str = "zero",
                        means: torch.Tensor | None = None, layers: Sequence[int] | None = None,
                        batch_size: int = 64, progress: bool = True) -> Sweep:
    """Metric with each head ablated alone (zero or mean, all positions): ``[L, H]``; baseline = no ablation.
    ``progress``: a bar over the forwards."""
    vals = ablation_values(model, mode, means, "attn_z")
    batch = batch_of(model, prompts)
    layer_list = _layers(model, layers)
    H = model.n_heads
    values = {Site("attn_z", la): (torch.zeros(H, model.d_head) if vals is None else vals[la]) for la in layer_list}
    cells = [(Site("attn_z", la), h) for la in layer_list for h in range(H)]
    out = ablation_sweep(model, batch, metric, cells, values, batch_size, progress, f"{mode}-ablating heads")
    with torch.no_grad():
        base = float(call_metric(metric, last_logits(model, batch)))
    return Sweep(out.view(len(layer_list), H), base, None, [str(x) for x in layer_list], [str(h) for h in range(H)],
                 col_name="head", site="attn_z", method=f"{mode}-ablation", metric=metric_name(metric))


__all__ = ["HeadOutputs", "head_outputs", "head_weights", "split_heads", "rms_multiplier", "head_means",
           "ablate_heads", "head_ablation_sweep", "ablation_sweep"]
