"""TransformerLens's ``TransformerBridge`` through ``interp.from_transformer_lens``: the same captures as the
HF model of the same weights. TL 3.x's bridge here (tiny models booted from a saved folder, SmolLM2);
TL 4.x's bridge in ``.tl4-venv`` (``bash scripts/tl4_venv.sh``) through ``scripts/tl4_bridge_check.py``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

import interp
import steering
from interp.testing.oracles import capture_gaps
from interp.testing.tiny import FAMILIES, tiny_model

ROOT = Path(__file__).resolve().parents[1]
TL4_PY = ROOT / ".tl4-venv" / "bin" / "python"
SCRIPT = ROOT / "scripts" / "tl4_bridge_check.py"
PROMPTS = ["the man said to the boy", "help", "where is the old house by the water now ?"]


def _boot(folder: str):
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(folder, device="cpu")


def _assert_gaps(gaps: dict, rtol: float = 0.0) -> None:
    """Every site kind within 1e-5 absolute (+ ``rtol`` of the kind's largest value)."""
    assert set(gaps) >= {"resid_pre", "resid_post", "attn_out", "mlp_out", "attn_z", "mlp_post"}, gaps
    for kind, g in gaps.items():
        assert g["abs"] <= 1e-5 + rtol * g["scale"], (kind, g)


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def tiny_bridge(request, tmp_path_factory):
    """(our tiny HF model, a TL bridge booted from the same weights saved to a folder)."""
    m = tiny_model(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    m.hf.save_pretrained(folder)
    m.tokenizer.save_pretrained(folder)
    return m, _boot(str(folder))


def test_tiny_bridge_captures_equal_hf(tiny_bridge):
    m, bridge = tiny_bridge
    a = interp.from_transformer_lens(bridge)
    assert "blocks.0.attn.hook_z" in a.site_names()
    _assert_gaps(capture_gaps(a, m, PROMPTS))


def test_bridge_hooks_act_in_the_bridges_own_forward_and_go_away(tiny_bridge):
    """Our hooks sit on the bridge's HF tree: steering acts in ``bridge(...)`` too, and leaves nothing behind."""
    m, bridge = tiny_bridge
    a = interp.from_transformer_lens(bridge)
    ids = m.tokenizer("the old house by the water", return_tensors="pt")["input_ids"]
    v = torch.randn(m.d_model, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = bridge(ids, return_type="logits")
        with pytest.raises(RuntimeError, match="user code"):
            with steering.apply(a, steering.AddVector(v, layers=1, alpha=3.0)):
                steered = bridge(ids, return_type="logits")
                raise RuntimeError("user code")
        after = bridge(ids, return_type="logits")
    assert (steered - plain).abs().max() > 1e-2
    torch.testing.assert_close(after, plain, atol=0, rtol=0)


def test_processed_bridge_is_refused(tmp_path):
    m = tiny_model("llama")
    m.hf.save_pretrained(tmp_path)
    m.tokenizer.save_pretrained(tmp_path)
    bridge = _boot(str(tmp_path))
    bridge.process_weights()
    with pytest.raises(ValueError, match="boot_transformers"):
        interp.from_transformer_lens(bridge)


def test_other_objects_are_refused():
    with pytest.raises(TypeError, match="TransformerBridge"):
        interp.from_transformer_lens(tiny_model("llama").hf)


@pytest.fixture(scope="module")
def smollm2():
    return interp.load_model("smollm2-135m-instruct"), interp.load_model("smollm2-135m-instruct",
                                                                         attn_implementation="eager")


def test_smollm2_tl3_bridge_equals_load_model(smollm2):
    """The bridge forces eager attention: equal to eager within 1e-5; to the default sdpa within float32
    rounding: 1e-5 of each kind's scale (SmolLM2's last residual reaches ~2.5e4, and ln_final inherits that drift)."""
    sdpa, eager = smollm2
    a = interp.from_transformer_lens(_boot(sdpa.hf.config._name_or_path))
    _assert_gaps(capture_gaps(a, eager, PROMPTS))
    _assert_gaps(capture_gaps(a, sdpa, PROMPTS), rtol=1e-5)


def test_smollm2_tl4_bridge_equals_load_model():
    # the README's test command builds .tl4-venv (as .vllm-venv): its absence is a broken set-up, not a skip
    assert TL4_PY.exists(), ("the TransformerLens 4 environment .tl4-venv/ is absent: build it with "
                             "`bash scripts/tl4_venv.sh` (the README's test command does)")
    res = subprocess.run([str(TL4_PY), str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"{SCRIPT.name} failed in .tl4-venv (rebuild: bash scripts/tl4_venv.sh): " \
                                f"{res.stderr[-3000:]}"
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["transformer_lens"].startswith("4.") and not out["has_hooked_transformer"], out
    _assert_gaps(out["vs_eager"])
    _assert_gaps(out["vs_sdpa"], rtol=1e-5)


def _groups(m) -> tuple[tuple[str, ...], ...]:
    """The comparison's site groups for a family: no resid_mid with a parallel residual, no mlp_post in a mixture
    of experts (the routed and shared experts' writes instead)."""
    resid = ("resid_pre", "resid_post", "attn_out", "mlp_out", "ln_final")
    resid += () if m.spec.parallel_residual else ("resid_mid",)
    resid += ("experts_out",) + (("shared_expert_out",) if m.spec.shared_expert else ()) if m.spec.is_moe else ()
    return (resid, ("attn_z",)) + ((("mlp_post",),) if not m.spec.is_moe else ())


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_bridge_captures_equal_hf(family, tmp_path):
    """Every tiny family through a TL 3.x bridge booted from its saved folder equals the HF model, the tokenizer
    given (a tiny qwen2 tokenizer reloads wrongly, see the next test)."""
    m = tiny_model(family)
    m.hf.save_pretrained(tmp_path)
    m.tokenizer.save_pretrained(tmp_path)
    a = interp.from_transformer_lens(_boot(str(tmp_path)), tokenizer=m.tokenizer)
    assert a.site_names() == m.site_names()
    gaps = capture_gaps(a, m, PROMPTS, groups=_groups(m))
    assert set(gaps) == {k for g in _groups(m) for k in g}
    for kind, g in gaps.items():
        assert g["abs"] <= 1e-5 + 1e-6 * g["scale"], (family, kind, g)


def test_qwen2_bridge_tokenizer_is_transformers_reload_not_the_bridge(tmp_path):
    """The qwen2 bug report (other site counts, a size mismatch at dim 2): the positions differ, not the model.
    transformers reloads a qwen2 folder's tokenizer as ``Qwen2Tokenizer``, which rebuilds Qwen2's byte-level BPE
    from the tiny word-level vocabulary, so the bridge (which loads its tokenizer with ``AutoTokenizer``) tokenizes
    text differently; given the same token ids the bridge's model equals ours."""
    from transformers import AutoTokenizer

    m = tiny_model("qwen2")
    m.hf.save_pretrained(tmp_path)
    m.tokenizer.save_pretrained(tmp_path)
    bridge = _boot(str(tmp_path))
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert type(reloaded).__name__ == "Qwen2Tokenizer"
    ours = m.tokenizer("help", add_special_tokens=False)["input_ids"]
    assert reloaded("help", add_special_tokens=False)["input_ids"] != ours
    assert bridge.tokenizer("help", add_special_tokens=False)["input_ids"] != ours
    a = interp.from_transformer_lens(bridge)                        # the bridge's own tokenizer: other positions
    x, y = (interp.capture(k, PROMPTS, "resid_post", "all") for k in (a, m))
    assert x.mask.sum() != y.mask.sum()
    ids = torch.tensor([m.tokenizer(p, add_special_tokens=False)["input_ids"][:4] for p in PROMPTS[::2]])
    x, y = (interp.capture(k, ids, "resid_post", "all") for k in (a, m))  # the same ids: the same activations
    torch.testing.assert_close(x.tensor, y.tensor, atol=1e-5, rtol=0)
