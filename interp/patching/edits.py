"""Patching's edits as objects of the one edit protocol, composable in ``steering.apply`` with any other edit.

``HeadAblation`` and ``NeuronAblation`` are activation edits (``hook_fns(model) -> {site: fn(x, ctx)}``);
:class:`interp.patching.transplants.Transplant` is the weight edit of the protocol (``weights(model)``).
``patching.ablate_heads`` and ``ablate_neurons`` are these objects applied on their own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from interp.hooking import HookContext
from interp.models import Model
from interp.sites import Site, parse_site

Unit = tuple[int, int]  # (layer, head) or (layer, neuron)


def ablation_values(model: Model, mode: str, means: torch.Tensor | None, kind: str) -> torch.Tensor | None:
    """``None`` for zero ablation, the given means ``[L, ...]`` for mean ablation."""
    if mode == "zero":
        return None
    if mode == "mean":
        if means is None:
            raise ValueError(f"mode='mean' needs the means: pass means={'head' if kind == 'attn_z' else 'neuron'}"
                             f"_means(model, reference_prompts)")
        return means
    raise ValueError(f"mode must be 'zero' or 'mean', got {mode!r}")


def _by_layer(units: Iterable[Unit], kind: str, model: Model, size: int, what: str) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for item in units:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise TypeError(f"{what}s are (layer, index) pairs, got {item!r}")
        layer = parse_site(Site(kind, int(item[0])), model.n_layers).layer
        if not 0 <= int(item[1]) < size:
            raise ValueError(f"{what} {item[1]} is out of range; this model has {what}s 0..{size - 1}")
        out.setdefault(layer, []).append(int(item[1]))
    if not out:
        raise ValueError(f"no {what}s given; pass [(layer, index), ...]")
    return out


def _set_units(vals: torch.Tensor | None, layer: int, idx: list[int], heads: bool) -> Callable:
    """A hook setting units ``idx`` (heads: axis -2 of ``[B, T, H, d_head]``; neurons: the last axis) to zero or
    to ``vals[layer, idx]``."""
    index = torch.tensor(idx)

    def fn(x: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        x = x.clone()
        new = 0.0 if vals is None else vals[layer, index].to(x.device, x.dtype)
        if heads:
            x[..., index.to(x.device), :] = new
        else:
            x[..., index.to(x.device)] = new
        return x
    return fn


@dataclass
class HeadAblation:
    """Heads ``[(layer, head), ...]`` output zero (``mode='zero'``) or their mean ``z`` (``mode='mean'``, ``means``
    ``[L, H, d_head]`` from :func:`patching.heads.head_means`) at every position."""

    heads: Sequence[Unit]
    mode: str = "zero"
    means: torch.Tensor | None = None

    def hook_fns(self, model: Model) -> dict[str, Callable]:
        vals = ablation_values(model, self.mode, self.means, "attn_z")
        by_layer = _by_layer(self.heads, "attn_z", model, model.n_heads, "head")
        return {Site("attn_z", la).name: _set_units(vals, la, hs, heads=True) for la, hs in by_layer.items()}


@dataclass
class NeuronAblation:
    """MLP neurons ``[(layer, index), ...]`` set to zero or to their mean (``means [L, d_mlp]``) at every position."""

    neurons: Sequence[Unit]
    mode: str = "zero"
    means: torch.Tensor | None = None

    def hook_fns(self, model: Model) -> dict[str, Callable]:
        if model.spec.mlp_proj is None:
            raise ValueError("neuron ablation needs a dense MLP; this model's MLPs are mixtures of experts")
        vals = ablation_values(model, self.mode, self.means, "mlp_post")
        by_layer = _by_layer(self.neurons, "mlp_post", model, int(model.d_mlp), "neuron")
        return {Site("mlp_post", la).name: _set_units(vals, la, ix, heads=False) for la, ix in by_layer.items()}


__all__ = ["HeadAblation", "NeuronAblation", "ablation_values"]
