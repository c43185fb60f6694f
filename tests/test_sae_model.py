"""SAEs on a tiny Llama: splice, CE loss recovered, steering and ablation with the error term, contexts."""

from __future__ import annotations

import pytest
import torch

from interp.hooking import count_hooks, hooks
from interp.values import Prompts
from sae.contexts import Context, contexts_html, top_contexts
from sae.edits import LatentAblation, LatentSteering, SAESplice
from sae.model import SAE, SAEConfig
from sae.quality import ce_loss_recovered

PROMPTS = ["the man said to the boy", "what is the good word", "where is the old house by the water now ?",
           "tell me a kind word", "the water is low", "why do they play with the old man"]
RAW = Prompts(PROMPTS, chat=False)   # raw text, as these figures were measured (a plain list gets the template)
SITE = "blocks.0.hook_resid_post"


def _exact_sae(d: int, site: str = SITE) -> SAE:
    """A ReLU SAE that reconstructs exactly: x = relu(x) - relu(-x), latents i and d+i."""
    sae = SAE(SAEConfig(d, 2 * d, arch="relu", site=site))
    eye = torch.eye(d)
    with torch.no_grad():
        sae.W_enc.copy_(torch.cat([eye, -eye], 1))
        sae.W_dec.copy_(torch.cat([eye, -eye], 0))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae


def _logits(model, prompts=PROMPTS):
    enc = model.tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        return model.hf(**enc).logits, enc["attention_mask"].bool()


def test_width_mismatch_between_sae_and_site(tiny_models):
    model = tiny_models("llama")
    sae = SAE(SAEConfig(32, 64, arch="topk", k=4, site=SITE))
    with pytest.raises(ValueError, match="d_in=32 does not match site blocks.0.hook_resid_post .*width 64"):
        SAESplice(sae).hook_fns(model)
    with pytest.raises(ValueError, match="does not record its site"):
        SAESplice(SAE(SAEConfig(64, 128, arch="relu"))).hook_fns(model)
    with pytest.raises(ValueError, match="out of range"):
        LatentSteering(SAE(SAEConfig(64, 128, arch="relu", site=SITE)), 500)


def test_ce_loss_recovered_exact_and_random(tiny_models):
    from interp.evals.logits import cross_entropy
    from interp.forward import batches, forward, prepare
    from sae.quality import predicted

    def summed_ce(logits, b):
        return cross_entropy(logits, b.input_ids, predicted(b))

    model = tiny_models("llama")
    n0 = count_hooks(model.hf)  # HF itself leaves output-recording hooks once output_hidden_states was used
    exact = ce_loss_recovered(model, _exact_sae(model.d_model), RAW, batch_size=4)
    assert abs(exact.sae - exact.clean) < 1e-6 and exact.n_predictions == 32
    assert abs(exact.recovered_zero - 1) < 1e-4 and abs(exact.recovered_mean - 1) < 1e-4
    # the ablation baselines, recomputed by hand with plain hooks and the tokens' own mean
    bs = batches(model, prepare(model, PROMPTS, chat=False)[1], 4)
    acts = []
    for b in bs:
        forward(model, b, {SITE: lambda x, ctx, b=b: acts.append(x[b.attention_mask.bool()].double())})
    mean = torch.cat(acts).mean(0).float()
    zero = sum(summed_ce(forward(model, b, {SITE: lambda x, ctx: x * 0}), b)[0] for b in bs) / 32
    meanab = sum(summed_ce(forward(model, b, {SITE: lambda x, ctx: mean.expand_as(x)}), b)[0] for b in bs) / 32
    assert exact.zero_ablated == pytest.approx(zero, abs=1e-6) and exact.mean_ablated == pytest.approx(meanab, abs=1e-6)
    assert abs(exact.zero_ablated - exact.clean) > 1e-3  # the site matters, so the ratio is defined
    rand = SAE(SAEConfig(model.d_model, 128, arch="topk", k=2, site=SITE), seed=3)
    r = ce_loss_recovered(model, rand, RAW, batch_size=4)
    assert abs(r.sae - r.clean) > 1e-3 and r.clean == pytest.approx(exact.clean, abs=1e-6)
    assert r.recovered_zero == pytest.approx((r.zero_ablated - r.sae) / (r.zero_ablated - r.clean), abs=1e-6)
    # token ids work too (no tokenizer needed)
    ids = torch.randint(5, 200, (3, 9), generator=torch.Generator().manual_seed(0))
    assert ce_loss_recovered(model, _exact_sae(model.d_model), ids).n_predictions == 3 * 8
    assert count_hooks(model.hf) == n0


def test_splice_keep_error_is_identity_and_plain_splice_is_not(tiny_models):
    model = tiny_models("llama")
    base, mask = _logits(model)
    sae = SAE(SAEConfig(model.d_model, 128, arch="topk", k=4, site=SITE), seed=1)
    with hooks(model, SAESplice(sae, keep_error=True).hook_fns(model)):
        kept, _ = _logits(model)
    with hooks(model, SAESplice(sae).hook_fns(model)):
        spliced, _ = _logits(model)
    torch.testing.assert_close(kept[mask], base[mask], atol=1e-5, rtol=0)
    assert (spliced[mask] - base[mask]).abs().max() > 1e-2


def test_latent_steering_adds_the_decoder_vector(tiny_models):
    model = tiny_models("llama")
    sae = SAE(SAEConfig(model.d_model, 128, arch="topk", k=4, site="resid_post.1"), seed=2)
    steer = LatentSteering(sae, [5, 9], alpha=[3.0, -2.0])
    v = 3.0 * sae.W_dec[5] - 2.0 * sae.W_dec[9]
    torch.testing.assert_close(steer.vector(), v.detach())
    with hooks(model, steer.hook_fns(model)):
        ours, mask = _logits(model)
    with hooks(model, {"blocks.1.hook_resid_post": lambda x, ctx: x + v.detach()}):
        manual, _ = _logits(model)
    base, _ = _logits(model)
    torch.testing.assert_close(ours, manual, atol=0, rtol=0)
    assert (ours[mask] - base[mask]).abs().max() > 1e-2
    last = LatentSteering(sae, 5, alpha=3.0, positions=[-1])
    with hooks(model, last.hook_fns(model)):
        only_last, _ = _logits(model)
    torch.testing.assert_close(only_last[:, :-1], base[:, :-1], atol=1e-6, rtol=0)  # causal: earlier logits unchanged
    assert (only_last[:, -1] - base[:, -1]).abs().max() > 1e-3


def test_latent_ablation_keeps_the_error_term(tiny_models):
    model = tiny_models("llama")
    d = model.d_model
    sae = SAE(SAEConfig(d, 96, arch="relu", site=SITE), seed=4)
    with torch.no_grad():
        sae.b_enc.fill_(-0.05)
    seen = {}
    with hooks(model, {SITE: lambda x, ctx: seen.setdefault("x", x.detach().clone())}):
        base, mask = _logits(model)
    z = sae.encode(seen["x"]).detach()
    lat = int((z[mask] > 0).float().mean(0).argmax())  # a latent that fires
    expected = seen["x"] - z[..., lat:lat + 1] * sae.W_dec[lat].detach()  # only its contribution removed
    got = {}
    with hooks(model, LatentAblation(sae, lat).hook_fns(model)), \
         hooks(model, {SITE: lambda x, ctx: got.setdefault("x", x.detach().clone())}):
        ablated, _ = _logits(model)
    torch.testing.assert_close(got["x"], expected, atol=1e-6, rtol=0)
    assert (ablated[mask] - base[mask]).abs().max() > 1e-4
    dead = int((z > 0).flatten(0, -2).sum(0).argmin())
    assert float((z[..., dead] > 0).sum()) == 0
    with hooks(model, LatentAblation(sae, dead).hook_fns(model)):
        same, _ = _logits(model)
    torch.testing.assert_close(same, base, atol=0, rtol=0)  # ablating a silent latent changes nothing
    clamp = LatentAblation(sae, lat, value=5.0)
    with hooks(model, clamp.hook_fns(model)), hooks(model, {SITE: lambda x, ctx: got.__setitem__("c", x.detach().clone())}):
        _logits(model)
    on = z[..., lat] > 0
    z_after = sae.encode(got["c"]).detach()
    assert torch.allclose(z_after[..., lat][on & mask], torch.full_like(z_after[..., lat][on & mask], 5.0), atol=0.5)


def test_matched_removal_takes_out_as_much_as_the_ablation_along_other_decoders(tiny_models):
    from sae.edits import MatchedRemoval

    model = tiny_models("llama")
    sae = SAE(SAEConfig(model.d_model, 96, arch="relu", site=SITE), seed=4)
    with torch.no_grad():
        sae.b_enc.fill_(-0.05)
    seen = {}
    with hooks(model, {SITE: lambda x, ctx: seen.setdefault("x", x.detach().clone())}):
        _logits(model)
    x = seen["x"]
    z = sae.encode(x).detach()
    lats, others = [3, 7], [11, 40]
    got = {}
    with hooks(model, MatchedRemoval(sae, lats, others).hook_fns(model)), \
         hooks(model, {SITE: lambda x, ctx: got.setdefault("x", x.detach().clone())}):
        _logits(model)
    removed = x - got["x"]
    cut = (z[..., lats] @ sae.W_dec[lats]).detach()
    alt = (z[..., lats] @ sae.W_dec[others]).detach()
    torch.testing.assert_close(removed.norm(dim=-1), cut.norm(dim=-1), atol=1e-5, rtol=1e-5)  # as much, token by token
    on = cut.norm(dim=-1) > 0
    assert on.any() and not on.all()
    cos = torch.nn.functional.cosine_similarity(removed[on], alt[on], dim=-1)
    torch.testing.assert_close(cos, torch.ones_like(cos), atol=1e-5, rtol=0)  # along the other latents' decoders
    assert float(removed[~on].abs().max()) == 0.0  # nothing where the latents are silent
    with pytest.raises(ValueError, match="one each"):
        MatchedRemoval(sae, lats, [1])


def test_top_contexts_and_html(tiny_models):
    model = tiny_models("llama")
    sae = SAE(SAEConfig(model.d_model, 64, arch="relu", site=SITE), seed=5)
    from sae.runner import site_tokens

    best = (-1.0, None, None)
    for x, b in site_tokens(model, SITE, RAW, batch_size=3):
        with torch.no_grad():
            a = sae.encode(x)[..., 7].masked_fill(~b.attention_mask.bool(), -1)
        for i in range(a.shape[0]):
            if float(a[i].max()) > best[0]:
                best = (float(a[i].max()), b.input_ids[i][int(a[i].argmax())].item(), None)
    ctxs = top_contexts(model, sae, 7, RAW, top=3, batch_size=3)
    assert ctxs and ctxs[0].max_act == pytest.approx(best[0], abs=1e-5)
    assert [c.max_act for c in ctxs] == sorted([c.max_act for c in ctxs], reverse=True)
    assert ctxs[0].tokens[ctxs[0].peak] == model.tokenizer.decode([best[1]])
    html = contexts_html(ctxs, latent=7)
    assert html.count('class="sae-ctx"') == len(ctxs) and "Latent 7" in html
    esc = contexts_html([Context(0, 1, ["<b>", "x"], [1.0, 0.0], 0, 1.0)])
    assert "&lt;b&gt;" in esc and "<b>" not in esc.replace('<div style="font-weight:bold">', "")


@pytest.mark.parametrize("kind", ["steer", "ablate"])
def test_skip_sink_leaves_each_rows_first_real_token(tiny_models, kind):
    """In a left-padded batch under ``steering.apply``, ``skip_sink=True`` edits every real token but each row's
    first one; under bare interp.hooks the same (they record the pass's token state too)."""
    import steering
    from interp.forward import batches, forward, prepare

    model = tiny_models("llama")
    sae = SAE(SAEConfig(model.d_model, 128, arch="relu", site="resid_post.1"), seed=3)
    edit = (LatentSteering(sae, [5, 9], alpha=[3.0, -2.0], sinks="exclude") if kind == "steer" else
            LatentAblation(sae, list(range(64)), sinks="exclude"))
    (batch,) = batches(model, prepare(model, PROMPTS[:3], chat=False)[1], 3)
    seen: list[torch.Tensor] = []

    def run(*edits):
        seen.clear()
        with steering.apply(model, *edits), hooks(model, {"blocks.1.hook_resid_post": lambda x, c: seen.append(x)}):
            forward(model, batch)
        return seen[0]

    base, new = run(), run(edit)
    mask = batch.attention_mask.bool()
    first = mask.long().argmax(1)
    rows = torch.arange(3)
    assert torch.equal(new[rows, first], base[rows, first])
    rest = mask.clone()
    rest[rows, first] = False
    assert (new - base)[rest].abs().amax(-1).min() > 1e-6
    seen.clear()
    with hooks(model, edit.hook_fns(model)), hooks(model, {"blocks.1.hook_resid_post": lambda x, c: seen.append(x)}):
        forward(model, batch)  # bare hooks: the same
    assert torch.equal(seen[0], new)
