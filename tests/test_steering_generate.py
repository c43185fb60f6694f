"""Steered generation: scope (prompt vs generated tokens) under the KV cache, left padding, seeds."""

from __future__ import annotations

import pytest
import torch

import interp
import steering
from interp.forward import batches, prepare
from interp.testing.tiny import tiny_model

PROMPTS = ["the man is here", "a boy", "what is the time of day for the old man", "you can go"]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=3)


def _vec(model, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(model.d_model, generator=g)


def _gen_logits(model, ids, n, *ivs):
    """Greedy generation of ``n`` tokens with ``ivs`` attached; returns (tokens [1, n], step logits [n, V])."""
    kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, output_logits=True,
              return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad():
        if ivs:
            with steering.apply(model, *ivs):
                out = model.hf.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        else:
            out = model.hf.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, 1)[0]


def _teacher_forced(model, full, iv):
    with torch.no_grad(), steering.apply(model, iv):
        return model.hf(full).logits[0]


@pytest.mark.parametrize("scope", ["generated", "prompt"])
def test_scope_under_kv_cache_matches_teacher_forcing(model, scope):
    """A scoped edit during cached generation equals one forward over prompt + generated tokens with the
    edit placed on exactly the prompt (or generated) positions: the cache and the scope are both right."""
    _, encs = prepare(model, PROMPTS[2:3])
    ids = torch.tensor([encs[0].ids])
    T, n = ids.shape[1], 6
    v = _vec(model, scale=2.0)
    iv = steering.AddVector(v, layers=0, alpha=1.0, scope=scope)
    toks, logits = _gen_logits(model, ids, n, iv)
    _, plain = _gen_logits(model, ids, n)
    full = torch.cat([ids, toks[:, :-1]], 1)
    where = list(range(T)) if scope == "prompt" else list(range(T, T + n - 1))
    ref = _teacher_forced(model, full, steering.AddVector(v, layers=0, alpha=1.0, positions=where))
    torch.testing.assert_close(logits, ref[T - 1:], rtol=1e-4, atol=1e-5)
    if scope == "generated":  # the prompt pass is untouched: first-step logits equal the unsteered ones
        torch.testing.assert_close(logits[0], plain[0], rtol=0, atol=0)
        assert (logits[1:] - plain[1:]).abs().max() > 1e-3
    else:  # the prompt pass is steered; a 'both' edit differs from it only on the generated steps
        assert (logits[0] - plain[0]).abs().max() > 1e-3
        _, both = _gen_logits(model, ids, n, steering.AddVector(v, layers=0, alpha=1.0, scope="both"))
        torch.testing.assert_close(logits[0], both[0], rtol=0, atol=0)


def _alone_vs_batch(model, *ivs, n=6):
    batched = steering.generate(model, PROMPTS, *ivs, max_new_tokens=n,
                                sampling=steering.Sampling(stop_at_eos=False),
                                runtime=interp.Runtime(batch_size=4, progress=False))
    for i, p in enumerate(PROMPTS):
        alone = steering.generate(model, [p], *ivs, max_new_tokens=n,
                                  sampling=steering.Sampling(stop_at_eos=False),
                                  runtime=interp.Runtime(progress=False))
        assert alone.token_ids[0] == batched.token_ids[i], (i, ivs)
    return batched


@pytest.mark.parametrize("make", [
    lambda m, v: steering.AddVector(v, layers=1, alpha=4.0),
    lambda m, v: steering.AddVector(v, layers=[0, 1], alpha=4.0, positions=[-1, 0], scope="both"),
    lambda m, v: steering.AddVector(v, layers=0, alpha=4.0, positions="post_instruction", scope="prompt"),
    lambda m, v: steering.DirectionalAblation(v),
    lambda m, v: steering.Clamp(v, value=3.0, layers=1, scope="generated"),
])
def test_left_padded_batch_equals_alone(model, make):
    out = _alone_vs_batch(model, make(model, _vec(model)))
    plain = steering.generate(model, PROMPTS, max_new_tokens=6,
                              sampling=steering.Sampling(stop_at_eos=False),
                              runtime=interp.Runtime(progress=False))
    assert out.token_ids != plain.token_ids  # the edit did something


def test_batch_prompt_logits_equal_alone(model):
    """Position-selective edit in a padded forward: each row's logits equal its solo run (1e-5)."""
    iv = steering.AddVector(_vec(model), layers=0, alpha=3.0, positions=[-2, 1])
    _, encs = prepare(model, PROMPTS)
    batch = batches(model, encs, 4)[0]
    with torch.no_grad(), steering.apply(model, iv):
        full = model.hf(**batch.model_inputs).logits
        for i, e in enumerate(encs):
            solo = model.hf(torch.tensor([e.ids])).logits[0]
            torch.testing.assert_close(full[i, -len(e.ids):], solo, rtol=1e-5, atol=1e-5)


def test_greedy_and_seeded_sampling_are_reproducible(model):
    iv = steering.AddVector(_vec(model), layers=1, alpha=2.0)
    a = steering.generate(model, PROMPTS, iv, max_new_tokens=8,
                          sampling=steering.Sampling(do_sample=True),
                          runtime=interp.Runtime(seed=7, progress=False))
    b = steering.generate(model, PROMPTS, iv, max_new_tokens=8,
                          sampling=steering.Sampling(do_sample=True),
                          runtime=interp.Runtime(seed=7, progress=False))
    c = steering.generate(model, PROMPTS, iv, max_new_tokens=8,
                          sampling=steering.Sampling(do_sample=True),
                          runtime=interp.Runtime(seed=8, progress=False))
    assert a.token_ids == b.token_ids and a.texts == b.texts
    assert a.token_ids != c.token_ids
    g1 = steering.generate(model, PROMPTS, iv, max_new_tokens=8, runtime=interp.Runtime(progress=False))
    g2 = steering.generate(model, PROMPTS, iv, max_new_tokens=8,
                           runtime=interp.Runtime(batch_size=2, progress=False))
    assert g1.token_ids == g2.token_ids
    assert len(g1) == len(PROMPTS) and all(isinstance(t, str) for t in g1.texts)
    assert g1.texts[0] == model.tokenizer.decode(g1.token_ids[0], skip_special_tokens=True)


def test_generation_leaves_no_hooks_and_restores_rng(model):
    from interp.hooking import count_hooks

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    steering.generate(model, PROMPTS[:2], steering.DirectionalAblation(_vec(model)), max_new_tokens=3,
                      sampling=steering.Sampling(do_sample=True),
                      runtime=interp.Runtime(progress=False))
    assert torch.equal(torch.rand(3), expected)
    assert count_hooks(model.hf) == 0


def test_generate_bad_input(model):
    with pytest.raises(ValueError, match="max_new_tokens"):
        steering.generate(model, PROMPTS, max_new_tokens=0, runtime=interp.Runtime(progress=False))
    with pytest.raises(TypeError, match="not a single string"):
        steering.generate(model, "one prompt", runtime=interp.Runtime(progress=False))
    with pytest.raises(ValueError, match="finite"):
        steering.generate(model, PROMPTS,
                          sampling=steering.Sampling(do_sample=True, temperature=float("nan")),
                          runtime=interp.Runtime(progress=False))
