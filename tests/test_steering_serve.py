"""Serving steered models with other engines: interventions baked into a saved folder that plain transformers
loads and that generates what hooks generate; refusals for what weights cannot hold; the vLLM engine (runs
only where vLLM and a CUDA GPU are present, skipped with the reason elsewhere)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import interp
import steering
from interp.forward import batch_of, last_logits
from interp.models import load_model
from interp.testing.tiny import tiny_model
from steering.serve import baked_for_serving, save_for_serving

PROMPTS = ["the man is here", "a boy went home now", "you can see the water"]


def _pair(d, seed=2):
    """A direction and a vector orthogonal to it (so addition and ablation commute, as baked weights need)."""
    g = torch.Generator().manual_seed(seed)
    r, v = torch.randn(d, generator=g), torch.randn(d, generator=g)
    r = r / r.norm()
    return r, 4.0 * (v - (v @ r) * r)


def _last(model, *ivs):
    with steering.apply(model, *ivs):
        return last_logits(model, batch_of(model, PROMPTS))


def test_saved_folder_generates_what_hooks_generate(tmp_path):
    m = tiny_model("llama")
    r, v = _pair(m.d_model)
    ivs = [steering.DirectionalAblation(r), steering.AddVector(v, layers=[0, 1], sites=("attn_out", "resid_post"))]
    folder = save_for_serving(m, tmp_path / "served", *ivs)
    served = load_model(str(folder))                   # plain transformers folder: no hooks, no interp state
    torch.testing.assert_close(_last(served), _last(m, *ivs), rtol=0, atol=1e-5)
    hooked = steering.generate(m, PROMPTS, *ivs, max_new_tokens=8, runtime=interp.Runtime(progress=False))
    plain = steering.generate(m, PROMPTS, max_new_tokens=8, runtime=interp.Runtime(progress=False))
    assert steering.generate(served, PROMPTS, max_new_tokens=8, runtime=interp.Runtime(progress=False)).token_ids == hooked.token_ids
    assert hooked.token_ids != plain.token_ids  # the steering changes what is generated
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_for_serving(m, folder, *ivs)
    assert baked_for_serving(m) is m


def test_what_weights_cannot_hold_is_refused():
    m = tiny_model("llama")
    r, v = _pair(m.d_model)
    with pytest.raises(ValueError, match="differs from the interventions as hooks"):
        baked_for_serving(m, steering.AddVector(r, layers=0, alpha=3.0), steering.DirectionalAblation(r))
    for iv in [steering.Clamp(r, 1.0, layers=[1]), steering.DirectionalAblation(r, layers=[1]),
               steering.DirectionalAblation({0: r, 1: v}), steering.DirectionalAblation(r, scope="generated"),
               steering.Ablate(r)]:
        with pytest.raises(ValueError, match="cannot be baked for serving"):
            baked_for_serving(m, iv)
    with pytest.raises(ValueError, match="scope='both'"):
        baked_for_serving(m, steering.AddVector(v, layers=0, scope="generated"))


def test_engine_arguments():
    m = tiny_model("llama")
    with pytest.raises(ValueError, match="engine must be"):
        steering.generate(m, PROMPTS, engine="tgi")
    with pytest.raises(ValueError, match="first_logits"):
        steering.GenerationSession(m, PROMPTS, first_logits=True).generate(engine="vllm")
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ImportError, match=r"interp-toolkit\[vllm\]"):
            steering.generate(m, PROMPTS, engine="vllm", runtime=interp.Runtime(progress=False))
    elif not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            steering.generate(m, PROMPTS, engine="vllm", runtime=interp.Runtime(progress=False))


@pytest.mark.gpu
def test_vllm_serves_the_baked_model_like_hooks():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (pip install 'interp-toolkit[vllm]')")
    if not torch.cuda.is_available():
        pytest.skip("vLLM needs a CUDA GPU and none is visible")
    m = tiny_model("llama", d_model=256)                # head_dim 64: a size vLLM's attention kernels take
    m.hf.to("cuda")
    r, v = _pair(m.d_model)
    ivs = [steering.DirectionalAblation(r), steering.AddVector(v, layers=[0, 1])]
    want = steering.generate(m, PROMPTS, *ivs, max_new_tokens=8, runtime=interp.Runtime(progress=False))
    got = steering.generate(m, PROMPTS, *ivs, max_new_tokens=8, engine="vllm",
                            gpu_memory_utilization=0.2, enforce_eager=True, runtime=interp.Runtime(progress=False))
    assert got.token_ids == want.token_ids
