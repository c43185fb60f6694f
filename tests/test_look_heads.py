"""Head scores: repeated random tokens, scores equal a hand computation from the attention pattern."""

from __future__ import annotations

import pytest
import torch

import interp
from interp.look import heads as Hd
from interp.testing.tiny import tiny_model


def _eager_patterns(m, tokens):
    """The attention patterns from HF's eager attention, computed here independently: ``[n, L, H, T, T]``."""
    cfg = m.hf.config
    old = cfg._attn_implementation
    try:
        cfg._attn_implementation = "eager"
        with torch.no_grad():
            out = m.hf(input_ids=tokens.to(m.device), output_attentions=True)
    finally:
        cfg._attn_implementation = old
    return torch.stack([a.float().cpu() for a in out.attentions], 1)


def test_repeated_tokens_are_bos_then_r_twice():
    m = tiny_model("llama")
    t = Hd.repeated_tokens(m, n_tokens=5, n_prompts=3, seed=1)
    assert t.shape == (3, 11)
    assert (t[:, 0] == m.tokenizer.bos_token_id).all()
    assert torch.equal(t[:, 1:6], t[:, 6:11])
    assert not set(t[:, 1:].flatten().tolist()) & set(m.tokenizer.all_special_ids)
    assert torch.equal(t, Hd.repeated_tokens(m, n_tokens=5, n_prompts=3, seed=1))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_scores_match_a_hand_computation(family):
    m = tiny_model(family)
    t_n = 6
    s = Hd.head_scores(m, n_tokens=t_n, n_prompts=4, seed=3)
    tokens = Hd.repeated_tokens(m, n_tokens=t_n, n_prompts=4, seed=3)
    p = _eager_patterns(m, tokens)                                     # [n, L, H, T, T]
    n, L, H, T, _ = p.shape
    want = {k: torch.zeros(L, H) for k in ("induction", "previous_token", "duplicate_token", "entropy", "bos")}
    for la in range(L):
        for h in range(H):
            ind, dup, prev, ent, bos = [], [], [], [], []
            for r in range(n):
                for q in range(1, T):
                    row = p[r, la, h, q]
                    prev.append(row[q - 1])
                    bos.append(row[0])
                    ent.append(-(row[: q + 1] * row[: q + 1].clamp_min(1e-30).log()).sum())
                    if q > t_n:                                         # a second-copy token
                        ind.append(row[q - t_n + 1])
                        dup.append(row[q - t_n])
            for k, v in zip(want, (ind, prev, dup, ent, bos), strict=True):
                want[k][la, h] = torch.stack(v).mean()
    for k, v in want.items():
        torch.testing.assert_close(getattr(s, k), v, atol=1e-5, rtol=1e-4)
    df = s.to_frame()
    assert len(df) == L * H and set(df.columns) >= {"layer", "head", *want}
    top = s.top("induction", 2)
    flat = want["induction"].flatten()
    best = int(flat.argmax())
    assert top[0][:2] == (best // H, best % H) and abs(top[0][2] - float(flat[best])) < 1e-5
    fig = s.plot()
    assert [a.text for a in fig.layout.annotations][:5] == list(Hd.SCORES)
    torch.testing.assert_close(torch.tensor(fig.data[0].z, dtype=torch.float32), s.induction, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="score must be one of"):
        s.top("inductive", 2)


def test_bad_sizes_are_refused():
    m = tiny_model("llama")
    with pytest.raises(ValueError, match="n_tokens"):
        Hd.head_scores(m, n_tokens=1, n_prompts=2)
    with pytest.raises(ValueError, match="max_position"):
        Hd.head_scores(m, n_tokens=500, n_prompts=2)


def test_pattern_figure_labels_tokens():
    m = tiny_model("llama")
    fig = Hd.pattern_figure(m, "the cat was on the mat", layer=1, heads=[0, 2])
    assert [a.text for a in fig.layout.annotations] == ["L1H0", "L1H2"]
    toks = m.tokenizer.convert_ids_to_tokens(m.tokenizer.encode("the cat was on the mat"))
    assert list(fig.data[0].x) == [f"{i}:{t}" for i, t in enumerate(toks)]
    z = torch.tensor(fig.data[1].z)
    torch.testing.assert_close(z.sum(-1), torch.ones(len(toks), dtype=z.dtype), atol=1e-5, rtol=0)
    assert (z.triu(1) == 0).all()                                      # causal


def test_save_and_load(tmp_path):
    m = tiny_model("llama")
    s = Hd.head_scores(m, n_tokens=4, n_prompts=2)
    s.save(tmp_path / "hs")
    back = interp.bundle.load(tmp_path / "hs")
    torch.testing.assert_close(back.induction, s.induction)


def test_ablation_check_draws_layer_matched_heads_and_measures_the_loss():
    from interp.patching.edits import HeadAblation
    from interp.patching.induction import ablation_check, second_copy_loss

    m = tiny_model("llama")
    r = ablation_check(m, k=2, n_draws=3, n_tokens=6, n_prompts=8, seed=0)
    chosen = [tuple(u) for u in r.heads]
    for d in r.random_heads:
        assert sorted(u[0] for u in d) == sorted(u[0] for u in chosen) and not {tuple(u) for u in d} & set(chosen)
    tokens = Hd.repeated_tokens(m, 6, 8, seed=1)
    torch.testing.assert_close(r.ablated, second_copy_loss(m, tokens, 6, HeadAblation(chosen)))
    assert not torch.allclose(r.ablated, r.clean)
    s = r.summary()
    assert abs(s["rise_induction"] - float((r.ablated - r.clean).mean())) < 1e-6 and s["n_draws"] == 3
    assert len(r.to_frame()) == 8 * 5


@pytest.mark.slow
def test_smollm2_induction_heads_matter_more_than_random_heads():
    from interp.patching.induction import ablation_check

    m = interp.load_model("smollm2-135m-instruct", dtype=torch.float32)
    s = ablation_check(m, k=5, n_draws=5, n_tokens=30, n_prompts=16, seed=0).summary()
    assert s["rise_induction"] > 2 * s["rise_random"] and s["ci95"][0] > 0, s
