"""Architecture specs: a small declarative table per family saying where everything lives.

Paths are dotted attribute paths. Block-relative paths (``attn_out``, ``mlp_out``, ...) are relative
to one decoder block. ``*_out`` names the module whose *output* is what the block adds to the residual
stream (for Gemma-2/3 and OLMo-2 that is the post-sublayer norm, not the projection).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch.nn as nn


@dataclass(frozen=True)
class ArchSpec:
    family: str
    layers: str                              # ModuleList of decoder blocks
    embed: str                               # token embedding
    final_norm: str
    unembed: str
    attn: str                                # attention module (block-relative)
    attn_proj: str                           # attention output projection (block-relative)
    mlp: str                                 # MLP / MoE block (block-relative)
    mlp_proj: str | None                     # dense MLP down projection; None for MoE blocks
    attn_out: str                            # module whose output is the attention write to the residual
    mlp_out: str                             # module whose output is the MLP write to the residual
    resid_mid_in: str | None                 # module whose input[0] is resid_mid (None: parallel residual)
    resid_pre_in: str = "input_layernorm"    # module whose input (args[0] or hidden_states=) is resid_pre
    norms: tuple[str, ...] = ()              # block-relative norms
    pos_embed: str | None = None             # learned absolute positions (GPT-2)
    parallel_residual: bool = False          # x + attn(ln1 x) + mlp(ln2 x) (GPT-NeoX)
    post_sublayer_norms: bool = False        # norms applied to sublayer outputs (Gemma-2/3, OLMo-2)
    conv1d: bool = False                     # GPT-2 Conv1D weights are [in, out]
    norm_offset: float = 0.0                 # RMSNorm gain is ``norm_offset + weight`` (1.0 for Gemma)
    # mixture of experts (block-relative)
    router: str | None = None
    experts: str | None = None               # fused 3-D tensors (``gate_up_proj``/``down_proj``) or ModuleList
    expert_down: str = "down_proj"           # name of the writing weight inside ``experts``
    shared_expert: str | None = None
    shared_expert_gate: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def is_moe(self) -> bool:
        return self.experts is not None


_DECODER = dict(
    layers="model.layers", embed="model.embed_tokens", final_norm="model.norm", unembed="lm_head",
    attn="self_attn", attn_proj="self_attn.o_proj", mlp="mlp", mlp_proj="mlp.down_proj",
    attn_out="self_attn", mlp_out="mlp", resid_mid_in="post_attention_layernorm",
    norms=("input_layernorm", "post_attention_layernorm"),
)
_LLAMA = ArchSpec(family="llama", **_DECODER)
_SANDWICH = replace(
    _LLAMA, family="gemma2", attn_out="post_attention_layernorm", mlp_out="post_feedforward_layernorm",
    resid_mid_in="pre_feedforward_layernorm", post_sublayer_norms=True,
    norms=("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"),
)
_MOE = replace(_LLAMA, family="mixtral", mlp_proj=None, router="mlp.gate", experts="mlp.experts")

SPECS: dict[str, ArchSpec] = {
    "llama": _LLAMA,
    "mistral": replace(_LLAMA, family="mistral"),
    "qwen2": replace(_LLAMA, family="qwen2"),
    "qwen3": replace(_LLAMA, family="qwen3"),
    "phi3": replace(_LLAMA, family="phi3"),
    "gemma": replace(_LLAMA, family="gemma", norm_offset=1.0),
    "gemma2": replace(_SANDWICH, norm_offset=1.0),
    "gemma3_text": replace(_SANDWICH, family="gemma3_text", norm_offset=1.0),
    "olmo2": replace(
        _LLAMA, family="olmo2", attn_out="post_attention_layernorm", mlp_out="post_feedforward_layernorm",
        resid_mid_in="mlp", resid_pre_in="self_attn", post_sublayer_norms=True, norms=("post_attention_layernorm", "post_feedforward_layernorm"),
    ),
    "gpt2": ArchSpec(
        family="gpt2", layers="transformer.h", embed="transformer.wte", pos_embed="transformer.wpe",
        final_norm="transformer.ln_f", unembed="lm_head", attn="attn", attn_proj="attn.c_proj", mlp="mlp",
        mlp_proj="mlp.c_proj", attn_out="attn", mlp_out="mlp", resid_mid_in="ln_2", resid_pre_in="ln_1",
        norms=("ln_1", "ln_2"),
        conv1d=True,
    ),
    "gpt_neox": ArchSpec(
        family="gpt_neox", layers="gpt_neox.layers", embed="gpt_neox.embed_in", final_norm="gpt_neox.final_layer_norm",
        unembed="embed_out", attn="attention", attn_proj="attention.dense", mlp="mlp", mlp_proj="mlp.dense_4h_to_h",
        attn_out="attention", mlp_out="mlp", resid_mid_in=None, norms=("input_layernorm", "post_attention_layernorm"),
        parallel_residual=True,
    ),
    "mixtral": _MOE,
    "qwen2_moe": replace(_MOE, family="qwen2_moe", shared_expert="mlp.shared_expert",
                         shared_expert_gate="mlp.shared_expert_gate"),
    "qwen3_moe": replace(_MOE, family="qwen3_moe"),
    "olmoe": replace(_MOE, family="olmoe"),
}

REGISTER_HELP = """To register a spec for this architecture, a few lines suffice:

    from interp.arch import ArchSpec, register_spec, SPECS
    from dataclasses import replace
    register_spec("{model_type}", replace(SPECS["llama"], family="{model_type}",
        layers="model.layers", attn_proj="self_attn.o_proj", mlp_proj="mlp.down_proj"))

Fields name dotted module paths (block-relative ones for attention/MLP/norms); see interp/arch.py."""


def register_spec(model_type: str, spec: ArchSpec, replace: bool = False) -> None:
    """Register the spec used for HF configs whose ``model_type`` is ``model_type``.

    Replacing an existing spec (a built-in family, or one registered earlier) needs ``replace=True``, so a
    typo in ``model_type`` cannot silently change how a supported family is hooked."""
    if not isinstance(spec, ArchSpec):
        raise TypeError(f"register_spec takes an ArchSpec, got {type(spec).__name__}")
    if model_type in SPECS and not replace:
        raise ValueError(f"a spec for model_type {model_type!r} is already registered ({SPECS[model_type].family}); "
                         f"pass replace=True to replace it")
    SPECS[model_type] = spec


def get_module(root: nn.Module, path: str) -> nn.Module:
    mod = root
    for part in path.split("."):
        mod = mod[int(part)] if part.isdigit() else getattr(mod, part)
    return mod


def has_module(root: nn.Module, path: str | None) -> bool:
    if path is None:
        return False
    try:
        get_module(root, path)
        return True
    except (AttributeError, IndexError):
        return False


def _gpt_neox_parallel(model: nn.Module) -> bool:
    return bool(getattr(model.config, "use_parallel_residual", True))


def spec_for(model: nn.Module) -> ArchSpec:
    """The spec of an HF causal LM: registered by ``config.model_type``, else inferred, else a clear error."""
    cfg = getattr(model, "config", None)
    model_type = getattr(cfg, "model_type", None) or type(model).__name__
    spec = SPECS.get(model_type)
    if spec is None:
        spec = _infer(model, model_type)
    if spec.family == "gpt_neox" and not _gpt_neox_parallel(model):
        spec = replace(spec, parallel_residual=False, resid_mid_in="post_attention_layernorm")
    _validate(model, spec, model_type)
    return spec


def _infer(model: nn.Module, model_type: str) -> ArchSpec:
    """Try the standard layouts (Llama-like, MoE, GPT-2-like) and keep the first whose modules exist."""
    candidates = [_LLAMA, _SANDWICH, _MOE, SPECS["gpt2"], SPECS["gpt_neox"]]
    for cand in candidates:
        if not (has_module(model, cand.layers) and has_module(model, cand.embed) and has_module(model, cand.final_norm)):
            continue
        block = get_module(model, cand.layers)[0]
        paths = [cand.attn_proj, cand.attn_out, cand.mlp_out] + list(cand.norms)
        paths += [cand.mlp_proj] if cand.mlp_proj else [cand.experts]
        if all(has_module(block, p) for p in paths):
            return replace(cand, family=f"{model_type} (inferred from {cand.family})")
    raise ValueError(f"unknown architecture {model_type!r}: no registered spec and the module tree is not a "
                     f"standard layout.\n" + REGISTER_HELP.format(model_type=model_type))


def _validate(model: nn.Module, spec: ArchSpec, model_type: str) -> None:
    missing = [p for p in (spec.layers, spec.embed, spec.final_norm) if not has_module(model, p)]
    if not missing:
        blocks = get_module(model, spec.layers)
        block_paths = [spec.attn, spec.attn_proj, spec.mlp, spec.attn_out, spec.mlp_out, *spec.norms]
        block_paths += [spec.mlp_proj] if spec.mlp_proj else []
        missing = [p for p in block_paths if not has_module(blocks[0], p)]
        # a MoE model may keep some layers dense (qwen2_moe's mlp_only_layers): its MoE parts need one block
        missing += [p for p in (spec.router, spec.experts, spec.shared_expert)
                    if p and not any(has_module(b, p) for b in blocks)]
    if missing:
        raise ValueError(f"the {spec.family!r} spec does not fit this {model_type!r} model: missing modules "
                         f"{missing}.\n" + REGISTER_HELP.format(model_type=model_type))
