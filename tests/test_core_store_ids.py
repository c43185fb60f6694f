"""Who the rows belong to: a store resumes only the run that began it (weights, dtype, labels), and prompt ids
come from the content, so a leakage check compares prompts, not list positions."""

from __future__ import annotations

import pytest
import torch

from interp.activations import Activations
from interp.capturing import capture
from interp.hooking import hooks
from interp.models import from_hf
from interp.testing.tiny import tiny_model
from interp.values import Prompts, Runtime

PROMPTS = ["the man said to the boy", "what is the good word", "help", "where is the old house by the water now ?",
           "tell me a kind word", "the water is low", "why do they play", "give me the name"]
HELD_OUT = ["the boy said to the man", "what is the old word", "the house is big", "where is the water"]


def _interrupted(m, path, **kw):
    """Start ``capture(m, PROMPTS, out=path)`` and stop it by Ctrl-C in the third batch (2 shards written)."""
    seen = []

    def stop(x, ctx):
        seen.append(1)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), hooks(m, {"resid_pre.0": stop}):
        capture(m, Prompts(PROMPTS, **kw), out=path, runtime=Runtime(batch_size=2, progress=False))


def _unnamed(seed, dtype=torch.float32):
    m = tiny_model("llama", seed=seed)
    return from_hf(m.hf.to(dtype), m.tokenizer)  # named LlamaForCausalLM, as any unnamed from_hf model


def test_resume_refuses_other_weights_dtype_and_labels(tmp_path):
    m0, m1 = _unnamed(0), _unnamed(1)
    assert m0.name == m1.name
    _interrupted(m0, tmp_path / "s", labels=list(range(8)))
    with pytest.raises(FileExistsError, match="differs in: weights"):
        capture(m1, Prompts(PROMPTS, labels=list(range(8))), out=tmp_path / "s",
                runtime=Runtime(batch_size=2, progress=False))
    with pytest.raises(FileExistsError, match="model_dtype"):
        capture(_unnamed(0, torch.bfloat16), Prompts(PROMPTS, labels=list(range(8))), out=tmp_path / "s",
                runtime=Runtime(batch_size=2, progress=False))
    with pytest.raises(FileExistsError, match="labels"):
        capture(m0, Prompts(PROMPTS, labels=[0] * 8), out=tmp_path / "s",
                runtime=Runtime(batch_size=2, progress=False))
    done = capture(m0, Prompts(PROMPTS, labels=list(range(8))), out=tmp_path / "s",
                   runtime=Runtime(batch_size=2, progress=False))
    torch.testing.assert_close(done.load().tensor, capture(m0, PROMPTS,
                                                           runtime=Runtime(progress=False)).tensor)
    other = capture(m1, PROMPTS, out=tmp_path / "t", runtime=Runtime(batch_size=2, progress=False))
    assert (other.load().tensor - done.load().tensor).abs().max() > 1e-3


def test_prompt_ids_come_from_the_content(tiny_models):
    m = tiny_models("llama")
    a = capture(m, PROMPTS[:4], runtime=Runtime(progress=False))
    b = capture(m, HELD_OUT, runtime=Runtime(progress=False))
    again = capture(m, PROMPTS[2:4] + PROMPTS[2:3], runtime=Runtime(progress=False))
    assert not set(a.prompt_ids) & set(b.prompt_ids)
    assert again.prompt_ids[:2] == a.prompt_ids[2:4] and again.prompt_ids[2] == a.prompt_ids[2] + "#2"
    r1 = capture(m, Prompts(PROMPTS[:1], responses=["yes"]), positions="response_mean",
                 runtime=Runtime(progress=False))
    r2 = capture(m, Prompts(PROMPTS[:1], responses=["no"]), positions="response_mean",
                 runtime=Runtime(progress=False))
    assert r1.prompt_ids != r2.prompt_ids != a.prompt_ids[:1]
    assert capture(m, Prompts(PROMPTS[:2], ids=["x", "y"]),
                   runtime=Runtime(progress=False)).prompt_ids == ["x", "y"]


def test_concat_refuses_duplicate_ids_unless_told(tiny_models):
    m = tiny_models("llama")
    a = capture(m, PROMPTS[:3], runtime=Runtime(progress=False))
    b = capture(m, PROMPTS[2:5], runtime=Runtime(progress=False))
    with pytest.raises(ValueError, match="on_duplicate='suffix'"):
        Activations.concat([a, b])
    both = Activations.concat([a, b], on_duplicate="suffix")
    assert len(set(both.prompt_ids)) == 6 and both.prompt_ids[3] == a.prompt_ids[2] + "#2"


def test_leakage_guard_with_content_ids(tiny_models):
    """Held-out prompts captured afresh score against a direction fitted elsewhere; its own prompts are refused."""
    import probes

    m = tiny_models("llama")
    train = capture(m, Prompts(PROMPTS, labels=[1, 0] * 4), runtime=Runtime(progress=False))
    d = probes.diff_of_means(train)
    held = capture(m, Prompts(HELD_OUT, labels=[1, 0, 1, 0]), runtime=Runtime(progress=False))
    probes.evaluate_direction(held, direction=d)
    with pytest.raises(ValueError, match="8 evaluation samples were used to fit"):
        probes.evaluate_direction(capture(m, Prompts(PROMPTS, labels=[1, 0] * 4),
                                          runtime=Runtime(progress=False)), direction=d)
