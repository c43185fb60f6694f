"""Independent views of the same weights (TransformerLens, nnsight), for cross-checks and benchmarks.

TransformerLens gets a hand-written ``HookedTransformerConfig`` and its own weight conversion, so nothing
is downloaded; nnsight wraps the HF module tree as it is.
"""

from __future__ import annotations

from typing import Any

from interp.extras import import_extra
from interp.models import Model

TL_FAMILIES = ("gpt2", "llama", "mistral", "qwen2")


def transformer_lens_model(model: Model) -> Any:
    """A ``HookedTransformer`` holding ``model``'s weights unprocessed (no LayerNorm folding or centring)."""
    import_extra("transformer_lens", "the TransformerLens oracle (a HookedTransformer of TransformerLens 3)")
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained import weight_conversions as wc

    c = model.config
    fam = model.spec.family
    base = dict(d_model=model.d_model, n_layers=model.n_layers, n_heads=model.n_heads, d_head=model.d_head,
                d_vocab=c.vocab_size, dtype=model.dtype, device=str(model.device), default_prepend_bos=False)
    if fam == "gpt2":
        cfg = HookedTransformerConfig(**base, d_mlp=4 * model.d_model if c.n_inner is None else c.n_inner,
                                      n_ctx=c.n_positions, act_fn="gelu_new", normalization_type="LN",
                                      eps=c.layer_norm_epsilon, positional_embedding_type="standard",
                                      original_architecture="GPT2LMHeadModel")
        sd = wc.convert_gpt2_weights(model.hf, cfg)
    elif fam in ("llama", "mistral", "qwen2"):
        cfg = HookedTransformerConfig(
            **base, d_mlp=c.intermediate_size, n_ctx=c.max_position_embeddings, act_fn="silu",
            normalization_type="RMS", eps=c.rms_norm_eps, positional_embedding_type="rotary", rotary_dim=model.d_head,
            rotary_base=_rope_theta(c), gated_mlp=True, final_rms=True,
            n_key_value_heads=model.n_kv_heads if model.n_kv_heads != model.n_heads else None,
            original_architecture={"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                                   "qwen2": "Qwen2ForCausalLM"}[fam],
        )
        convert = {"llama": wc.convert_llama_weights, "mistral": wc.convert_mistral_weights,
                   "qwen2": wc.convert_qwen2_weights}[fam]
        sd = convert(model.hf, cfg)
    else:
        raise ValueError(f"no TransformerLens view for family {fam!r}; supported: {TL_FAMILIES}")
    tl = HookedTransformer(cfg)
    sd.setdefault("unembed.b_U", tl.unembed.b_U.detach().clone().zero_())
    missing, unexpected = tl.load_state_dict(sd, strict=False)
    bad = [k for k in missing if not k.endswith(("IGNORE", "mask", "rotary_sin", "rotary_cos"))]
    if bad or unexpected:
        raise RuntimeError(f"TransformerLens conversion mismatch: missing={bad[:5]} unexpected={unexpected[:5]}")
    return tl.eval()


def _rope_theta(c: Any) -> float:
    rp = getattr(c, "rope_parameters", None) or {}
    return float(rp.get("rope_theta", getattr(c, "rope_theta", 10000.0)))


def nnsight_model(model: Model) -> Any:
    """``nnsight.NNsight`` wrapping the HF module tree (read ``.output`` of modules inside ``trace``)."""
    import nnsight

    return nnsight.NNsight(model.hf)


_SITE_SUFFIX = {"resid_pre": "hook_resid_pre", "resid_mid": "hook_resid_mid", "resid_post": "hook_resid_post",
                "attn_out": "hook_attn_out", "mlp_out": "hook_mlp_out", "ln_final": "ln_final.hook_normalized",
                "attn_z": "attn.hook_z", "mlp_post": "mlp.hook_post"}
# the site groups a bridge / adapter comparison captures (one width per capture call)
CAPTURE_GROUPS = (("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "ln_final"), ("attn_z",),
                  ("mlp_post",))


def capture_gaps(a: Model, b: Model, prompts: list[str],
                 groups: tuple[tuple[str, ...], ...] = CAPTURE_GROUPS) -> dict[str, dict[str, float]]:
    """Per site kind, the largest absolute gap between two models' captures of ``prompts`` (all positions,
    one padded batch) and the largest value (the scale the gap is read against): ``{kind: {"abs", "scale"}}``."""
    from interp.capturing import capture
    from interp.values import Runtime

    out: dict[str, dict[str, float]] = {}
    for group in groups:
        x, y = (capture(m, prompts, sites=list(group), positions="all", runtime=Runtime(progress=False))
                for m in (a, b))
        if x.sites != y.sites:
            raise AssertionError(f"the two models capture different sites: {x.sites} vs {y.sites}")
        for kind in group:
            names = [s for s in x.sites if s.endswith(_SITE_SUFFIX.get(kind, kind))]
            gap = max(float((x.site(s) - y.site(s)).abs().max()) for s in names)
            scale = max(float(y.site(s).abs().max()) for s in names)
            out[kind] = {"abs": gap, "scale": scale}
    return out
