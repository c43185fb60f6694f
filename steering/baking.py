"""Bake a directional ablation into the weights: orthogonalise every matrix that writes to the residual stream.

Writers: ``embed`` (token embedding), ``pos_embed`` (GPT-2 learned positions), ``attn`` (attention output
projection), ``mlp`` (dense MLP down projection), ``experts`` (routed experts: one fused 3-D tensor or a
ModuleList), ``shared_expert``; biases where present. Any subset may be chosen, to measure how much of an
effect each writer carries alone and jointly. A tied unembedding is untied first and kept unchanged.

Exactness: with every writer selected, the baked model equals hook ablation (:class:`DirectionalAblation`)
up to float rounding. Families that normalise each sublayer's output (Gemma-2/3, OLMo-2:
``spec.post_sublayer_norms``) cannot be matched exactly: there we orthogonalise against the norm-weighted
direction (so the stream still has zero projection on the direction) and report the measured max logit
error against hook ablation; without ``allow_inexact=True`` that is an error, never a silent difference.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn
from jaxtyping import Float
from torch import Tensor

from interp.arch import has_module
from interp.bundle import Result, check_model
from interp.coerce import check_width
from interp.forward import batch_of, forward
from interp.hooking import count_hooks, module_hooks
from interp.models import Model, from_hf, offloaded
from steering._args import Layers, as_tensor, orthonormal, resolve_layers, unit

if TYPE_CHECKING:
    import pandas as pd

WRITERS = ("embed", "pos_embed", "attn", "mlp", "experts", "shared_expert")
_NORMED = ("attn", "mlp", "experts", "shared_expert")


@dataclass
class BakeResult(Result):
    """The edited model, what was edited, whether it is exact, and the measured logit error (when measured).
    ``removed``: per weight, the norm fraction an ablation took away; ``added``: per writer, the norm of the
    vector an addition (:func:`steering.bake_addition`) baked in."""

    model: Model
    writers: tuple[str, ...]
    edited: list[str]
    exact: bool
    max_logit_error: float | None = None
    rel_logit_error: float | None = None
    notes: list[str] = field(default_factory=list)
    removed: list[dict[str, Any]] = field(default_factory=list)
    added: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Which writers were edited, how many weights, exact or not, the measured logit error, the notes."""
        return {"writers": list(self.writers), "n_edited": len(self.edited), "exact": self.exact,
                "max_logit_error": self.max_logit_error, "rel_logit_error": self.rel_logit_error,
                "notes": list(self.notes)}

    def to_frame(self) -> pd.DataFrame:
        """One row per edited weight: ``writer``, ``layer`` (nullable int; none for the embeddings),
        ``parameter`` and ``removed`` (fraction of the weight's Frobenius norm the edit took away), or for a
        baked addition ``norm`` (of the vector added at that writer)."""
        import pandas as pd

        col = "norm" if self.added else "removed"
        frame = pd.DataFrame(self.added or self.removed, columns=["writer", "layer", "parameter", col])
        frame["layer"] = frame["layer"].astype("Int64")
        return frame

    def plot(self, title: str | None = None) -> Any:
        """Weight removed (or vector norm added) per writer by layer, and the measured logit error against hooks."""
        from interp.viz.generations import bake_summary

        rows, col = (self.added, "norm") if self.added else (self.removed, "removed")
        label = "norm of the added vector" if self.added else "removed fraction of ||W||"
        return bake_summary([r["writer"] for r in rows], [r["layer"] for r in rows], [r[col] for r in rows],
                            self.max_logit_error, self.rel_logit_error, self.exact,
                            title=title or ("baked addition" if self.added else "baked directional ablation"),
                            value_label=label)


@dataclass
class _Target:
    writer: str
    layer: int | None
    name: str           # parameter path, for the report
    module: nn.Module
    layout: str         # "linear" [d, in] | "rows" [..., d] (embedding, Conv1D) | "experts" | "experts_t"
    norm: nn.Module | None = None   # post-sublayer norm applied to this writer's output
    attr: str = "down_proj"         # fused experts: name of the 3-D output weight (bias: ``{attr}_bias``)


def as_basis(direction: Any, d_model: int, orthonormalize: bool = False) -> Float[Tensor, "k d"]:
    """A single direction ``[d]`` or an orthonormal basis ``[k, d]`` (float64, rows orthonormal)."""
    t = as_tensor(direction, "direction")
    is_obj = hasattr(direction, "vectors") and not isinstance(direction, Tensor)
    if t.dim() == 2 and is_obj and t.shape[0] > 1:
        raise ValueError(f"bake needs one direction (or one subspace basis) for the whole model, got per-layer "
                         f"vectors {tuple(t.shape)}; pick one: direction.vectors[layer]")
    if t.dim() == 1:
        t = unit(t.double(), "direction")[None]
    elif t.dim() == 2:
        t = orthonormal(t.double(), "basis", orthonormalize)
        if t.shape[0] == 1:
            t = unit(t[0], "direction")[None]
    else:
        raise ValueError(f"direction must be [d] or a basis [k, d], got shape {tuple(t.shape)}")
    check_width(t, d_model, "direction", "the model's residual stream has")
    return t


def resolve_writers(writers: str | Sequence[str]) -> tuple[str, ...]:
    if isinstance(writers, str):
        if writers == "all":
            return WRITERS
        writers = [writers]
    items = list(writers)
    bad = [w for w in items if w not in WRITERS]
    if bad or not items:
        raise ValueError(f"unknown writers {bad or items}; choose any of {WRITERS} or 'all'")
    return tuple(dict.fromkeys(items))


def _moe_here(model: Model, layer: int) -> bool:
    return model.spec.experts is not None and has_module(model.block(layer), model.spec.experts)


def _norm_for(model: Model, path: str, layer: int) -> nn.Module | None:
    return model.module(path, layer) if model.spec.post_sublayer_norms else None


def _targets(model: Model, writers: tuple[str, ...], layers: list[int]) -> list[_Target]:
    spec, out = model.spec, []
    if "embed" in writers:
        out.append(_Target("embed", None, f"{spec.embed}.weight", model.module(spec.embed), "rows"))
    if "pos_embed" in writers and spec.pos_embed is not None:
        out.append(_Target("pos_embed", None, f"{spec.pos_embed}.weight", model.module(spec.pos_embed), "rows"))
    pre = spec.layers
    for L in layers:
        if "attn" in writers:
            out.append(_Target("attn", L, f"{pre}.{L}.{spec.attn_proj}", model.module(spec.attn_proj, L),
                               "rows" if spec.conv1d else "linear", _norm_for(model, spec.attn_out, L)))
        moe = _moe_here(model, L)
        if "mlp" in writers and not moe:
            path = spec.mlp_proj or f"{spec.mlp}.down_proj"
            if has_module(model.block(L), path):
                out.append(_Target("mlp", L, f"{pre}.{L}.{path}", model.module(path, L),
                                   "rows" if spec.conv1d else "linear", _norm_for(model, spec.mlp_out, L)))
        if "experts" in writers and moe:
            ex = model.module(spec.experts, L)
            norm = _norm_for(model, spec.mlp_out, L)
            w = getattr(ex, spec.expert_down, None)
            if isinstance(w, nn.Parameter) and w.dim() == 3:
                lay = "experts_t" if getattr(ex, "is_transposed", False) else "experts"
                out.append(_Target("experts", L, f"{pre}.{L}.{spec.experts}.{spec.expert_down}", ex, lay, norm,
                                   spec.expert_down))
            elif isinstance(ex, nn.ModuleList):
                for e, mod in enumerate(ex):
                    down = getattr(mod, spec.expert_down, None) or getattr(mod, "w2", None)
                    if not isinstance(down, nn.Linear):
                        raise ValueError(f"expert {e} of layer {L} has no Linear {spec.expert_down!r}; set "
                                         f"ArchSpec.expert_down to the name of its output projection")
                    out.append(_Target("experts", L, f"{pre}.{L}.{spec.experts}.{e}.{spec.expert_down}", down,
                                       "linear", norm))
            else:
                raise ValueError(f"cannot find the routed experts' output weights at {spec.experts}.{spec.expert_down} "
                                 f"in layer {L}; set ArchSpec.experts / expert_down")
        if "shared_expert" in writers and moe and spec.shared_expert and has_module(model.block(L), spec.shared_expert):
            down = getattr(model.module(spec.shared_expert, L), "down_proj", None)
            if not isinstance(down, nn.Linear):
                raise ValueError(f"the shared expert of layer {L} has no Linear down_proj")
            out.append(_Target("shared_expert", L, f"{pre}.{L}.{spec.shared_expert}.down_proj", down, "linear",
                               _norm_for(model, spec.mlp_out, L)))
    return out


def _effective_basis(Q: Tensor, norm: nn.Module | None, d: int) -> Tensor:
    """With a norm after the writer, output . q  is proportional to (gain * q) . y: orthogonalise y against gain*Q."""
    if norm is None:
        return Q
    p = next(norm.parameters())
    with torch.no_grad():
        gain = norm(torch.ones(1, 1, d, dtype=p.dtype, device=p.device)).reshape(d).double().cpu()
    G = Q * gain[None, :]
    q, _ = torch.linalg.qr(G.T)
    return q.T


def _orth_(t: Tensor, Q: Tensor, out_dim: int, weight: float = 1.0) -> None:
    """In place: remove span(Q) from dimension ``out_dim`` (the residual-width one) of ``t``; ``weight`` removes that
    fraction of it (``x - w Q^T Q x``: the weighted ablation of :mod:`steering.abliteration`)."""
    cdt = torch.float64 if t.numel() <= (1 << 24) or t.dtype == torch.float64 else torch.float32
    Qd = Q.to(t.device, cdt)
    x = t.data.to(cdt).movedim(out_dim, -1)
    x = x - weight * ((x @ Qd.T) @ Qd)
    t.data.copy_(x.movedim(-1, out_dim).to(t.dtype))


def _edit(target: _Target, Q: Tensor, weight: float = 1.0) -> None:
    mod, lay = target.module, target.layout
    with torch.no_grad():
        if lay in ("linear", "rows"):
            _orth_(mod.weight, Q, 0 if lay == "linear" else mod.weight.dim() - 1, weight)
            if getattr(mod, "bias", None) is not None:
                _orth_(mod.bias, Q, 0, weight)
        else:
            w = getattr(mod, target.attr)
            for e in range(w.shape[0]):  # one expert at a time bounds the float64 copy
                _orth_(w[e], Q, 0 if lay == "experts" else 1, weight)
            b = getattr(mod, f"{target.attr}_bias", None)
            if isinstance(b, Tensor):
                _orth_(b, Q, 1, weight)


def _removed_fraction(target: _Target, edit: Any) -> float:
    """Run ``edit`` and return ``||W - W'|| / ||W||`` of the writer's main weight. The edit is an orthogonal
    projection, so ``||W - W'||^2 = ||W||^2 - ||W'||^2`` and no copy of the weight is needed."""
    w = target.module.weight if target.layout in ("linear", "rows") else getattr(target.module, target.attr)
    before = float(w.detach().double().pow(2).sum())
    edit()
    after = float(w.detach().double().pow(2).sum())
    return math.sqrt(max(before - after, 0.0) / before) if before > 0 else 0.0


def _untie(model: Model) -> bool:
    hf = model.hf
    out_emb, in_emb = hf.get_output_embeddings(), hf.get_input_embeddings()
    if out_emb is None or out_emb.weight.data_ptr() != in_emb.weight.data_ptr():
        return False
    out_emb.weight = nn.Parameter(in_emb.weight.detach().clone(), requires_grad=in_emb.weight.requires_grad)
    for cfg in {id(c): c for c in (hf.config, hf.config.get_text_config())}.values():
        cfg.tie_word_embeddings = False
    return True


def _probe_ids(model: Model, check_ids: Tensor | None) -> Tensor:
    if check_ids is not None:
        return check_ids.to(model.device)
    g = torch.Generator().manual_seed(0)
    vocab = int(model.hf.get_input_embeddings().weight.shape[0])
    return torch.randint(0, vocab, (2, 16), generator=g).to(model.device)


def _logits(model: Model, ids: Tensor) -> Tensor:
    out = forward(model, batch_of(model, ids))
    assert out is not None
    return out


@contextmanager
def ablate_writers(model: Model, direction: Any, writers: str | Sequence[str] = "all",
                   layers: Layers = "all") -> Iterator[None]:
    """Hook-side reference of :func:`bake`: project the direction out of each chosen writer's *output*
    (embedding, attention / MLP / experts / shared-expert output, after a post-sublayer norm if any)."""
    Q = as_basis(direction, model.d_model).float()
    ws = resolve_writers(writers)
    Ls = resolve_layers(layers, model.n_layers, what="ablate_writers")
    spec, mods = model.spec, []
    if "embed" in ws:
        mods.append(model.module(spec.embed))
    if "pos_embed" in ws and spec.pos_embed:
        mods.append(model.module(spec.pos_embed))
    for L in Ls:
        moe = _moe_here(model, L)
        if "attn" in ws:
            mods.append(model.module(spec.attn_out, L))
        if "mlp" in ws and not moe:
            mods.append(model.module(spec.mlp_out, L))
        if moe and "experts" in ws and "shared_expert" in ws:
            mods.append(model.module(spec.mlp_out, L))
        elif moe and "experts" in ws:
            mods.append(model.module(spec.experts, L))
        elif moe and "shared_expert" in ws and spec.shared_expert:
            mods.append(model.module(spec.shared_expert, L))

    def hook(mod: nn.Module, args: tuple, out: Any) -> Any:
        x = out[0] if isinstance(out, tuple) else out
        Qx = Q.to(x.device)
        y = (x.float() - (x.float() @ Qx.T) @ Qx).to(x.dtype)
        return (y, *out[1:]) if isinstance(out, tuple) else y

    with module_hooks([(m, "post", hook) for m in mods]):
        yield


def _check_writers(model: Model, ws: tuple, targets: list, explicit: bool, allow_inexact: bool
                   ) -> tuple[tuple, list]:
    """The writers present in the model (an explicit request that matches nothing is an error) and the
    targets that sit before a post-sublayer norm (inexact to bake; refused unless ``allow_inexact``)."""
    present = {t.writer for t in targets}
    if explicit:
        missing = [w for w in ws if w not in present]
        if missing:
            hint = " (its MLPs are mixtures of experts: use 'experts' / 'shared_expert')" if "mlp" in missing and \
                model.spec.is_moe else ""
            raise ValueError(f"writers {missing} match nothing in this {model.spec.family} model{hint}; "
                             f"it has {sorted(present) or 'none of them'}")
    ws = tuple(w for w in ws if w in present)
    inexact = [t for t in targets if t.norm is not None]
    if inexact and not allow_inexact:
        raise ValueError(
            f"{model.spec.family} normalises each sublayer's output (post_sublayer_norms), so baking the "
            f"{sorted({t.writer for t in inexact})} writers cannot reproduce hook ablation exactly: the baked model "
            f"still has zero projection on the direction, but the norm rescales the rest. Pass allow_inexact=True "
            f"to bake anyway and get the measured max logit error, or ablate with hooks "
            f"(steering.apply(model, steering.DirectionalAblation(r))).")
    return ws, inexact


def check_in_memory(model: Model, what: str = "bake") -> None:
    """Refuse a model whose weights a ``device_map`` offloaded (to the CPU or disk): they sit on the meta device
    outside the forward pass, so an edit there would be lost. A model split across real devices is fine."""
    names = offloaded(model)
    if names:
        raise ValueError(f"{what} edits weights in memory, but {len(names)} parameters of this model are offloaded by its "
                         f"device_map (e.g. {names[0]}); {what} a plain copy: {what}(interp.models.materialize(model), "
                         f"...) (the whole model in CPU memory), or load it without disk / CPU offload")


def _hook_free_copy(model: Model) -> Model:
    """A deep copy of the model; refused while hooks are attached, so the copy cannot carry them."""
    n = count_hooks(model.hf, ours_only=True)
    if n:
        raise RuntimeError(f"the model has {n} forward hooks attached (inside steering.apply or interp.hooks?); "
                           f"bake outside those blocks so the copy does not carry them")
    return from_hf(copy.deepcopy(model.hf), model.tokenizer, name=f"{model.name}+baked")


def bake(model: Model, direction: Any, writers: str | Sequence[str] = "all", layers: Layers = "all",
         inplace: bool = False, allow_inexact: bool = False, measure: bool | None = None,
         check_ids: Tensor | None = None, orthonormalize: bool = False) -> BakeResult:
    """Orthogonalise the chosen residual writers against ``direction`` (``[d]``, or a basis ``[k, d]``).

    Returns a :class:`BakeResult` whose ``.model`` is a copy (or ``model`` itself with ``inplace=True``).
    ``measure`` (default: only when inexact) runs ``check_ids`` (default 2 x 16 random tokens) through the
    baked model and through hook ablation of the same writers, and reports the max logit difference. A model
    split across devices by a ``device_map`` is edited where each weight lives; one with offloaded weights is
    refused (bake ``interp.models.materialize(model)``).
    """
    model.require_local("the weight edit (bake)")
    check_in_memory(model)
    check_model(direction, model, "the baked direction")
    Q = as_basis(direction, model.d_model, orthonormalize)
    ws = resolve_writers(writers)
    explicit = writers != "all"
    Ls = resolve_layers(layers, model.n_layers, what="bake")
    targets = _targets(model, ws, Ls)
    ws, inexact = _check_writers(model, ws, targets, explicit, allow_inexact)
    exact = not inexact
    if measure is None:
        measure = not exact
    ids = _probe_ids(model, check_ids) if measure else None
    ref = None
    if measure:
        with ablate_writers(model, Q, ws, Ls):
            ref = _logits(model, ids)
    out = model if inplace else _hook_free_copy(model)
    notes: list[str] = []
    if "embed" in ws and _untie(out):
        notes.append("untied the embedding from the unembedding (lm_head keeps the original weights)")
    d = out.d_model
    targets = _targets(out, ws, Ls)
    removed = []
    for t in targets:
        removed.append({"writer": t.writer, "layer": t.layer, "parameter": t.name,
                        "removed": _removed_fraction(t, lambda t=t: _edit(t, _effective_basis(Q, t.norm, d)))})
    if inexact:
        notes.append(f"post-sublayer norms: {len(inexact)} writers orthogonalised against the norm-weighted "
                     f"direction; not equal to hook ablation")
    res = BakeResult(out, ws, [t.name for t in targets], exact, notes=notes, removed=removed)
    if measure:
        got = _logits(out, ids)
        err = (got - ref).abs().max().item()
        res.max_logit_error = err
        res.rel_logit_error = err / max(ref.abs().max().item(), 1e-30)
        if not exact:
            warnings.warn(f"baked {model.spec.family} differs from hook ablation: max logit error {err:.3g} "
                          f"(relative {res.rel_logit_error:.3g}) on the probe tokens", stacklevel=2)
    return res
