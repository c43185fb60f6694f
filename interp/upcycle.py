"""Sparse upcycling: a dense Llama-family model turned into an HF ``qwen2_moe`` mixture of experts.

Every routed expert of a mixture-of-experts layer starts as a copy of that layer's dense MLP, the router is a
seeded random projection and ``norm_topk_prob=True`` makes the top-k weights sum to one, so before any
diversification the upcycled model computes what the dense one does (to float32 rounding); the shared expert, a
small seeded MLP, starts with a zero output projection (exact too). Layers in ``dense_layers`` keep the original
MLP (``mlp_only_layers``). ``drop`` then diversifies the experts reproducibly (drop-upcycling: for each expert a
seeded fraction of its intermediate units is re-initialised with the original weights' scale), so every
expert weight is regenerated from the base model and the seed, never stored.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from interp.arch import spec_for

# ``interp.models`` imports this module (``load_model`` of an upcycled organism), so no import of it here: a
# ``Model`` is rebuilt through ``type(model)`` and the loading functions are passed in by ``load_model``.
Model = Any   # interp.models.Model

DENSE_FAMILIES = ("llama",)


@dataclass(frozen=True)
class UpcycleConfig:
    """How to upcycle: ``n_experts`` routed experts per layer, ``top_k`` of them per token, ``dense_layers`` kept
    dense, a shared expert of ``shared`` intermediate units (its output starts at zero), ``drop`` the fraction of
    each expert's intermediate units re-initialised (0: exact copies), ``router_std`` the seeded router's scale."""

    n_experts: int = 4
    top_k: int = 2
    dense_layers: tuple[int, ...] = (0, 1)
    shared: int = 64
    drop: float = 0.0
    router_std: float = 0.02
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k must be within 1..n_experts ({self.n_experts}), got {self.top_k}")
        if not 0.0 <= self.drop < 1.0:
            raise ValueError(f"drop is a fraction of intermediate units in [0, 1), got {self.drop}")
        if self.shared < 1:
            raise ValueError(f"shared must be >= 1 (qwen2_moe always has a shared expert; it starts with a zero "
                             f"output, so a small one, e.g. 1, changes nothing), got {self.shared}")

    def record(self) -> dict[str, Any]:
        return asdict(self)


def moe_config(dense: Any, cfg: UpcycleConfig) -> Any:
    """The ``Qwen2MoeConfig`` of ``dense`` (a Llama config) upcycled as ``cfg`` says."""
    from transformers import Qwen2MoeConfig

    n = int(dense.num_hidden_layers)
    bad = [i for i in cfg.dense_layers if not 0 <= i < n]
    if bad:
        raise ValueError(f"dense_layers {bad} are outside 0..{n - 1}")
    if getattr(dense, "attention_bias", False) or getattr(dense, "mlp_bias", False):
        raise ValueError("this Llama has biases in attention or MLP; qwen2_moe's MLP and output projection have "
                         "none, so it cannot be upcycled exactly")
    return Qwen2MoeConfig(
        vocab_size=dense.vocab_size, hidden_size=dense.hidden_size, intermediate_size=dense.intermediate_size,
        num_hidden_layers=n, num_attention_heads=dense.num_attention_heads,
        num_key_value_heads=dense.num_key_value_heads, hidden_act=dense.hidden_act,
        max_position_embeddings=dense.max_position_embeddings, rms_norm_eps=dense.rms_norm_eps,
        tie_word_embeddings=bool(dense.tie_word_embeddings), rope_parameters=dict(dense.rope_parameters),
        qkv_bias=False, decoder_sparse_step=1, moe_intermediate_size=dense.intermediate_size,
        shared_expert_intermediate_size=cfg.shared, num_experts=cfg.n_experts, num_experts_per_tok=cfg.top_k,
        norm_topk_prob=True, mlp_only_layers=sorted(cfg.dense_layers),
        bos_token_id=dense.bos_token_id, eos_token_id=dense.eos_token_id, pad_token_id=dense.pad_token_id)


def _check_dense(model: Model) -> None:
    family = model.spec.family
    if model.spec.is_moe:
        raise ValueError(f"{model.name!r} is already a mixture of experts ({family}); upcycle its dense original "
                         f"(e.g. load_model('smollm2-base')), not an upcycled or MoE model")
    if family not in DENSE_FAMILIES:
        raise ValueError(f"upcycling supports dense {DENSE_FAMILIES} models, got family {family!r}; load a "
                         f"Llama-family model (SmolLM2 is one)")


def _dropped(w_in: torch.Tensor, w_out: torch.Tensor, frac: float, gen: torch.Generator
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of an expert's in-projection rows ``[I, d]`` (gate or up, stacked ``[2, I, d]``) and down columns
    ``[d, I]`` with a seeded ``frac`` of the intermediate units re-initialised at the weights' own scale."""
    w_in, w_out = w_in.clone(), w_out.clone()
    n_units = w_out.shape[1]
    k = int(round(frac * n_units))
    if k == 0:
        return w_in, w_out
    idx = torch.randperm(n_units, generator=gen)[:k]
    for j in range(w_in.shape[0]):
        std = float(w_in[j].std())
        w_in[j, idx] = torch.randn(k, w_in.shape[2], generator=gen) * std
    w_out[:, idx] = torch.randn(w_out.shape[0], k, generator=gen) * float(w_out.std())
    return w_in, w_out


def _fill_moe_mlp(moe_mlp: torch.nn.Module, dense_mlp: torch.nn.Module, cfg: UpcycleConfig,
                  gen: torch.Generator) -> None:
    gate, up, down = dense_mlp.gate_proj.weight, dense_mlp.up_proj.weight, dense_mlp.down_proj.weight
    w_in = torch.stack([gate, up])
    for e in range(cfg.n_experts):
        wi, wo = _dropped(w_in, down, cfg.drop, gen)
        moe_mlp.experts.gate_up_proj[e].copy_(torch.cat([wi[0], wi[1]], 0))
        moe_mlp.experts.down_proj[e].copy_(wo)
    d = gate.shape[1]
    moe_mlp.gate.weight.copy_(torch.randn(cfg.n_experts, d, generator=gen) * cfg.router_std)
    sh = moe_mlp.shared_expert
    sh.gate_proj.weight.copy_(torch.randn(cfg.shared, d, generator=gen) * float(gate.std()))
    sh.up_proj.weight.copy_(torch.randn(cfg.shared, d, generator=gen) * float(up.std()))
    sh.down_proj.weight.zero_()
    moe_mlp.shared_expert_gate.weight.zero_()


def upcycle(model: Model, config: UpcycleConfig = UpcycleConfig()) -> Model:
    """``model`` (a dense Llama-family :class:`Model`) as a ``qwen2_moe`` model upcycled by ``config``: the same
    embeddings, attention and norms; each MoE layer's experts copies of its MLP (diversified by ``config.drop``),
    a seeded router, a shared expert with a zero output. Deterministic in (weights, config). With ``drop=0`` its
    logits equal the dense model's to float32 rounding."""
    from transformers import Qwen2MoeForCausalLM

    _check_dense(model)
    dense = model.hf
    moe_cfg = moe_config(dense.config, config)
    gen = torch.Generator().manual_seed(config.seed)
    with torch.no_grad():
        hf = Qwen2MoeForCausalLM(moe_cfg).to(model.dtype)
        src, dst = dense.model, hf.model
        dst.embed_tokens.weight.copy_(src.embed_tokens.weight)
        dst.norm.weight.copy_(src.norm.weight)
        if not moe_cfg.tie_word_embeddings:
            hf.lm_head.weight.copy_(dense.lm_head.weight)
        for i, (a, b) in enumerate(zip(src.layers, dst.layers, strict=True)):
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(b.self_attn, name).weight.copy_(getattr(a.self_attn, name).weight)
            b.input_layernorm.weight.copy_(a.input_layernorm.weight)
            b.post_attention_layernorm.weight.copy_(a.post_attention_layernorm.weight)
            if i in config.dense_layers:
                b.mlp.load_state_dict(a.mlp.state_dict())
            else:
                _fill_moe_mlp(b.mlp, a.mlp, config, gen)
    if moe_cfg.tie_word_embeddings:
        hf.tie_weights()
    hf.generation_config = dense.generation_config
    hf = hf.to(model.device).eval()
    return type(model)(hf=hf, tokenizer=model.tokenizer, spec=spec_for(hf), name=f"{model.name}-moe")


def add_dense_adapter(model: Model, folder: Path) -> Model:
    """Merge a LoRA adapter trained on the dense model (a peft folder: q/k/v/o and gate/up/down projections)
    into its upcycled ``model``, in place: attention deltas onto attention, MLP deltas onto a dense layer's MLP
    and onto every routed expert's copy of it (the shared expert, which the dense model lacks, gets none)."""
    from safetensors.torch import load_file

    cfg = json.loads((folder / "adapter_config.json").read_text())
    if cfg.get("use_rslora") or cfg.get("use_dora"):
        raise ValueError(f"{folder}: only plain LoRA adapters can be added (no rsLoRA / DoRA)")
    scale = float(cfg["lora_alpha"]) / float(cfg["r"])
    state = load_file(str(folder / "adapter_model.safetensors"))
    with torch.no_grad():
        for key, a in state.items():
            if ".lora_A." not in key:
                continue
            path = key.split("base_model.model.", 1)[1].split(".lora_A.")[0]   # model.layers.14.mlp.up_proj
            delta = (state[key.replace(".lora_A.", ".lora_B.")] @ a) * scale
            _add_delta(model, path, delta)
    return model


def _add_delta(model: Model, path: str, delta: torch.Tensor) -> None:
    parts = path.split(".")
    layer, kind, proj = int(parts[2]), parts[3], parts[4]
    block = model.block(layer)
    owner = getattr(block, kind)
    if kind == "self_attn" or not hasattr(owner, "experts"):
        getattr(owner, proj).weight.add_(delta.to(model.dtype))
        return
    experts = owner.experts
    if proj == "down_proj":
        experts.down_proj.add_(delta.to(model.dtype))      # broadcast over the expert axis
        return
    rows = slice(0, experts.intermediate_dim) if proj == "gate_proj" else slice(experts.intermediate_dim, None)
    experts.gate_up_proj[:, rows].add_(delta.to(model.dtype))


def upcycle_from(folder: Path, base: Model) -> Model:
    """``base`` (the dense model) upcycled as ``folder/upcycle.json`` says (no adapter yet)."""
    path = folder / "upcycle.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; regenerate the organism with "
                                f"`python -m interp.organisms.train_smollm2_moe --out {folder}`")
    cfg = json.loads(path.read_text())
    cfg["dense_layers"] = tuple(cfg["dense_layers"])
    return upcycle(base, UpcycleConfig(**cfg))


def load_upcycled(folder: Path, base: Model, with_adapter: Callable[..., Model], name: str) -> Model:
    """An upcycled organism (``interp.models.UPCYCLED``; ``load_model`` passes its dense ``base`` and
    ``with_adapter``): ``base`` upcycled from the committed seed and config (``upcycle.json``), the ``benign``
    adapter merged into the weights, then the ``safety`` adapter (trained on that merged MoE model) merged."""
    need = [folder / "upcycle.json", folder / "benign" / "adapter_config.json", folder / "safety" / "adapter_config.json"]
    missing = [str(p.relative_to(folder)) for p in need if not p.exists()]
    if missing:
        raise FileNotFoundError(f"{name}: {missing} missing under {folder}; regenerate them with "
                                f"`python -m interp.organisms.train_smollm2_moe --out {folder}`")
    model = with_adapter(upcycle_from(folder, base), folder / "benign", merge=True, name=name)
    return with_adapter(model, folder / "safety", merge=True, name=name)


__all__ = ["UpcycleConfig", "add_dense_adapter", "load_upcycled", "moe_config", "upcycle", "upcycle_from"]
