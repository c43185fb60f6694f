"""Bring a researcher's existing TransformerLens or nnsight model into the toolkit, same site names.

``from_nnsight(lm)`` wraps the HF model nnsight already holds (its module tree is the HF one), so
everything works exactly as on :func:`interp.models.from_hf`. ``from_transformer_lens(tl)`` keeps the
``HookedTransformer`` as it is and attaches our hooks to its own ``HookPoint`` modules (a HookPoint is an
identity module, so a PyTorch hook on it reads and replaces exactly what TransformerLens's hook would):
``blocks.{i}.hook_resid_pre/mid/post``, ``hook_attn_out``, ``hook_mlp_out``, ``mlp.hook_post`` and
``ln_final.hook_normalized`` hold what they hold in TransformerLens. A ``TransformerBridge`` (TransformerLens
3.x and 4.x) wraps an HF model, which we wrap directly (see :func:`from_transformer_lens`). Neither package
is imported here until an adapter is called; TransformerLens is the pip extra ``[transformer-lens]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from jaxtyping import Int

from interp.arch import ArchSpec, get_module
from interp.extras import import_extra
from interp.models import Model, from_hf
from interp.nnsight_backend import NNsightModel

_TL_NO_Z = ("attn_z through the TransformerLens adapter is not supported: TransformerLens computes the head "
            "outputs with one einsum, so no module reads the flattened z. Read it with the HookedTransformer's "
            "own `run_with_cache` / `hooks`, or wrap the HF model of the same weights with interp.from_hf")


@dataclass
class TLConfig:
    """The HF-style config fields :class:`~interp.models.Model` reads, taken from a ``HookedTransformerConfig``."""

    model_type: str
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int | None
    max_position_embeddings: int
    vocab_size: int
    _name_or_path: str


class TransformerLensLM(nn.Module):
    """An HF-call face on a ``HookedTransformer``: ``forward(input_ids, attention_mask, position_ids)``
    returns an object with ``.logits``, so the core's one forward layer and :mod:`interp.capture` run it
    unchanged. The HookedTransformer is the submodule ``tl``; its weights are not copied."""

    def __init__(self, tl: nn.Module):
        super().__init__()
        self.tl = tl
        self.generation_config = None  # TransformerLens generates through its own `generate`
        c = tl.cfg
        self.config = TLConfig(
            model_type="transformer_lens", hidden_size=int(c.d_model), num_attention_heads=int(c.n_heads),
            num_key_value_heads=int(getattr(c, "n_key_value_heads", None) or c.n_heads), head_dim=int(c.d_head),
            intermediate_size=None if c.d_mlp is None else int(c.d_mlp), max_position_embeddings=int(c.n_ctx),
            vocab_size=int(c.d_vocab), _name_or_path=str(getattr(c, "model_name", "") or "HookedTransformer"))

    def forward(self, input_ids: Int[torch.Tensor, "b t"], attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, use_cache: bool = False, logits_to_keep: int = 0,
                past_key_values: Any = None, **unused: Any) -> Any:
        """Logits ``[b, t or logits_to_keep, vocab]`` of TransformerLens's forward (left padding via the mask)."""
        from transformers.modeling_outputs import CausalLMOutput

        if past_key_values is not None or use_cache:
            raise ValueError("the TransformerLens adapter runs without a KV cache; pass use_cache=False")
        if position_ids is not None and attention_mask is not None:
            _check_positions(position_ids, attention_mask)
        logits = self.tl(input_ids, return_type="logits", attention_mask=attention_mask)
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return CausalLMOutput(logits=logits)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "steering.generate needs an HF model (KV cache, generation config). With the TransformerLens adapter, "
            "call the HookedTransformer's own `generate` inside `with steering.apply(model, ...)` (interventions "
            "with scope='both', positions='all'), or wrap the HF model of the same weights with interp.from_hf")


def _check_positions(position_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
    """TransformerLens derives positions from the attention mask; refuse position ids it would not use."""
    mask = attention_mask.bool()
    expected = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
    if not torch.equal(position_ids.to(expected.device)[mask], expected[mask]):
        raise ValueError("the TransformerLens adapter numbers positions from the attention mask (first real token "
                         "= 0); custom position_ids cannot be passed to a HookedTransformer")


@dataclass(repr=False)
class TransformerLensModel(Model):
    """A :class:`Model` whose ``hf`` is a :class:`TransformerLensLM`; sites resolve to TransformerLens's
    HookPoints. ``attn_z`` is refused (see the module docstring); weight baking is not available."""

    @property
    def d_model(self) -> int:
        return int(self.hf.config.hidden_size)

    def site_names(self) -> list[str]:
        return [s for s in super().site_names() if not s.endswith("attn.hook_z")]

    def module(self, path: str, layer: int | None = None) -> nn.Module:
        if path == self.spec.attn_proj:
            raise ValueError(_TL_NO_Z)
        return super().module(path, layer)


def transformer_lens_spec(tl: nn.Module) -> ArchSpec:
    """The spec mapping our site kinds onto a ``HookedTransformer``'s HookPoints (paths under ``tl.``)."""
    c = tl.cfg
    if getattr(c, "normalization_type", None) is None or not hasattr(tl, "ln_final"):
        raise ValueError("this HookedTransformer has no final norm (normalization_type=None), so "
                         "ln_final.hook_normalized does not exist; the adapter needs a normalised model")
    parallel = bool(getattr(c, "parallel_attn_mlp", False))
    moe = bool(getattr(c, "num_experts", None))
    return ArchSpec(
        family="transformer_lens", layers="tl.blocks", embed="tl.embed", final_norm="tl.ln_final",
        unembed="tl.unembed", attn="attn", attn_proj="attn.hook_z", mlp="mlp",
        mlp_proj=None if moe else "mlp.hook_post", attn_out="hook_attn_out", mlp_out="hook_mlp_out",
        resid_mid_in=None if parallel else "hook_resid_mid", resid_pre_in="hook_resid_pre", norms=("ln1", "ln2"),
        parallel_residual=parallel, experts="mlp.experts" if moe else None,
        extra={"normalized": "tl.ln_final.hook_normalized"},
    )


def from_transformer_lens(tl_model: Any, tokenizer: Any = None, name: str | None = None) -> Model:
    """Wrap a TransformerLens model: a 3.x ``HookedTransformer`` or a 3.x / 4.x ``TransformerBridge``.

    A ``TransformerBridge`` holds the HF model (``bridge.original_model``) with TransformerLens's component
    wrappers inserted into its module tree; we wrap that HF model as :func:`interp.models.from_hf` does, so
    every site (``attn_z`` included) is the HF model's own, and our hooks also act inside the bridge's own
    ``bridge(...)`` / ``generate`` calls. The bridge forces eager attention on the shared config, so captures
    equal ``interp.load_model(..., attn_implementation="eager")`` of the same weights (and the default sdpa
    within float32 rounding). Refused: a bridge whose weights were processed (``process_weights`` or
    ``enable_compatibility_mode()``: layer norms folded, weights centred in the HF model itself, so the
    activations are no longer the checkpoint's) and a bridge without a local HF model (remote). ``tokenizer``
    defaults to the bridge's, which transformers' ``AutoTokenizer`` reloaded from the folder: a tokenizer that
    does not survive that reload (the tiny qwen2 one comes back as ``Qwen2Tokenizer`` and splits text
    differently) gives other positions than the HF model's, so pass the one you use there.

    A ``HookedTransformer`` is kept as it is and our hooks attach to its own HookPoints. Limits there: no
    ``attn_z`` site, no KV-cache generation through ``steering.generate`` (use the model's own ``generate``
    inside ``steering.apply``), no ``steering.bake`` (the weights are not in HF layout); ``ln_final`` is
    before the norm's gain, as in TransformerLens. ``tokenizer`` defaults to the model's own.
    """
    tl = import_extra("transformer_lens", "interp.from_transformer_lens")
    bridge = _bridge_class()
    if bridge is not None and isinstance(tl_model, bridge):
        return _from_bridge(tl_model, tokenizer, name)
    try:
        hooked_cls = tl.HookedTransformer
    except (ImportError, AttributeError):  # TransformerLens 4 removed it
        hooked_cls = None
    if hooked_cls is None or not isinstance(tl_model, hooked_cls):
        raise TypeError(f"from_transformer_lens expects a transformer_lens TransformerBridge (3.x, 4.x) or "
                        f"HookedTransformer (3.x), got {type(tl_model).__name__}; for an HF model use interp.from_hf")
    hf = TransformerLensLM(tl_model).eval()
    spec = transformer_lens_spec(tl_model)
    get_module(hf, spec.layers)  # fails early if the tree is not TransformerLens's
    tok = tokenizer if tokenizer is not None else getattr(tl_model, "tokenizer", None)
    return TransformerLensModel(hf=hf, tokenizer=tok, spec=spec, name=name or hf.config._name_or_path)


def _bridge_class() -> type | None:
    """``transformer_lens.model_bridge.TransformerBridge`` (3.x and 4.x), or None in a release without it."""
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:
        return None
    return TransformerBridge


def _from_bridge(bridge: Any, tokenizer: Any, name: str | None) -> Model:
    """The bridge's own HF model as a :class:`Model` (weights and module tree shared, nothing copied)."""
    if getattr(bridge, "_weights_processed", False):
        raise ValueError("this TransformerBridge's weights were processed (process_weights() or "
                         "enable_compatibility_mode() folded the layer norms and centred the weights inside the HF "
                         "model), so its activations are not the checkpoint's. Wrap a fresh bridge from "
                         "TransformerBridge.boot_transformers(...) before processing it, or enable the "
                         "compatibility mode with no_processing=True")
    hf = getattr(bridge, "original_model", None)
    if not isinstance(hf, nn.Module) or not hasattr(hf, "config"):
        raise TypeError(f"this {type(bridge).__name__} holds no local HF model (original_model), e.g. a remote "
                        f"bridge; load the weights locally and boot TransformerBridge.boot_transformers(...)")
    tok = tokenizer if tokenizer is not None else getattr(bridge, "tokenizer", None)
    return from_hf(hf, tok, name=name)


def from_nnsight(language_model: Any, tokenizer: Any = None, name: str | None = None, backend: str | None = None,
                 remote: bool | str = False, trace_kwargs: dict[str, Any] | None = None) -> Model:
    """Wrap the HF model inside an nnsight ``LanguageModel`` / ``TransformersModel`` / ``NNsight``.

    ``backend="hooks"`` (the default without ``remote``): nnsight keeps the HF module tree untouched and only
    hooks it inside ``trace``, so our hooks attach to the same modules: numbers equal
    :func:`interp.models.from_hf` exactly, and steering attached with ``steering.apply`` also acts inside the
    user's own ``with language_model.trace(...)`` blocks.

    ``backend="nnsight"`` (implied by ``remote``): an :class:`~interp.nnsight_backend.NNsightModel`, whose
    ``interp.capture``, ``interp.logits``, ``interp.token_logprobs`` and ``steering.apply`` (steering's own
    interventions) run as ``language_model.trace(...)`` blocks. ``remote=True`` runs them on NDIF's hosted
    model: build ``LanguageModel("<hub id NDIF serves>")`` without loading weights (its meta model gives the
    module tree, config and tokenizer), set your NDIF API key (``NDIF_API_KEY`` in the environment, or
    ``nnsight.CONFIG.set_default_api_key(...)``), and pass it here.
    ``remote="local"`` is nnsight's offline dry run of that path (the block is serialised and run here with
    this project's modules hidden). Tested locally (``remote=False`` and ``"local"``) to equal our hooks
    within 1e-5; a real NDIF run was not tested (no network). See :mod:`interp.nnsight_backend` for the limits.
    """
    hf = getattr(language_model, "_module", None)  # nnsight >= 0.5 (Envoy); older releases used ``_model``
    if not isinstance(hf, nn.Module):
        hf = getattr(language_model, "_model", None)
    if not isinstance(hf, nn.Module) or not hasattr(hf, "config"):
        raise TypeError(f"from_nnsight expects an nnsight model wrapping an HF causal LM, got "
                        f"{type(language_model).__name__}; for a plain HF model use interp.from_hf")
    backend = backend or ("nnsight" if remote else "hooks")
    if backend not in ("hooks", "nnsight"):
        raise ValueError(f"backend must be 'hooks' or 'nnsight', got {backend!r}")
    if remote and backend == "hooks":
        raise ValueError("remote= runs through nnsight traces: pass backend='nnsight' (or leave backend unset)")
    tok = tokenizer if tokenizer is not None else getattr(language_model, "tokenizer", None)
    model = from_hf(hf, tok, name=name)
    if backend == "hooks":
        return model
    if remote and not hasattr(type(language_model), "to_model_key"):
        raise TypeError(f"remote= needs an nnsight model NDIF can serve (LanguageModel / TransformersModel), got "
                        f"{type(language_model).__name__}")
    return NNsightModel(hf=model.hf, tokenizer=tok, spec=model.spec, name=model.name, lm=language_model,
                        remote=remote, trace_kwargs=dict(trace_kwargs or {}))


__all__ = ["TransformerLensLM", "TransformerLensModel", "from_nnsight", "from_transformer_lens",
           "transformer_lens_spec"]
