"""Interventions through hooks: exact math at the sites, zero projection after ablation, the steering-vectors
library as an oracle for additive steering, composition, and clear errors on bad input."""

from __future__ import annotations

import warnings

import pytest
import torch

import steering
from interp.capturing import capture
from interp.hooking import HookContext, count_hooks, hooks
from interp.sites import parse_site
from interp.testing.tiny import tiny_model
from interp.values import Runtime

PROMPTS = ["the man is here", "a boy", "what is the time of day for the old man"]
SITES = ["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out"]


def _vec(d, seed=0, scale=1.0):
    return scale * torch.randn(d, generator=torch.Generator().manual_seed(seed))


def _acts(model, sites, *ivs, positions="all"):
    if ivs:
        with steering.apply(model, *ivs):
            return capture(model, PROMPTS, sites=sites, positions=positions, runtime=Runtime(progress=False))
    return capture(model, PROMPTS, sites=sites, positions=positions, runtime=Runtime(progress=False))


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox", "gemma2", "olmo2", "qwen2_moe", "mixtral"])
def test_directional_ablation_zero_projection_everywhere(family):
    m = tiny_model(family)
    r = _vec(m.d_model, 1)
    sites = [s for s in SITES if not (s == "resid_mid" and m.spec.resid_mid_in is None)]
    acts = _acts(m, sites, steering.DirectionalAblation(r))
    proj = acts.tensor @ (r / r.norm())
    assert proj.abs().max() <= 1e-5, proj.abs().max()
    base = _acts(m, sites)
    assert (base.tensor @ (r / r.norm())).abs().max() > 1e-3  # there was something to remove


def test_per_layer_directions_and_direction_objects():
    m = tiny_model("qwen3")
    R = torch.stack([_vec(m.d_model, 5), _vec(m.d_model, 6)])

    class Direction:  # what the probes package hands over: .vectors, optionally .layers
        vectors = R
        layers = [0, 1]

    for spec in (R, Direction(), {0: R[0], -1: R[1]}):
        acts = _acts(m, ["resid_pre", "attn_out", "mlp_out"], steering.DirectionalAblation(spec))
        for i, name in enumerate(acts.sites):
            layer = int(name.split(".")[1])
            proj = acts.tensor[:, i] @ (R[layer] / R[layer].norm())
            assert proj.abs().max() <= 1e-5, (name, proj.abs().max())


def test_add_clamp_subspace_math_at_the_site():
    m = tiny_model("llama")
    d, site = m.d_model, "blocks.1.hook_resid_post"  # last layer: upstream is untouched, base = pre-edit
    v, r = _vec(d, 2), _vec(d, 3)
    ru = r / r.norm()
    base = _acts(m, [site]).tensor[:, 0]
    mask = _acts(m, [site]).mask
    add = _acts(m, [site], steering.AddVector(v, layers=1, alpha=2.5)).tensor[:, 0]
    torch.testing.assert_close((add - base)[mask], (2.5 * v).expand(int(mask.sum()), d), rtol=1e-5, atol=1e-5)
    cl = _acts(m, [site], steering.Clamp(r, value=-1.5, layers=1)).tensor[:, 0]
    torch.testing.assert_close((cl @ ru)[mask], torch.full((int(mask.sum()),), -1.5), rtol=1e-5, atol=1e-5)
    orth = (cl - (cl @ ru)[..., None] * ru) - (base - (base @ ru)[..., None] * ru)
    assert orth[mask].abs().max() <= 1e-5  # the rest of the vector is untouched
    Q = torch.linalg.qr(torch.randn(d, 4, generator=torch.Generator().manual_seed(4)))[0].T
    sub = _acts(m, [site], steering.AblateSubspace(Q, layers=1, sites="resid_post")).tensor[:, 0]
    assert (sub @ Q.T)[mask].abs().max() <= 1e-5
    torch.testing.assert_close(sub[mask], (base - (base @ Q.T) @ Q)[mask], rtol=1e-5, atol=1e-5)


def test_positions_touch_only_the_named_prompt_tokens():
    m = tiny_model("llama")
    site, v = "blocks.1.hook_resid_post", _vec(m.d_model, 2)
    base = _acts(m, [site])
    got = _acts(m, [site], steering.AddVector(v, layers=1, positions=[0, -1]))
    changed = (got.tensor[:, 0] - base.tensor[:, 0]).abs().amax(-1) > 1e-6    # [n, P] left padded
    n_real = base.mask.sum(1)
    for i in range(len(PROMPTS)):
        row = changed[i, base.mask[i]]
        assert row[0] and row[-1] and int(row.sum()) == (2 if n_real[i] > 1 else 1)


def test_conditional_acts_only_above_threshold():
    m = tiny_model("llama")
    site, r, c = "blocks.1.hook_resid_post", _vec(m.d_model, 3), _vec(m.d_model, 8)
    base = _acts(m, [site])
    x, mask = base.tensor[:, 0][base.mask], base.mask
    cu = c / c.norm()
    thr = float((x @ cu).median())
    for above in (True, False):
        iv = steering.Clamp(r, value=2.0, layers=1).when(c, thr, above=above)
        got = _acts(m, [site], iv).tensor[:, 0][mask]
        fire = (x @ cu > thr) if above else (x @ cu < thr)
        assert 0 < int(fire.sum()) < len(fire)
        torch.testing.assert_close(got[~fire], x[~fire], rtol=0, atol=0)
        torch.testing.assert_close(got[fire] @ (r / r.norm()), torch.full((int(fire.sum()),), 2.0), rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox", "qwen2_moe", "gemma3_text"])
@pytest.mark.parametrize("layer", [0, -1])
def test_additive_steering_equals_steering_vectors_library(family, layer):
    from steering_vectors import SteeringVector

    m = tiny_model(family)
    v = _vec(m.d_model, 4, scale=0.5)
    ids = torch.randint(7, 200, (2, 9), generator=torch.Generator().manual_seed(0))
    kw = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, output_logits=True,
              return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad():
        plain = m.hf(ids).logits
        with SteeringVector({layer: v}, "decoder_block").apply(m.hf, multiplier=3.0):
            theirs = m.hf(ids).logits
            theirs_gen = m.hf.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        with steering.apply(m, steering.AddVector(v, layers=layer, alpha=3.0, sites="resid_post")):
            ours = m.hf(ids).logits
            ours_gen = m.hf.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    assert (theirs - plain).abs().max() > 1e-2
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    assert torch.equal(ours_gen.sequences, theirs_gen.sequences)
    torch.testing.assert_close(torch.stack(ours_gen.logits), torch.stack(theirs_gen.logits), rtol=1e-5, atol=1e-5)


class Doubler:
    """A foreign intervention (as the sae package writes them): only the hook_fns protocol."""

    def __init__(self, site):
        self.site = site

    def hook_fns(self, model):
        return {self.site: lambda x, ctx: 2 * x}


def test_composition_order_foreign_objects_and_nesting():
    m = tiny_model("llama")
    site, v, r = "blocks.1.hook_resid_post", _vec(m.d_model, 2), _vec(m.d_model, 3)
    ru = r / r.norm()
    base = _acts(m, [site]).tensor[:, 0]
    mask = _acts(m, [site]).mask
    add, abl = steering.AddVector(v, layers=1), steering.Ablate(r, layers=1)

    def proj_out(x):
        return x - (x @ ru)[..., None] * ru

    cases = {
        (add, abl): proj_out(base + v),
        (abl, add): proj_out(base) + v,
        (add, Doubler(site), abl): proj_out(2 * (base + v)),
    }
    for ivs, want in cases.items():
        got = _acts(m, [site], *ivs).tensor[:, 0]
        torch.testing.assert_close(got[mask], want[mask], rtol=1e-5, atol=1e-5)
    with steering.apply(m, [add, abl]):  # a list is unpacked
        listed = capture(m, PROMPTS, sites=[site], positions="all", runtime=Runtime(progress=False)).tensor[:,
                         0]
    torch.testing.assert_close(listed[mask], proj_out(base + v)[mask], rtol=1e-5, atol=1e-5)
    with steering.apply(m, add), steering.apply(m, abl):  # nested blocks compose in entry order
        nested = capture(m, PROMPTS, sites=[site], positions="all", runtime=Runtime(progress=False)).tensor[:,
                         0]
    torch.testing.assert_close(nested[mask], proj_out(base + v)[mask], rtol=1e-5, atol=1e-5)
    assert count_hooks(m.hf) == 0


def test_hooks_removed_on_exception_and_protocol_without_apply():
    m = tiny_model("llama")
    with pytest.raises(KeyError):
        with steering.apply(m, steering.DirectionalAblation(_vec(m.d_model))):
            raise KeyError("boom")
    assert count_hooks(m.hf) == 0
    ids = torch.tensor([[5, 6, 7, 8]])
    iv = steering.AddVector(_vec(m.d_model), layers=0)
    with torch.no_grad():
        with hooks(m, iv.hook_fns(m)):  # plain interp.hooks: fine for scope='both', positions='all'
            a = m.hf(ids).logits
        with steering.apply(m, iv):
            b = m.hf(ids).logits
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    scoped = steering.AddVector(_vec(m.d_model), layers=0, scope="prompt")  # plain hooks record the token state too
    with torch.no_grad():
        with hooks(m, scoped.hook_fns(m)):
            a = m.hf.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0, output_scores=True,
                              return_dict_in_generate=True)
        with steering.apply(m, scoped):
            b = m.hf.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0, output_scores=True,
                              return_dict_in_generate=True)
    assert torch.equal(a.sequences, b.sequences) and all(torch.equal(x, y) for x, y in zip(a.scores, b.scores))
    (site, fn), = scoped.hook_fns(m).items()
    with pytest.raises(RuntimeError, match="steering.apply"):  # called by hand: no pass recorded
        fn(torch.zeros(1, 4, m.d_model), HookContext(parse_site(site, m.n_layers), m))


def test_bad_input_errors():
    m = tiny_model("llama")
    d = m.d_model
    with pytest.raises(ValueError, match="width"):
        with steering.apply(m, steering.AddVector(torch.randn(d + 1), layers=0)):
            pass
    with pytest.raises(ValueError, match="finite"):
        steering.AddVector(torch.randn(d), layers=0, alpha=float("inf"))
    with pytest.raises(ValueError, match="finite"):
        steering.Clamp(torch.randn(d), value=float("nan"), layers=0)
    with pytest.raises(ValueError, match="NaN"):
        steering.Ablate(torch.full((d,), float("nan")))
    with pytest.raises(ValueError, match="out of range"):
        with steering.apply(m, steering.AddVector(torch.randn(d), layers=2)):
            pass
    with pytest.raises(ValueError, match="zero norm"):
        with steering.apply(m, steering.Ablate(torch.zeros(d))):
            pass
    bad = torch.randn(3, d)
    with pytest.raises(ValueError, match="orthonormalize=True"):
        steering.AblateSubspace(bad)
    with pytest.warns(UserWarning, match="orthonormalised"):
        iv = steering.AblateSubspace(bad, orthonormalize=True, layers=1)
    acts = _acts(m, ["blocks.1.hook_resid_post"], iv)
    assert (acts.tensor[:, 0] @ bad.T).abs().max() <= 1e-4  # same span removed
    with pytest.raises(ValueError, match="scope"):
        steering.Ablate(torch.randn(d), scope="response")
    with pytest.raises(ValueError, match="scope='generated'"):
        steering.Ablate(torch.randn(d), scope="generated", positions=[-1])
    with pytest.raises(ValueError, match="residual-width"):
        steering.Ablate(torch.randn(d), sites="attn_z")
    with pytest.raises(TypeError, match="hook_fns"):
        with steering.apply(m, object()):
            pass
    with pytest.raises(ValueError, match="out of range for a prompt"):
        with torch.no_grad(), steering.apply(m, steering.AddVector(torch.randn(d), layers=0, positions=[5])):
            m.hf(torch.tensor([[5, 6, 7]]))
    with pytest.raises(ValueError, match="post-instruction mask"):
        with torch.no_grad(), steering.apply(m, steering.AddVector(torch.randn(d), layers=0,
                                                                   positions="post_instruction")):
            m.hf(torch.tensor([[5, 6, 7]]))
    with pytest.raises(ValueError, match="parallel residual"):
        neox = tiny_model("gpt_neox")
        with steering.apply(neox, steering.Ablate(torch.randn(neox.d_model), sites="resid_mid")):
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        steering.AblateSubspace(torch.linalg.qr(torch.randn(d, 2))[0].T)  # orthonormal: no warning
