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
``steering.generate(..., engine="vllm")`` runs :func:`vllm_token_ids` on such a folder (the ``vllm`` extra,
CUDA only).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from interp.chat import Encoded
from interp.models import Model
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
    """Refuse, naming the fix, where vLLM or a CUDA device is missing."""
    if importlib.util.find_spec("vllm") is None:
        raise ImportError("engine='vllm' needs vLLM: pip install 'interp-toolkit[vllm]' (Linux with a CUDA GPU), or "
                          "generate with engine='hf'")
    if not torch.cuda.is_available():
        raise RuntimeError("engine='vllm' serves on a CUDA GPU and none is visible here; generate with engine='hf'")


def vllm_token_ids(model: Model, encs: Sequence[Encoded], *interventions: Any, max_new_tokens: int = 64,
                   do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                   seed: int = 0, **llm_kwargs: Any) -> list[list[int]]:
    """New token ids per encoding from vLLM serving ``model`` with ``interventions`` baked in (greedy unless
    ``do_sample``); ``llm_kwargs`` go to ``vllm.LLM`` (e.g. ``gpu_memory_utilization``)."""
    check_vllm()
    import vllm

    with tempfile.TemporaryDirectory(prefix="interp-serve-") as tmp:
        folder = save_for_serving(model, Path(tmp) / "model", *interventions)
        kw = {"dtype": str(model.dtype).removeprefix("torch."), "seed": seed, **llm_kwargs}
        llm = vllm.LLM(model=str(folder), tokenizer=str(folder), **kw)
        sp = vllm.SamplingParams(max_tokens=max_new_tokens, temperature=temperature if do_sample else 0.0,
                                 top_p=top_p if do_sample else 1.0, top_k=top_k if do_sample and top_k > 0 else -1,
                                 seed=seed)
        outs = llm.generate([{"prompt_token_ids": list(e.ids)} for e in encs], sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]
