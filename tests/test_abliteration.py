"""Edit families of heretic-style abliteration (issue 36, part 1): weighted ablation with per-writer layer kernels,
the interpolated direction index, ablation to a reference level, the orthogonalised direction, the norm-preserving
bake; each bake equals its hook form on dense and MoE tiny models, and bad input fails with a clear error."""

from __future__ import annotations

import pytest
import torch

import steering
from interp.testing.tiny import tiny_model
from steering.abliteration import AblationKernel, WeightedAblation, direction_at, orthogonalize
from steering.abliteration_norm import NormPreservingAblation, WriterAblation

IDS = torch.randint(7, 200, (2, 12), generator=torch.Generator().manual_seed(0))
DENSE = ("llama", "qwen3", "gpt2", "gpt_neox")
MOE = ("mixtral", "qwen2_moe")
POST_NORM = ("gemma2", "gemma3_text")


def _vec(d, seed=1):
    return torch.randn(d, generator=torch.Generator().manual_seed(seed))


def _model(family, n_layers=4):
    """A 4-layer tiny model whose biases are nonzero (HF initialises them to zero, which would hide bias handling)."""
    m = tiny_model(family, n_layers=n_layers)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in m.hf.named_parameters():
            if name.endswith("bias"):
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return m


def _logits(model, *ivs):
    with torch.no_grad():
        if ivs:
            with steering.apply(model, *ivs):
                return model.hf(IDS).logits
        return model.hf(IDS).logits


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


KERNELS = {"attn": AblationKernel(1.0, 1.0, 0.25, 2.0), "mlp": AblationKernel(0.8, 2.5, 0.1, 1.5)}


def test_kernel_weights_equal_hand_computation():
    k = AblationKernel(max_weight=1.2, max_weight_position=2.0, min_weight=0.2, min_weight_distance=2.0)
    # distance 0 -> 1.2; 1 -> 1.2 + 0.5 * (0.2 - 1.2) = 0.7; 2 -> 0.2; 3 -> beyond the distance: 0
    assert k.weights(6) == pytest.approx({0: 0.2, 1: 0.7, 2: 1.2, 3: 0.7, 4: 0.2, 5: 0.0})
    frac = AblationKernel(1.0, 1.5, 0.0, 1.0)
    assert frac.weights(4) == pytest.approx({0: 0.0, 1: 0.5, 2: 0.5, 3: 0.0})
    point = AblationKernel(1.0, 2.0, 0.5, 0.0)       # distance 0: the position alone, at max weight
    assert point.weights(4) == {0: 0.0, 1: 0.0, 2: 1.0, 3: 0.0}


def test_kernel_bad_input():
    with pytest.raises(ValueError, match="min_weight .* above max_weight"):
        AblationKernel(0.5, 1.0, 0.9, 1.0)
    with pytest.raises(ValueError, match="min_weight_distance .* negative"):
        AblationKernel(1.0, 1.0, 0.5, -1.0)
    with pytest.raises(ValueError, match="beyond the model's 4 layers"):
        AblationKernel(1.0, 4.5, 0.5, 1.0).weights(4)
    m = _model("llama")
    with pytest.raises(ValueError, match="beyond the model's 4 layers"):
        WeightedAblation(_vec(m.d_model), kernel=AblationKernel(1.0, 7.0, 0.0, 2.0)).hook_fns(m)
    with pytest.raises(ValueError, match="one weight per layer"):
        WeightedAblation(_vec(m.d_model), kernel=[1.0, 0.5]).hook_fns(m)
    partial = {2: _vec(m.d_model), 3: _vec(m.d_model, 2)}      # per-layer directions for two layers only
    with pytest.raises(ValueError, match=r"weighs layers \[0, 1\] but the direction has none there"):
        WeightedAblation(partial, kernel=1.0).hook_fns(m)
    assert sorted(WeightedAblation(partial, kernel=1.0, layers=[2, 3]).hook_fns(m)) == [
        "blocks.2.hook_attn_out", "blocks.2.hook_mlp_out", "blocks.3.hook_attn_out", "blocks.3.hook_mlp_out"]


def test_direction_at_interpolates_and_normalises():
    dirs = torch.randn(5, 16, generator=torch.Generator().manual_seed(2))
    got = direction_at(dirs, 1.25)
    want = torch.lerp(dirs[1], dirs[2], 0.25)
    assert torch.allclose(got, want / want.norm(), atol=1e-6)
    assert torch.allclose(direction_at(dirs, 3.0), dirs[3] / dirs[3].norm(), atol=1e-6)
    table = {4: dirs[0], 5: dirs[1]}
    assert torch.allclose(direction_at(table, 4.5), (dirs[0] + dirs[1]) / (dirs[0] + dirs[1]).norm(), atol=1e-6)
    with pytest.raises(ValueError, match="outside"):
        direction_at(dirs, 4.5)
    with pytest.raises(ValueError, match="no direction for layer 5"):
        direction_at({4: dirs[0], 6: dirs[1]}, 4.5)


def test_orthogonalize_against_the_mean():
    r, mean = _vec(32, 1), _vec(32, 2)
    got = orthogonalize(r, mean)
    assert abs(float(got @ mean)) < 1e-5 and float(got.norm()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="width"):
        orthogonalize(r, _vec(16))


def test_weighted_hooks_equal_hand_formula():
    """At one writer: x - w (x.r - ref) r, with w from the kernel at that layer."""
    m = _model("llama")
    r = _vec(m.d_model)
    u = r / r.norm()
    edit = WeightedAblation(r, kernel={"attn": [0.0, 0.5, 0.0, 0.0]}, writers=("attn",), reference=0.3)
    fns = edit.hook_fns(m)
    assert list(fns) == ["blocks.1.hook_attn_out"]
    x = torch.randn(1, 3, m.d_model, generator=torch.Generator().manual_seed(3))
    got = fns["blocks.1.hook_attn_out"](x, type("Ctx", (), {"tokens": None})())
    want = x - 0.5 * ((x @ u) - 0.3)[..., None] * u
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("family", DENSE + MOE)
def test_weighted_bake_equals_hooks(family):
    m = _model(family)
    r = _vec(m.d_model)
    writers = ("embed", "attn", "mlp")
    edit = WeightedAblation(r, kernel={**KERNELS, "embed": 0.7}, writers=writers)
    plain, hooked = _logits(m), _logits(m, edit)
    assert _rel(hooked, plain) > 1e-3
    res = edit.bake(m)
    assert res.exact and res.rel_logit_error < 1e-4
    assert _rel(_logits(res.model), hooked) < 1e-4
    assert _rel(_logits(m), plain) == 0.0                   # the original is untouched


@pytest.mark.parametrize("family", ("llama", "gpt2", "qwen3", "qwen2_moe"))
def test_reference_level_bake_equals_hooks(family):
    """Ablation to a per-layer reference level: the bake adds w * ref * r as a writer bias."""
    m = _model(family)
    r = _vec(m.d_model)
    means = torch.randn(m.n_layers, m.d_model, generator=torch.Generator().manual_seed(9))
    kernel = {"attn": KERNELS["attn"]} if m.spec.is_moe else KERNELS
    edit = WeightedAblation(r, kernel=kernel, writers=tuple(kernel), reference=means)
    zero = WeightedAblation(r, kernel=kernel, writers=tuple(kernel))
    hooked = _logits(m, edit)
    assert _rel(hooked, _logits(m, zero)) > 1e-3            # the reference level changes the edit
    res = edit.bake(m)
    assert _rel(_logits(res.model), hooked) < 1e-4


def test_per_layer_directions_bake_equals_hooks():
    """A direction per layer (``[n_layers, d]``), as heretic uses without a direction index."""
    m = _model("qwen3")
    dirs = torch.randn(m.n_layers, m.d_model, generator=torch.Generator().manual_seed(4))
    edit = WeightedAblation(dirs, kernel=KERNELS)
    one = WeightedAblation(dirs[1], kernel=KERNELS)
    hooked = _logits(m, edit)
    assert _rel(hooked, _logits(m, one)) > 1e-3
    assert _rel(_logits(edit.bake(m).model), hooked) < 1e-4


def test_reference_bad_input():
    m = _model("llama")
    r = _vec(m.d_model)
    with pytest.raises(ValueError, match="width 32 but the model's residual stream has width 64"):
        WeightedAblation(r, kernel=1.0, reference=torch.randn(32)).hook_fns(m)
    moe = _model("qwen2_moe")
    edit = WeightedAblation(_vec(moe.d_model), kernel=1.0, writers=("mlp",), reference=0.5)
    with pytest.raises(ValueError, match="router"):
        edit.bake(moe)


@pytest.mark.parametrize("family", POST_NORM)
def test_post_norm_families(family):
    """The embedding bakes exactly; a writer before a post-sublayer norm cannot, and says so."""
    m = _model(family)
    r = _vec(m.d_model)
    emb = WeightedAblation(r, kernel={"embed": 0.6}, writers=("embed",), reference=0.2)
    res = emb.bake(m)
    assert _rel(_logits(res.model), _logits(m, emb)) < 1e-4
    with pytest.raises(ValueError, match="normalises each sublayer's output"):
        WeightedAblation(r, kernel=KERNELS).bake(m)


def test_scopes_hooks_only():
    m = _model("llama")
    r = _vec(m.d_model)
    post = WeightedAblation(r, kernel=1.0, positions=(-1,))
    a, plain = _logits(m, post), _logits(m)
    assert torch.equal(a[:, :-1], plain[:, :-1]) and _rel(a[:, -1], plain[:, -1]) > 1e-3   # causal: the last only
    with pytest.raises(ValueError, match="every token"):
        post.bake(m)


@pytest.mark.parametrize("family", DENSE + MOE + POST_NORM)
def test_norm_preserving_bake_equals_hooks(family):
    """Exact everywhere, post-sublayer norms included: the hook form edits the writer's own output."""
    m = _model(family)
    r = _vec(m.d_model)
    edit = NormPreservingAblation(r, kernel=KERNELS)
    plain, hooked = _logits(m), _logits(m, edit)
    assert _rel(hooked, plain) > 1e-3
    res = edit.bake(m)
    assert _rel(_logits(res.model), hooked) < 1e-4
    assert _rel(_logits(m), plain) == 0.0                   # hooks removed, weights restored


def test_norm_preserving_keeps_row_norms():
    """Heretic's axis: rows of the HF [d_model, d_in] writer weight (one per residual coordinate)."""
    m = _model("llama")
    r = _vec(m.d_model)
    before = m.hf.model.layers[1].self_attn.o_proj.weight.detach().clone()
    res = NormPreservingAblation(r, kernel={"attn": 1.0}, writers=("attn",)).bake(m)
    after = res.model.hf.model.layers[1].self_attn.o_proj.weight.detach()
    assert torch.allclose(after.norm(dim=1), before.norm(dim=1), rtol=1e-5)
    assert not torch.allclose(after, before)


def test_norm_preserving_restores_weights_on_error():
    m = _model("llama")
    before = {k: v.clone() for k, v in m.hf.state_dict().items()}
    with pytest.raises(RuntimeError, match="boom"):
        with steering.apply(m, NormPreservingAblation(_vec(m.d_model), kernel=1.0)):
            raise RuntimeError("boom")
    assert all(torch.equal(before[k], v) for k, v in m.hf.state_dict().items())
    assert not any(mod._forward_hooks for mod in m.hf.modules())


@pytest.mark.parametrize("cls", (WeightedAblation, NormPreservingAblation, WriterAblation))
def test_random_like_keeps_strength(cls):
    m = _model("llama")
    r = 3.0 * _vec(m.d_model)
    edit = cls(r, kernel=KERNELS)
    ctrl = edit.random_like(m, seed=1)
    assert type(ctrl) is cls and ctrl.kernel == edit.kernel
    d = torch.as_tensor(ctrl.direction)
    assert float(d.norm()) == pytest.approx(float(r.norm()), rel=1e-5)
    assert abs(float(d @ r) / float(d.norm() * r.norm())) < 0.5
    assert torch.equal(torch.as_tensor(edit.random_like(m, seed=1).direction), d)
    assert _rel(_logits(m, ctrl), _logits(m, edit)) > 1e-3


@pytest.mark.parametrize("family", ("llama", "qwen2_moe"))
def test_full_weight_equals_directional_ablation(family):
    """Weight 1 at every writer (embedding included) is the refusal-direction recipe's ablation everywhere."""
    m = _model(family)
    r = _vec(m.d_model)
    edit = WeightedAblation(r, kernel={"embed": 1.0, "attn": 1.0, "mlp": 1.0}, writers=("embed", "attn", "mlp"))
    assert _rel(_logits(m, edit), _logits(m, steering.DirectionalAblation(r))) < 1e-4


@pytest.mark.parametrize("cls", (WeightedAblation, NormPreservingAblation, WriterAblation))
def test_generation_hooks_equal_baked(cls):
    """Greedy generations under the hook form equal the baked copy's, token for token."""
    m = _model("llama")
    r = _vec(m.d_model)
    edit = cls(r, kernel={"attn": AblationKernel(2.0, 1.0, 0.5, 2.0), "mlp": 1.5})
    prompts = ["the water is", "write a word about the house"]
    hooked = steering.generate(m, prompts, edit, max_new_tokens=8)
    plain = steering.generate(m, prompts, max_new_tokens=8)
    baked = steering.generate(edit.bake(m).model, prompts, max_new_tokens=8)
    assert hooked.texts == baked.texts and hooked.texts != plain.texts


def test_post_instruction_scope():
    """The hook form takes the main job's post-instruction scope; the norm-preserving edit refuses it by name."""
    m = _model("llama")
    r = _vec(m.d_model)
    prompts = ["the water is", "write a word about the house"]
    kernel = {"attn": 2.0, "mlp": 2.0}
    post = steering.generate(m, prompts, WeightedAblation(r, kernel=kernel, positions="post_instruction"),
                             max_new_tokens=8)
    every = steering.generate(m, prompts, WeightedAblation(r, kernel=kernel), max_new_tokens=8)
    plain = steering.generate(m, prompts, max_new_tokens=8)
    assert post.texts != plain.texts and post.texts != every.texts
    with pytest.raises(ValueError, match="every token"):
        NormPreservingAblation(r, positions="post_instruction")
    with pytest.raises(ValueError, match="WeightedAblation"):
        NormPreservingAblation(r, kernel={"embed": 1.0}, writers=("embed",))


def _ref_kernel(m):
    return {"attn": KERNELS["attn"]} if m.spec.is_moe else KERNELS


@pytest.mark.parametrize("family", ("llama", "gpt2", "gpt_neox", "qwen2_moe", "mixtral"))
def test_writer_ablation_equals_weighted_ablation(family):
    """Where no norm follows a writer, the edit of its own output is the edit at the residual site."""
    m = _model(family)
    r = _vec(m.d_model)
    means = torch.randn(m.n_layers, m.d_model, generator=torch.Generator().manual_seed(9))
    kernel = _ref_kernel(m)
    hooked = _logits(m, WeightedAblation(r, kernel=kernel, writers=tuple(kernel), reference=means))
    assert _rel(_logits(m, WriterAblation(r, kernel=kernel, writers=tuple(kernel), reference=means)), hooked) < 1e-5
    every = _logits(m, WeightedAblation(r, kernel=KERNELS))          # the MLP too (the experts in a MoE)
    assert _rel(_logits(m, WriterAblation(r, kernel=KERNELS)), every) < 1e-5


@pytest.mark.parametrize("family", ("llama", "qwen2_moe") + POST_NORM)
def test_writer_ablation_bake_equals_hooks(family):
    """Exact in every family, post-sublayer norms included, with a reference level (biases added where missing)."""
    m = _model(family)
    r = _vec(m.d_model)
    means = torch.randn(m.n_layers, m.d_model, generator=torch.Generator().manual_seed(9))
    kernel = _ref_kernel(m)
    edit = WriterAblation(r, kernel=kernel, writers=tuple(kernel), reference=means)
    plain, hooked = _logits(m), _logits(m, edit)
    assert _rel(hooked, _logits(m, WriterAblation(r, kernel=kernel, writers=tuple(kernel)))) > 1e-3
    res = edit.bake(m)
    assert _rel(_logits(res.model), hooked) < 1e-4
    assert _rel(_logits(m), plain) == 0.0


@pytest.mark.parametrize("cls", (WeightedAblation, WriterAblation))
def test_reference_bake_saves_and_reloads(cls, tmp_path):
    """A reference level baked as biases the config flags build: save_pretrained and plain transformers reload it;
    where the config has no flag (Qwen3's MLP) the save paths refuse the model, naming the fix."""
    from transformers import AutoModelForCausalLM

    from steering.bias import check_saveable

    m = _model("llama")
    r = _vec(m.d_model)
    edit = cls(r, kernel=KERNELS, reference=0.4)
    baked = edit.bake(m).model
    check_saveable(baked, "save")
    baked.hf.save_pretrained(tmp_path / "baked")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "baked").eval()
    with torch.no_grad():
        assert _rel(again(IDS).logits, _logits(m, edit)) < 1e-4
    q = _model("qwen3")
    with pytest.raises(ValueError, match="resid_pre 0"):
        check_saveable(cls(_vec(q.d_model), kernel=KERNELS, reference=0.4).bake(q).model, "save")


@pytest.mark.parametrize("cls", (WeightedAblation, NormPreservingAblation))
def test_a_spec_and_a_per_layer_reference_from_another_model_are_refused(cls, tmp_path):
    """Issue 36's bad input: per-layer reference levels of another width (table and dict), and a saved edit of this
    family loaded into a model of another width or depth."""
    m = _model("llama")
    r = _vec(m.d_model)
    if cls is WeightedAblation:
        for ref in (torch.randn(m.n_layers, 32), {layer: torch.randn(32) for layer in range(m.n_layers)}):
            with pytest.raises(ValueError, match="width 32"):
                cls(r, kernel=KERNELS, reference=ref).hook_fns(m)
    edit = cls(r, KERNELS, ("attn", "mlp"))
    steering.save_edit(edit, tmp_path / "e", model=m)
    assert torch.equal(_logits(m, steering.load_edit(tmp_path / "e", model=m)), _logits(m, edit))
    with pytest.raises(ValueError, match="width 32"):
        steering.load_edit(tmp_path / "e", model=tiny_model("llama", d_model=32))
    with pytest.raises(ValueError, match="3 layers"):
        steering.load_edit(tmp_path / "e", model=tiny_model("llama", n_layers=3))
