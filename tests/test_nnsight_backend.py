"""The nnsight backend (interp.from_nnsight(lm, backend="nnsight")): capture and steering run as nnsight traces
and equal our hooks on the same weights; nnsight's dry run of the remote path ships none of our code."""

from __future__ import annotations

import warnings

import pytest
import torch

import interp
import steering
from interp.adapters import from_nnsight
from interp.capturing import capture
from interp.forward import batch_of, forward, last_logits
from interp.nnsight_backend import NNsightModel
from interp.readout import logits, token_logprobs
from interp.sites import ATTN_KINDS, parse_site
from interp.testing.tiny import tiny_model
from interp.values import Prompts, Runtime

PROMPTS = ["the man said to the boy", "help", "what is the good word", "where is the old house by the water now ?"]
OURS = ("interp", "probes", "sae", "steering")


def _pair(family: str = "llama", remote: bool | str = False) -> tuple:
    """(our hooked model, the nnsight-backed model over the same HF module)."""
    from nnsight import LanguageModel

    m = tiny_model(family)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LanguageModel is deprecated in 0.8 in favour of TransformersModel
        lm = LanguageModel(m.hf, tokenizer=m.tokenizer)
    a = from_nnsight(lm, backend="nnsight", remote=remote)
    assert isinstance(a, NNsightModel) and a.hf is m.hf
    return m, a


@pytest.fixture(scope="module")
def llama():
    return _pair("llama")


def _close(x: torch.Tensor, y: torch.Tensor) -> None:
    torch.testing.assert_close(x, y, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2", "gpt_neox", "olmo2", "qwen3_moe"])
def test_capture_every_site_equals_hooks(family):
    """Every site kind (residual, attention heads, neurons, final norm before and after its gain), padded batches."""
    m, a = _pair(family)
    names = [s for s in m.site_names() if "expert" not in s and parse_site(s).kind not in ATTN_KINDS]  # refused there
    groups = [[s for s in names if not s.endswith(("hook_z", "mlp.hook_post"))],
              [s for s in names if s.endswith("hook_z")], [s for s in names if s.endswith("mlp.hook_post")]]
    for sites in (g for g in groups if g):
        x = capture(a, PROMPTS, sites=sites, positions="all", runtime=Runtime(batch_size=3, progress=False))
        y = capture(m, PROMPTS, sites=sites, positions="all", runtime=Runtime(batch_size=3, progress=False))
        assert x.sites == y.sites and torch.equal(x.mask, y.mask)
        _close(x.tensor, y.tensor)


@pytest.mark.parametrize("positions", ["last", "post_instruction", "prompt_mean", "response_mean", [0, -1], -2])
def test_capture_positions_equal_hooks(llama, positions):
    m, a = llama
    responses = ["yes", "no it is not", "a word", "by the water"] if positions == "response_mean" else None
    kw = dict(sites=["resid_pre", "resid_mid", "resid_post", "ln_final"], positions=positions,
              runtime=Runtime(batch_size=3, progress=False))
    prompts = Prompts(PROMPTS, responses=responses)
    x, y = capture(a, prompts, **kw), capture(m, prompts, **kw)
    assert (x.mask is None) == (y.mask is None) and x.tensor.shape == y.tensor.shape
    _close(x.tensor, y.tensor)


def test_capture_to_a_store_and_logits(llama, tmp_path):
    m, a = llama
    store = capture(a, PROMPTS, sites="resid_post", positions="last", out=tmp_path / "s",
                    runtime=Runtime(batch_size=2, progress=False))
    _close(store.load().tensor, capture(m, PROMPTS, sites="resid_post",
                                        runtime=Runtime(progress=False)).tensor)
    _close(logits(a, PROMPTS, batch_size=3), logits(m, PROMPTS))
    for x, y in zip(logits(a, PROMPTS, positions="all"), logits(m, PROMPTS, positions="all"), strict=True):
        _close(x, y)
    tl_a, tl_m = token_logprobs(a, PROMPTS[:2], ["yes", "no"]), token_logprobs(m, PROMPTS[:2], ["yes", "no"])
    for x, y in zip(tl_a, tl_m, strict=True):
        _close(x.logprobs, y.logprobs)
    b = batch_of(m, PROMPTS)
    _close(forward(a, b, logits="last", repeat=2), forward(m, b, logits="last", repeat=2))


def _interventions(d: int) -> list:
    g = torch.Generator().manual_seed(0)
    v, r = torch.randn(d, generator=g), torch.randn(d, generator=g)
    basis = torch.linalg.qr(torch.randn(d, 3, generator=g))[0].T
    return [steering.AddVector(v, layers=[0, 1], alpha=3.0, sites=("resid_pre", "resid_mid", "attn_out", "mlp_out")),
            steering.AddVector(v, layers=1, alpha=2.0, positions="post_instruction"),
            steering.AddVector(v, layers=0, alpha=2.0, positions=[0, -1], sites="resid_mid"),
            steering.AddVector(v, layers=1, alpha=2.0, scope="generated"),
            steering.DirectionalAblation(r),
            steering.Clamp(r, 3.0, layers="all").when(v, 0.0),
            steering.AblateSubspace(basis, layers=[1], sites="resid_post")]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_steered_logits_and_capture_equal_hooks(family):
    """Additive steering (sites, positions, scope), directional ablation, conditional clamp, subspace ablation;
    a capture inside the block sees the steered activations on both routes."""
    m, a = _pair(family)
    b = batch_of(m, PROMPTS)
    plain = last_logits(m, b)
    for iv in _interventions(m.d_model):
        with steering.apply(a, iv):
            got = last_logits(a, b)
            acts = capture(a, PROMPTS, sites=["resid_mid", "resid_post"], positions="all",
                           runtime=Runtime(progress=False))
        with steering.apply(m, iv) as h:
            h.set_batch(b)  # the hooks route learns the post-instruction mask this way; the trace reads the batch
            want = last_logits(m, b)
            h.set_batch(b)
            ref = capture(m, PROMPTS, sites=["resid_mid", "resid_post"], positions="all",
                          runtime=Runtime(progress=False))
        _close(got, want)
        _close(acts.tensor, ref.tensor)
        moved = (got - plain).abs().max()
        assert moved < 1e-6 if iv.scope == "generated" else moved > 1e-3, type(iv).__name__
    assert a.edits == []  # nothing left after the blocks


def test_add_vector_equals_plain_nnsight_code(llama):
    """Against an nnsight trace written by hand (no code of ours): add alpha * v to layer 1's output."""
    m, a = llama
    b = batch_of(m, PROMPTS)
    v = torch.randn(m.d_model, generator=torch.Generator().manual_seed(3))
    with steering.apply(a, steering.AddVector(v, layers=1, alpha=4.0)), steering.apply(
            a, steering.AddVector(v, layers=0, alpha=-1.0, sites="resid_pre")):
        got = last_logits(a, b)
    lm = a.lm
    with torch.no_grad(), lm.trace(**b.model_inputs, use_cache=False):
        lm.model.layers[0].input = lm.model.layers[0].input - v
        lm.model.layers[1].output = lm.model.layers[1].output + 4.0 * v
        out = lm.output.logits.save()
    _close(got, out[:, -1].float())


def test_remote_dry_run_ships_no_code_of_ours(monkeypatch):
    """nnsight's remote="local": the block is serialised as for NDIF and run from the payload. The payload must
    name no module of this project (NDIF does not have it): deserialise it again refusing our modules."""
    import nnsight.ndif
    from nnsight.intervention.serialization import CustomCloudUnpickler
    from nnsight.schema.request import RequestModel

    monkeypatch.setattr(nnsight.ndif, "_PULLED_ENV", True)  # no shipping of local modules by value
    blobs: list[bytes] = []
    original = RequestModel.serialize.__func__
    monkeypatch.setattr(RequestModel, "serialize", classmethod(
        lambda cls, tracer, compress=False: blobs.append(original(cls, tracer, compress)) or blobs[-1]))

    class Strict(CustomCloudUnpickler):
        def find_class(self, module: str, name: str):
            if module.split(".")[0] in OURS:
                raise ModuleNotFoundError(f"the payload names {module}.{name}, which the NDIF server does not have")
            return super().find_class(module, name)

    m, a = _pair("llama", remote="local")
    b = batch_of(m, PROMPTS)
    iv = steering.AddVector(torch.ones(m.d_model), layers=1, alpha=0.5, positions=[-1])
    with steering.apply(a, iv):
        got = last_logits(a, b)
        acts = capture(a, PROMPTS, sites=["resid_mid.1", "ln_final"], positions="prompt_mean",
                       runtime=Runtime(progress=False))
    with steering.apply(m, iv):
        want = last_logits(m, b)
        ref = capture(m, PROMPTS, sites=["resid_mid.1", "ln_final"], positions="prompt_mean",
                      runtime=Runtime(progress=False))
    _close(got, want)
    _close(acts.tensor, ref.tensor)
    assert len(blobs) == 2
    for blob in blobs:
        RequestModel.deserialize(blob, a.lm._remoteable_persistent_objects(), unpickler=Strict)


def test_what_the_backend_refuses(llama):
    m, a = llama
    b = batch_of(m, PROMPTS[:1])
    with pytest.raises(NotImplementedError, match="hook functions"):
        forward(a, b, [("resid_post.0", lambda x, ctx: None)])
    with pytest.raises(NotImplementedError, match="grad=True"):
        last_logits(a, b, grad=True)
    with pytest.raises(NotImplementedError, match="generation"):
        steering.generate(a, PROMPTS[:1], max_new_tokens=2, runtime=interp.Runtime(progress=False))

    class LatentEdit:  # an intervention known only by its hook_fns (as the sae package's are)
        def hook_fns(self, model):
            return {"resid_post.0": lambda x, ctx: x}

    class WeightEdit:
        def weights(self, model):
            raise AssertionError("must not be entered")

    for iv, match in ((LatentEdit(), "cannot travel"), (WeightEdit(), "weight edit")):
        with pytest.raises(NotImplementedError, match=match), steering.apply(a, iv):
            pass
    assert a.edits == []
    with pytest.raises(ValueError, match="not available through the nnsight backend"):
        capture(_pair("qwen3_moe")[1], PROMPTS[:1], sites="experts_out.0", runtime=Runtime(progress=False))
    with pytest.raises(ValueError, match="backend must be"):
        from_nnsight(a.lm, backend="vllm")
    with pytest.raises(ValueError, match="backend='nnsight'"):
        from_nnsight(a.lm, backend="hooks", remote=True)
    from nnsight import NNsight

    with pytest.raises(TypeError, match="NDIF can serve"):
        from_nnsight(NNsight(m.hf), tokenizer=m.tokenizer, remote=True)
    plain_nnsight = from_nnsight(NNsight(m.hf), tokenizer=m.tokenizer, backend="nnsight")  # local traces work
    _close(logits(plain_nnsight, PROMPTS), logits(m, PROMPTS))


def test_remote_side_needs_no_weights():
    """With remote=True the local model is nnsight's meta skeleton: everything before the trace (sites, widths,
    position plans, edits) must work on it without reading a weight."""
    from nnsight import NNsight
    from transformers import AutoModelForCausalLM

    from interp.nnsight_backend import schedule
    from interp.positions import plan
    from interp.sites import expand_sites
    from interp.testing.tiny import tiny_config, tiny_tokenizer
    from steering.applying import trace_edits

    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(tiny_config("llama"))
    a = from_nnsight(NNsight(hf), tokenizer=tiny_tokenizer(), backend="nnsight")
    b = batch_of(a, PROMPTS)
    sites = expand_sites(["resid_pre", "resid_mid", "attn_z", "ln_final"], a.n_layers)

    taps = schedule(a, b, [(s, plan("last", b)) for s in sites],
                    trace_edits(a, (steering.DirectionalAblation(torch.ones(a.d_model)),)))
    assert [io for _, io, _ in taps][:4] == ["input", "input", "input", "output"]  # layer 0 in execution order
    assert sum(act[0] == "read" for _, _, acts in taps for act in acts) == len(sites)


def test_every_path_outside_the_backend_is_refused():
    """README's "not through this backend" list, one clear error each, naming from_nnsight(lm) without remote;
    nothing is attached or edited first (with remote=True a hook would not run and an edit would not travel)."""
    from interp.hooking import count_hooks, hooks
    from interp.patching import attribute, logit_diff, make_pairs
    from interp.patching.transplants import transplant
    from interp.tune import TuneConfig, fine_tune
    from sae import SAE, SAEConfig
    from sae.edits import SAESplice

    m, a = _pair("llama")
    fix = r"interp\.from_nnsight\(lm\) attaches our hooks"
    before = {k: v.clone() for k, v in m.hf.state_dict().items()}
    ran: list[int] = []
    with pytest.raises(NotImplementedError, match=rf"interp\.hooks.*{fix}"):
        with hooks(a, {"resid_post.0": lambda x, ctx: ran.append(1)}):
            logits(a, PROMPTS[:1])
    assert ran == [] and count_hooks(a.hf, ours_only=True) == 0
    v = torch.randn(a.d_model)
    with pytest.raises(NotImplementedError, match=rf"weight edit \(bake\).*{fix}"):
        steering.bake(a, v, inplace=True)
    with pytest.raises(NotImplementedError, match=rf"weight edit \(bake_addition\).*{fix}"):
        steering.bake_addition(a, steering.AddVector(v, layers=0, alpha=1.0), inplace=True)
    with pytest.raises(NotImplementedError, match=rf"weight edit \(transplant\).*{fix}"), transplant(a, m, [0]):
        pass
    with pytest.raises(NotImplementedError, match=rf"fine-tuning.*{fix}"):
        fine_tune(a, PROMPTS[:1], ["yes"], TuneConfig(method="full", steps=1), progress=False)
    assert all(torch.equal(before[k], w) for k, w in m.hf.state_dict().items())
    with pytest.raises(NotImplementedError, match=rf"generation.*{fix}"):
        steering.generate(a, PROMPTS[:1], max_new_tokens=2, runtime=interp.Runtime(progress=False))
    tok = a.tokenizer
    met = logit_diff(tok.convert_tokens_to_ids("the"), tok.convert_tokens_to_ids("a"))
    with pytest.raises(NotImplementedError, match=fix):  # gradients (attribution patching)
        attribute(a, make_pairs(a, PROMPTS[:2], PROMPTS[2:]), met, sites="resid_post", runtime=interp.Runtime(progress=False))
    sae = SAE(SAEConfig(a.d_model, 2 * a.d_model, arch="topk", k=4, site="resid_post.0"))
    with pytest.raises(NotImplementedError, match=rf"SAESplice.*{fix}"), steering.apply(a, SAESplice(sae)):
        pass
    moe = _pair("qwen3_moe")[1]
    with pytest.raises(ValueError, match=rf"experts_out.*{fix}"):
        capture(moe, PROMPTS[:1], sites="experts_out.0", runtime=Runtime(progress=False))
    with pytest.raises(ValueError, match=rf"experts_out.*{fix}"), steering.apply(
            moe, steering.AddVector(torch.randn(moe.d_model), layers=0, sites="experts_out", alpha=1.0)):
        pass
    with pytest.raises(NotImplementedError, match=rf"interp\.hooks.*{fix}"), hooks(moe, {"experts_out.0": lambda x, c: x}):
        pass
    assert a.edits == [] and moe.edits == [] and count_hooks(moe.hf, ours_only=True) == 0
