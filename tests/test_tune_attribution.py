"""Token attribution through an adapter on tiny random models: equal to plain per-example HF forwards, the same
through one peft model, two models or an adapter folder; concentration, classes and enrichment on hand examples;
masks for loss masking; bad input."""

from __future__ import annotations

import pytest
import torch

from interp.testing.tiny import tiny_model
from interp.tune import TuneConfig, fine_tune, stats, token_attribution, top_mask
from interp.tune import classes as C
from interp.tune.masks import random_mask

P = ["how do you make water", "tell me a word", "what is the day"]
R = ["i can not do that .", "the word is good", "the day is long and great for you <|end|>"]


@pytest.fixture(scope="module")
def adapted():
    """A tiny llama with a LoRA adapter trained a few steps (so the adapter changes every token's log-prob)."""
    res = fine_tune(tiny_model("llama"), P, R, TuneConfig(steps=6, batch_size=2, lr=3e-2), progress=False)
    return res.model


def plain_gain(adapted, base_hf, prompt: str, response: str) -> torch.Tensor:
    """log p_adapted - log p_base of each response token: one unpadded sequence, plain HF forwards."""
    tok = adapted.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    pid = tok(text, add_special_tokens=False)["input_ids"]
    ids = pid + tok(response, add_special_tokens=False)["input_ids"]
    x = torch.tensor([ids])
    out = []
    for hf in (adapted.hf, base_hf):
        with torch.no_grad():
            lp = torch.log_softmax(hf(input_ids=x).logits[0].float(), -1)
        out.append(torch.stack([lp[t - 1, ids[t]] for t in range(len(pid), len(ids))]))
    return out[0] - out[1]


def test_equals_plain_forwards_one_example_at_a_time(adapted):
    a = token_attribution(None, adapted, P, R, batch_size=2)  # padded batches, base = adapter disabled
    base = tiny_model("llama")  # the same seeded weights, untouched by peft
    for i, (p, r) in enumerate(zip(P, R)):
        ref = plain_gain(adapted, base.hf, p, r)
        assert torch.allclose(a.gain[a.of(i)], ref, atol=1e-5)
        assert a.index[a.of(i)].tolist() == list(range(len(ref)))
    assert a.gain.abs().max() > 1e-2, "the adapter changes the log-probs (the test can fail)"
    assert a.special[a.of(2)].tolist()[-1] and a.tokens[-1] == "<|end|>"
    two = token_attribution(base, adapted, P, R, batch_size=16)  # two models in memory
    assert torch.allclose(two.gain, a.gain, atol=1e-5) and torch.equal(two.position, a.position)


def test_an_adapter_folder_on_its_base(adapted, tmp_path):
    adapted.hf.save_pretrained(str(tmp_path / "ad"))
    base = tiny_model("llama")
    a = token_attribution(base, tmp_path / "ad", P, R)
    assert torch.allclose(a.gain, token_attribution(None, adapted, P, R).gain, atol=1e-5)
    assert not any("lora" in n for n, _ in base.hf.named_modules()), "the adapter is taken out again"
    with pytest.raises(ValueError, match="another base"):
        token_attribution(tiny_model("llama", d_model=32), tmp_path / "ad", P, R)


def test_bad_input(adapted):
    with pytest.raises(ValueError, match="not an adaptation of this base"):
        token_attribution(tiny_model("llama", n_layers=3), adapted, P, R)
    with pytest.raises(ValueError, match="2 responses for 3 prompts"):
        token_attribution(None, adapted, P, R[:2])
    with pytest.raises(ValueError, match="peft-wrapped"):
        token_attribution(None, tiny_model("llama"), P, R)
    a = token_attribution(None, adapted, P, R)
    with pytest.raises(ValueError, match="q must be a fraction"):
        top_mask(a, 0.0)
    with pytest.raises(ValueError, match="2 masks for 3 examples"):
        random_mask(a, top_mask(a, 0.2)[:2])


def test_concentration_on_hand_examples():
    assert stats.gini(torch.tensor([0.0, 0, 0, 1])) == pytest.approx(0.75)
    assert stats.gini(torch.tensor([1.0, 1, 1, 1])) == pytest.approx(0.0)
    assert stats.gini(torch.tensor([1.0, 2, 3, 4])) == pytest.approx(20 / 80)  # sum|xi - xj| / (2 n^2 mean)
    assert stats.gini(torch.tensor([-1.0, 0, 2, 2])) == pytest.approx(16 / 32), "negatives count as no gain"
    g = torch.tensor([1.0] * 18 + [10.0, 5.0] + [-3.0] * 10)  # 30 tokens, positive total 33
    c = stats.concentration(g)
    assert c["top_1%"] == pytest.approx(10 / 33) and c["top_5%"] == pytest.approx(15 / 33)  # ceil: 1 and 2 tokens
    assert c["top_10%"] == pytest.approx(16 / 33) and c["n_tokens"] == 30 and c["positive_gain"] == 33


def test_words_and_classes_of_a_refusal():
    texts = ["I", "'m", " sorry", ",", " but", " the", " recipe", " can", "'t", "<|im_end|>"]
    special = [False] * 9 + [True]
    words = C.words_of(texts, special)
    assert words == ["i'm", "i'm", "sorry", "", "but", "the", "recipe", "can't", "can't", ""]
    assert C.classify(texts, words, special) == ["stopword", "stopword", "refusal", "punctuation", "stopword",
                                                 "stopword", "content", "refusal", "refusal", "special"]
    assert {"sorry", "cannot", "can't", "unable", "decline"} <= C.REFUSAL_WORDS and "i" not in C.REFUSAL_WORDS


def test_enrichment_is_controlled_for_frequency():
    """Members hold the top gains but only because they sit in the high-gain frequency bin with everyone else
    there: Fisher's test calls them enriched, the within-bin permutation test does not."""
    gen = torch.Generator().manual_seed(0)
    bins = torch.tensor([1] * 40 + [0] * 160)
    gain = torch.where(bins == 1, 5.0, 0.0) + torch.rand(200, generator=gen)
    member = torch.zeros(200, dtype=torch.bool)
    member[:20] = True  # half of the high bin
    e = stats.enrichment(gain, member, q=0.1, bins=bins, n_perm=500)
    assert e["ratio"] > 3 and e["fisher_p"] < 1e-3 and e["perm_p"] > 0.05
    gain[:20] += 1.0  # now the members gain more than their bin-mates
    e = stats.enrichment(gain, member, q=0.1, bins=bins, n_perm=500)
    assert e["in_top"] == 20 and e["perm_p"] < 0.01


def test_summaries_frame_and_figures(adapted):
    a = token_attribution(None, adapted, P, R)
    frame = a.to_frame()
    assert len(frame) == a.gain.numel() and {"example", "position", "token", "word", "class", "gain"} <= set(frame)
    assert frame["gain"].tolist() == pytest.approx((frame["logp_adapted"] - frame["logp_base"]).tolist(), abs=1e-6)
    assert a.words[:3] == ["i", "can", ""] and a.classes[:2] == ["stopword", "stopword"]
    by = {r["class"]: r for r in a.by_class()}
    assert sum(r["n"] for r in by.values()) == a.gain.numel() and "special" in by
    assert sum(r["count"] for r in a.by_word(top=None)) == sum(1 for w in a.words if w)
    assert {r["class"] for r in a.enrichment(q=0.2, n_perm=50)} == set(by)
    html = a.heat_text([0, 1])
    assert html.count('class="heat-line"') == 2 and html.count("<span style") == int((a.example < 2).sum()) + 2
    page = a.plot()
    assert "<html>" in page and "Concentration" in page and page.count('class="heat-line"') == 3


def test_masks_for_loss_masking(adapted):
    a = token_attribution(None, adapted, P, R)
    top = top_mask(a, 0.25)
    n = a.gain.numel()
    assert sum(int(m.sum()) for m in top) == -(-n // 4)
    flat = torch.cat(top)
    assert float(a.gain[flat].min()) >= float(a.gain[~flat].max()), "the top tokens by gain"
    rnd = random_mask(a, top, seed=1)
    assert [int(m.sum()) for m in rnd] == [int(m.sum()) for m in top] and not all(
        torch.equal(x, y) for x, y in zip(rnd, top))
    res = fine_tune(tiny_model("llama"), P, R, TuneConfig(steps=2, batch_size=2), mask_out=top, progress=False)
    assert len(res.losses) == 2
