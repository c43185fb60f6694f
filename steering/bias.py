"""Bake additive steering into the weights: an ``AddVector`` becomes a bias on the residual writer at its site.

A bias on the module whose output a sublayer adds to the residual stream adds the same vector at every token of
every forward pass, so it equals hook addition with ``scope="both"``, ``positions="all"`` and no condition, up
to float rounding. Where each site's addition goes:

    resid_post L, mlp_out L     the MLP's output projection of layer L (down_proj, c_proj, dense_4h_to_h)
    resid_pre L (L > 0)         the same projection of layer L - 1 (it is the same stream)
    attn_out L, resid_mid L     the attention output projection of layer L (o_proj, c_proj, dense)
    resid_pre 0                 every row of the token embedding (over its scale, where it has one)

Where the writer has no bias one is added, and the config flag that makes ``from_pretrained`` build it
(``attention_bias``, ``mlp_bias``) is set, so the baked model saves with ``save_pretrained`` and reloads with
transformers alone (and serves unchanged in vLLM, TGI, or llama.cpp through :mod:`steering.gguf_export`). The
flag also gives the sibling projections (q/k/v, gate/up) zero biases. Where the config has no such flag
(Mistral, Qwen2, Phi-3, Mixtral and Qwen2-MoE attention; every MLP but Llama's, GPT-2's and GPT-NeoX's) the bias
is still added, as a parameter of the writer's ``nn.Linear``: exact in memory (equal to hooks to float32
rounding), but a saved folder would reload without it in plain transformers, so ``BakeResult.notes`` says so and
every path that saves or serves the model (:func:`steering.serve.save_for_serving` / ``baked_for_serving``,
:func:`steering.export_gguf`, the refusal pipeline's saved model) refuses it through :func:`check_saveable`,
naming the fix: bake at ``resid_pre 0`` (the embedding, which every family saves), or use a family whose config
has the flag. Refused outright, as not exact: a mixture-of-experts MLP (the router weighs a per-expert bias),
and families that normalise each sublayer's output (Gemma-2/3, OLMo-2: the norm would rescale the bias).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from interp.arch import get_module
from interp.models import Model
from interp.sites import Site, parse_site
from steering.applying import _flat, apply
from steering.baking import (
    BakeResult,
    _hook_free_copy,
    _logits,
    _moe_here,
    _probe_ids,
    _untie,
    check_in_memory,
)
from steering.interventions import AddVector

FLAGS = {"attn": "attention_bias", "mlp": "mlp_bias"}   # HF config flags that give a writer a bias
_KINDS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")


def additions(model: Model, *interventions: Any, what: str = "bake_addition") -> dict[Site, Tensor]:
    """``{site: float64 [d]}``: what the ``AddVector`` interventions add at each site (summed where several meet),
    refusing what a static bias cannot express (a scope, positions, a condition, another kind of edit)."""
    out: dict[Site, Tensor] = {}
    for iv in _flat(interventions):
        if not isinstance(iv, AddVector):
            raise TypeError(f"{what} takes steering.AddVector interventions, got {type(iv).__name__}; bake a "
                            f"directional ablation with steering.bake(model, direction)")
        if iv.scope != "both" or iv.positions != "all" or iv.condition is not None:
            raise ValueError(f"{what}: a bias adds at every token of every pass, so it equals AddVector only with "
                             f"scope='both', positions='all' and no condition (got scope={iv.scope!r}, positions="
                             f"{iv.positions!r}, condition={'set' if iv.condition is not None else None}); steer "
                             f"with hooks (steering.apply / steering.generate) for the rest")
        for name, edit in iv.site_edits(model).items():
            site = parse_site(name, model.n_layers)
            if site.kind not in _KINDS:
                raise ValueError(f"{what}: {site.name} is not one writer's output; add at one of {_KINDS}")
            b = edit.edit.b
            assert b is not None
            out[site] = out.get(site, torch.zeros_like(b, dtype=torch.float64)) + b.double().cpu()
    if not out:
        raise ValueError(f"{what} needs at least one steering.AddVector")
    return out


def writer_of(site: Site) -> tuple[str, int | None]:
    """The writer (``"embed"``, ``"attn"`` or ``"mlp"``, and its layer) whose bias adds at ``site``."""
    kind, layer = site.kind, site.layer
    assert layer is not None
    if kind == "resid_pre":
        return ("embed", None) if layer == 0 else ("mlp", layer - 1)
    return ("mlp", layer) if kind in ("resid_post", "mlp_out") else ("attn", layer)


def _writer_module(model: Model, writer: str, layer: int | None) -> nn.Module:
    spec = model.spec
    if writer == "embed":
        return model.module(spec.embed)
    assert layer is not None
    if spec.post_sublayer_norms:
        raise ValueError(f"{spec.family} normalises each sublayer's output ({spec.attn_out}, {spec.mlp_out}), so a bias "
                         f"on the writer would be rescaled by the norm and not equal hook addition; bake additions at "
                         f"resid_pre 0 (the embedding) only, or steer with hooks")
    if writer == "mlp" and _moe_here(model, layer):
        raise ValueError(f"layer {layer}'s MLP is a mixture of experts: a bias on each expert is weighed by the router, "
                         f"so it is not one addition; bake at attn_out / resid_mid of layer {layer}, or steer with hooks")
    return model.module(_path(model, writer), layer)


def _path(model: Model, writer: str) -> str:
    spec = model.spec
    return spec.attn_proj if writer == "attn" else (spec.mlp_proj or f"{spec.mlp}.down_proj")


def _give_biases(model: Model, writers: set[str]) -> list[str]:
    """Set the config flags for ``writers`` and add, as zeros, every bias the flagged config builds that the model
    lacks (so ``from_pretrained`` of a saved copy builds the same modules); the names added."""
    hf, fam = model.hf, model.spec.family
    cfg = copy.deepcopy(hf.config)
    for w in sorted(writers):
        setattr(cfg, FLAGS[w], True)
    from accelerate import init_empty_weights

    with init_empty_weights():
        ref = type(hf)(cfg)
    have = dict(hf.named_parameters(remove_duplicate=False))   # a tied lm_head.weight under its own name too
    added = []
    for name, p in ref.named_parameters():
        if name in have:
            continue
        path, attr = name.rsplit(".", 1)
        mod = get_module(hf, path)
        if attr != "bias" or getattr(mod, "bias", None) is not None:
            raise RuntimeError(f"setting {sorted(FLAGS[w] for w in writers)} on {fam} adds {name}, not a missing bias")
        _zero_bias(mod, p.shape)
        added.append(name)
    for w in writers:
        setattr(hf.config, FLAGS[w], True)
    return added


def _zero_bias(mod: nn.Module, shape: torch.Size) -> None:
    w = mod.weight
    mod.bias = nn.Parameter(torch.zeros(shape, dtype=w.dtype, device=w.device), requires_grad=w.requires_grad)


def _memory_biases(model: Model, keys: list[tuple[str, int | None]]) -> str:
    """Add zero biases to the writers ``keys`` whose config has no flag to build them; the note that says so."""
    for w, layer in keys:
        mod = _writer_module(model, w, layer)
        _zero_bias(mod, torch.Size([mod.weight.shape[0]]))
    flags = sorted({FLAGS[w] for w, _ in keys})
    return (f"{model.spec.family}: the {type(model.hf.config).__name__} has no {' / '.join(flags)} flag, so "
            f"{len(keys)} writer biases live in memory only (exact here): a saved folder would not reload them in "
            f"plain transformers, and save_for_serving / export_gguf refuse this model; to save, bake at resid_pre 0 "
            f"(the embedding) or use a family whose config has the flag")


def memory_only(model: Model) -> list[str]:
    """Parameters of ``model`` that its config does not build (a bias :func:`bake_addition` added where the config
    has no flag for it): ``from_pretrained`` of a saved folder would drop them."""
    from accelerate import init_empty_weights
    from transformers import PreTrainedModel

    hf = model.hf
    if not isinstance(hf, PreTrainedModel):   # a peft wrapper saves its adapter, not these modules
        return []
    with init_empty_weights():
        ref = type(hf)(copy.deepcopy(hf.config))
    built = {name for name, _ in ref.named_parameters(remove_duplicate=False)}
    return [name for name, _ in hf.named_parameters() if name not in built]


def check_saveable(model: Model, what: str) -> None:
    """Refuse, naming the reason and the fix, a model that a saved folder would not reproduce (:func:`memory_only`)."""
    names = memory_only(model)
    if names:
        raise ValueError(f"{what}: {len(names)} parameters of this {model.spec.family} model (e.g. {names[0]}) are not "
                         f"built by its {type(model.hf.config).__name__} (biases bake_addition added where the config has "
                         f"no attention_bias / mlp_bias flag), so a saved folder would load in plain transformers (vLLM, TGI, llama.cpp) without "
                         f"them: the steering would silently vanish; bake the addition at resid_pre 0 (the embedding, "
                         f"which every family saves), or use a family whose config has the flag (Llama; attention "
                         f"only: Qwen3, Qwen3-MoE, OLMoE), or steer with hooks (steering.generate)")


def _add_to(model: Model, writer: str, layer: int | None, v: Tensor) -> str:
    """Add ``v`` to the writer's output for every token: its bias, or every embedding row."""
    mod = _writer_module(model, writer, layer)
    with torch.no_grad():
        if writer == "embed":
            scale = getattr(mod, "embed_scale", None)
            u = v / (float(scale) if scale is not None else 1.0)
            mod.weight.add_(u.to(mod.weight.device, mod.weight.dtype)[None, :])
            return f"{model.spec.embed}.weight"
        mod.bias.copy_((mod.bias.double() + v.to(mod.bias.device)).to(mod.bias.dtype))
    return f"{model.spec.layers}.{layer}.{_path(model, writer)}.bias"


def bake_addition(model: Model, *interventions: Any, inplace: bool = False, measure: bool = True,
                  check_ids: Tensor | None = None) -> BakeResult:
    """Bake ``steering.AddVector`` interventions (scope ``"both"``, all positions) into biases of the residual writers.

    Returns a :class:`~steering.baking.BakeResult` whose ``.model`` is a copy (or ``model`` itself with
    ``inplace=True``) that equals ``steering.apply(model, *interventions)`` without hooks and saves with
    ``save_pretrained`` where the config has a flag for each added bias (set; else the bias lives in memory only, a
    note says so and the save / serve paths refuse the model: see the module docstring and :func:`check_saveable`). ``measure`` runs ``check_ids`` (default 2 x 16 random tokens) both ways and
    reports the max logit difference. Offloaded weights are refused (bake ``interp.models.materialize(model)``).
    """
    model.require_local("the weight edit (bake_addition)")
    check_in_memory(model, "bake_addition")
    adds = additions(model, *interventions)
    per_writer: dict[tuple[str, int | None], Tensor] = {}
    for site, v in adds.items():
        key = writer_of(site)
        per_writer[key] = per_writer.get(key, torch.zeros_like(v)) + v
    for w, layer in per_writer:
        _writer_module(model, w, layer)                       # refuse before copying anything
    ids = _probe_ids(model, check_ids) if measure else None
    ref = None
    if ids is not None:
        with apply(model, *interventions):
            ref = _logits(model, ids)
    out = model if inplace else _hook_free_copy(model)
    notes: list[str] = []
    missing = [k for k in per_writer if k[0] != "embed" and getattr(_writer_module(out, *k), "bias", None) is None]
    flagged = {w for w, _ in missing if hasattr(out.hf.config, FLAGS[w])}
    if flagged:
        added = _give_biases(out, flagged)
        notes.append(f"set config {', '.join(f'{FLAGS[w]}=True' for w in sorted(flagged))}: {len(added)} biases added "
                     f"(zeros but the writers') so from_pretrained of a saved copy builds them")
    unflagged = [k for k in missing if k[0] not in flagged]
    if unflagged:
        notes.append(_memory_biases(out, unflagged))
    if ("embed", None) in per_writer and _untie(out):
        notes.append("untied the embedding from the unembedding (lm_head keeps the original weights)")
    rows = [{"writer": w, "layer": layer, "parameter": _add_to(out, w, layer, v), "norm": float(v.norm())}
            for (w, layer), v in per_writer.items()]
    res = BakeResult(out, tuple(dict.fromkeys(w for w, _ in per_writer)), [r["parameter"] for r in rows], True,
                     notes=notes, added=rows)
    if ids is not None and ref is not None:
        err = (_logits(out, ids) - ref).abs().max().item()
        res.max_logit_error, res.rel_logit_error = err, err / max(ref.abs().max().item(), 1e-30)
    return res
