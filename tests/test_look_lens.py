"""Logit lens and tuned lens: exact against the model's own logits (every tiny family) and TransformerLens's
``accumulated_resid(apply_ln=True)`` + ``unembed`` (SmolLM2-135M-Instruct); the tuned lens trained on real text
beats the logit lens at every layer on held-out text; save / load; figures; bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import interp
from interp.look.lens import logit_lens, readout
from interp.look.lens_result import LogitLens
from interp.look.tuned_lens import TunedLens, train_tuned_lens
from interp.readout import logits
from interp.testing.tiny import FAMILIES, tiny_model

QUIET = interp.Runtime(progress=False)
PROMPTS = ["the man said", "what is the good word now, tell me"]


@pytest.mark.parametrize("family", FAMILIES)
def test_last_layer_lens_equals_model_logits(family):
    m = tiny_model(family)
    ref = logits(m, PROMPTS, positions="last").log_softmax(-1)
    r = logit_lens(m, PROMPTS, sites=f"resid_post.{m.n_layers - 1}", keep_logprobs=True, runtime=QUIET)
    assert r.sites == [f"blocks.{m.n_layers - 1}.hook_resid_post", "ln_final.hook_out"]
    assert r.logprobs.shape == (2, 2, 1, m.config.vocab_size)
    torch.testing.assert_close(r.logprobs[:, 0, 0], ref, atol=1e-5, rtol=0)   # the lens at the last layer
    torch.testing.assert_close(r.logprobs[:, 1, 0], ref, atol=1e-5, rtol=0)   # the model's output row
    assert float(r.kl[:, 0].abs().max()) < 1e-5
    assert torch.equal(r.top_ids[:, 0, 0], ref.topk(5).indices)


def test_lens_all_positions_keeps_topk_not_vocab():
    m = tiny_model("llama")
    r = logit_lens(m, PROMPTS, positions="all", targets=["the", 5], runtime=QUIET)
    full = logit_lens(m, PROMPTS, positions="all", targets=["the", 5], keep_logprobs=True, runtime=QUIET)
    assert r.logprobs is None and full.logprobs.shape[-1] == m.config.vocab_size
    n, S, P = r.kl.shape
    assert (n, S) == (2, m.n_layers + 1) and r.top_ids.shape == (n, S, P, 5)
    assert r.mask.sum(1).tolist() == [len(r.tokens[i]) - r.tokens[i].count("") for i in range(2)]
    m_ = r.mask[:, None].expand(n, S, P)
    ids = m.tokenizer.encode("the", add_special_tokens=False) + [5]
    torch.testing.assert_close(r.target_logprobs[m_], full.logprobs[..., ids][m_])
    torch.testing.assert_close(r.top_probs[..., 0][m_], full.logprobs.exp().max(-1).values[m_])
    assert torch.isnan(r.kl[~m_]).all()
    assert full.kl[:, -1][r.mask].abs().max() < 1e-6    # the output row is the final distribution itself


def _tl_lens(tl, ids):
    with torch.no_grad():
        _, cache = tl.run_with_cache(torch.tensor([ids]))
        stack, labels = cache.accumulated_resid(apply_ln=True, incl_mid=True, return_labels=True)
        return tl.unembed(stack).log_softmax(-1)[:, 0], labels


@pytest.mark.slow
def test_lens_matches_transformer_lens_on_smollm2():
    from interp.testing.oracles import transformer_lens_model

    # float64 on both sides: in float32 the two differ by 1.03e-4 where layer 0's log-probs reach -260 (float32
    # rounding of the logits, 4e-7 relative), which would measure the dtype, not the lens
    m = interp.load_model("smollm2-135m-instruct", dtype="float64")
    tl = transformer_lens_model(m)
    texts = interp.Prompts(("The capital of France is", "I like to read books about"), chat=False)
    _, encs = texts.encode(m)
    L = m.n_layers
    for i, text in enumerate(texts.texts):
        ours = logit_lens(m, interp.Prompts((text,), chat=False), ["resid_pre", "resid_mid", f"resid_post.{L - 1}"],
                          positions="all", keep_logprobs=True,
                          runtime=interp.Runtime(progress=False, dtype=torch.float64))
        theirs, labels = _tl_lens(tl, encs[i].ids)
        assert labels[0] == "0_pre" and labels[1] == "0_mid" and labels[-1] == "final_post"
        order = [ours.sites.index(f"blocks.{j}.hook_resid_{'pre' if lab.endswith('pre') else 'mid'}")
                 for lab in labels[:-1] for j in [int(lab.split("_")[0])]] + [ours.sites.index(f"blocks.{L - 1}.hook_resid_post")]
        diff = (ours.logprobs[0, order] - theirs).abs().max()
        assert float(diff) < 1e-4, f"lens differs from TransformerLens by {float(diff)}"


def _texts(n: int) -> list[str]:
    """The first ``n`` of the repository's own harmless instructions (real English requests, no ../shared needed)."""
    path = Path(interp.__file__).parent / "data" / "prompts" / "harmless_realistic.jsonl"
    return [json.loads(line)["instruction"] for line in path.read_text().splitlines() if line.strip()][:n]


@pytest.mark.slow
def test_tuned_lens_beats_logit_lens_at_every_layer_of_smollm2(tmp_path):
    m = interp.load_model("smollm2-135m-instruct")
    texts = interp.Prompts(tuple(_texts(60)), chat=False)          # 60 real instructions, 12 held out
    tuned = train_tuned_lens(m, texts, steps=20, lr=1e-3, batch_tokens=32, runtime=QUIET)
    logit_kl, tuned_kl = tuned.meta["heldout_kl_logit"], tuned.meta["heldout_kl_tuned"]
    assert len(tuned_kl) == m.n_layers - 1 and tuned.meta["heldout_tokens"] > 100
    worse = [i for i, (a, b) in enumerate(zip(logit_kl, tuned_kl)) if not b < a]
    assert not worse, f"tuned lens not better at layers {worse}: logit {logit_kl} tuned {tuned_kl}"
    # the result type through the tuned lens, both spellings, and the save / load round trip
    prompt = interp.Prompts(("I enjoy meeting new people",), chat=False)
    a = tuned.lens(m, prompt, runtime=QUIET)
    b = logit_lens(m, prompt, tuned.sites, lens=tuned, runtime=QUIET)
    assert isinstance(a, LogitLens) and a.lens == "tuned" and torch.equal(a.kl, b.kl)
    tuned.save(tmp_path / "lens")
    back = TunedLens.load(tmp_path / "lens", m)
    assert torch.equal(back.weight, tuned.weight) and torch.equal(back.bias, tuned.bias)
    assert back.sites == tuned.sites and back.meta == tuned.meta
    assert torch.equal(back.lens(m, prompt, runtime=QUIET).kl, a.kl)


def test_tuned_lens_save_load_and_other_width_refused(tmp_path):
    m = tiny_model("llama", n_layers=3)
    texts = [f"the {w} said a word to the man" for w in ("man", "boy", "mother", "father", "people", "animal")]
    tuned = train_tuned_lens(m, texts, steps=3, batch_tokens=8, runtime=QUIET)
    assert tuned.sites == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    assert tuned.weight.shape == (2, 64, 64) and tuned.weight.abs().sum() > 0
    again = train_tuned_lens(m, texts, steps=3, batch_tokens=8, runtime=QUIET)
    assert torch.equal(again.weight, tuned.weight)                   # seeded
    tuned.save(tmp_path / "t")
    with pytest.raises(FileExistsError):
        tuned.save(tmp_path / "t")
    back = interp.bundle.load(tmp_path / "t")
    assert isinstance(back, TunedLens) and torch.equal(back.weight, tuned.weight)
    with pytest.raises(ValueError, match="width 64.*width 32"):
        TunedLens.load(tmp_path / "t", tiny_model("llama", n_layers=3, d_model=32))
    # the last layer's residual is what the model reads out: the tuned lens is the identity there, so every-layer
    # calls work without a translator for it; a layer it was not trained on is refused
    last = logit_lens(m, PROMPTS, "resid_post.2", lens=tuned, runtime=QUIET)
    assert torch.equal(last.kl, logit_lens(m, PROMPTS, "resid_post.2", runtime=QUIET).kl)
    assert logit_lens(m, PROMPTS, lens=tuned, runtime=QUIET).kl.shape[1] == 4       # 3 layers + the output
    part = train_tuned_lens(m, texts, layers=[0], steps=1, batch_tokens=8, runtime=QUIET)
    with pytest.raises(ValueError, match="no translator"):
        logit_lens(m, PROMPTS, "resid_post.1", lens=part, runtime=QUIET)


def test_untrained_tuned_lens_is_the_logit_lens():
    m = tiny_model("qwen2")
    tuned = train_tuned_lens(m, [f"the {w} is here" for w in ("man", "boy", "air")], steps=0, runtime=QUIET)
    a = logit_lens(m, PROMPTS, "resid_post.0", positions="all", runtime=QUIET)
    b = logit_lens(m, PROMPTS, "resid_post.0", positions="all", lens=tuned, runtime=QUIET)
    assert torch.equal(a.top_ids, b.top_ids) and torch.allclose(a.kl, b.kl, equal_nan=True)
    assert tuned.meta["heldout_kl_logit"] == tuned.meta["heldout_kl_tuned"]


def test_readout_leaves_model_grads_alone():
    m = tiny_model("gemma2")
    h = torch.randn(3, m.d_model, requires_grad=True)
    readout(m, h).logsumexp(-1).sum().backward()
    assert h.grad is not None and all(p.grad is None for p in m.hf.parameters())


def test_plots_frame_summary_and_result_round_trip(tmp_path):
    m = tiny_model("llama")
    r = logit_lens(m, PROMPTS, positions="all", targets=["the", "man"], runtime=QUIET)
    fig = r.plot(prompt=1)
    real = r.mask[1].nonzero()[:, 0].tolist()
    hm = fig.data[0]
    assert hm.type == "heatmap" and list(hm.y) == r.sites and len(hm.x) == len(real)
    assert hm.x[-1].endswith(r.tokens[1][-1])
    torch.testing.assert_close(torch.tensor(hm.z), r.top_probs[1, :, real, 0].to(torch.float64).float())
    assert hm.text[0][-1] == r.vocab[str(int(r.top_ids[1, 0, real[-1], 0]))]
    tf = r.plot(kind="target")
    assert [t.name for t in tf.data] == ["'the'", "'man'"] and tf.layout.xaxis.title.text == "layer"
    assert list(tf.data[0].x) == [0, 1, 2]
    torch.testing.assert_close(torch.tensor(tf.data[1].y).float(), r.target_logprobs[0, :, -1, 1].exp())
    kf = r.plot(kind="kl")
    torch.testing.assert_close(torch.tensor(kf.data[0].y).float(), r.mean_kl())
    df = r.to_frame()
    assert len(df) == int(r.mask.sum()) * len(r.sites)
    assert {"site", "layer", "position", "token", "top_token", "top_prob", "kl", "entropy", "logprob:the"} <= set(df)
    s = r.summary()
    assert s["lens"] == "logit" and set(s["mean_kl"]) == set(r.sites) and abs(s["mean_kl"]["ln_final.hook_out"]) < 1e-6
    r.save(tmp_path / "r")
    back = LogitLens.load(tmp_path / "r")
    assert torch.equal(back.top_ids, r.top_ids) and back.vocab == r.vocab and back.tokens == r.tokens
    with pytest.raises(ValueError, match="without targets"):
        logit_lens(m, PROMPTS, runtime=QUIET).plot(kind="target")


def test_bad_input_is_refused_with_the_fix():
    m = tiny_model("llama")
    with pytest.raises(ValueError, match="out of range.*layers 0..1"):
        logit_lens(m, PROMPTS, "resid_post", layers=[5])
    with pytest.raises(ValueError, match="out of range"):
        logit_lens(m, PROMPTS, "resid_post.7")
    with pytest.raises(ValueError, match="residual stream only.*attn_z.*resid_post"):
        logit_lens(m, PROMPTS, "attn_z")
    with pytest.raises(ValueError, match="not a residual site"):
        logit_lens(m, PROMPTS, "mlp_out.1")
    with pytest.raises(ValueError, match="'last' or 'all'"):
        logit_lens(m, PROMPTS, positions="prompt_mean")
    with pytest.raises(ValueError, match="one token"):
        logit_lens(m, PROMPTS, targets=["the man"])
    with pytest.raises(ValueError, match="out of range"):
        logit_lens(m, PROMPTS, targets=[10_000])
    with pytest.raises(ValueError, match="heldout"):
        train_tuned_lens(m, ["just one"], steps=1)
