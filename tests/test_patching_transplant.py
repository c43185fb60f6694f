"""Component transplant: all layers (+ globals) reproduce the source exactly, none the target; restore on exit
and on error; copies; greedy search over layer blocks; mismatched architectures."""

from __future__ import annotations

import pytest
import torch

from interp.patching import SearchConfig, greedy_transplant
from interp.patching.transplants import check_compatible, transplant, transplanted
from interp.testing.tiny import tiny_model

ALL = ["block", "embed", "final_norm", "unembed"]


def _logits(m, ids):
    with torch.no_grad():
        return m.hf(input_ids=ids).logits


@pytest.mark.parametrize("family,kw", [("llama", {}), ("llama", {"tie_word_embeddings": True}), ("gpt2", {}),
                                       ("gemma2", {}), ("qwen2_moe", {})])
def test_all_layers_reproduce_source_none_reproduce_target(family, kw):
    tgt, src = tiny_model(family, seed=0, **kw), tiny_model(family, seed=1, **kw)
    ids = torch.randint(5, 200, (2, 9), generator=torch.Generator().manual_seed(0))
    lt, ls = _logits(tgt, ids), _logits(src, ids)
    assert (lt - ls).abs().max() > 1e-3
    with transplant(tgt, src, range(tgt.n_layers), ALL) as m:
        assert torch.equal(_logits(m, ids), ls)
    assert torch.equal(_logits(tgt, ids), lt)                # restored
    with transplant(tgt, src, [], ALL[:1]):
        assert torch.equal(_logits(tgt, ids), lt)
    with transplant(tgt, src, [0, 1], ["attn", "mlp"]):
        assert not torch.equal(_logits(tgt, ids), lt)
    copy = transplanted(tgt, src, list(range(tgt.n_layers)), ALL)
    assert torch.equal(_logits(copy, ids), ls) and torch.equal(_logits(tgt, ids), lt)


def test_parts_touch_only_their_weights_and_restore_on_error():
    tgt, src = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    before = {k: v.clone() for k, v in tgt.hf.state_dict().items()}
    with transplant(tgt, src, [1], ["attn"]):
        now = tgt.hf.state_dict()
        changed = {k for k in now if not torch.equal(now[k], before[k])}
    assert changed == {k for k in before if k.startswith("model.layers.1.self_attn.")}
    with pytest.raises(RuntimeError, match="boom"):
        with transplant(tgt, src, [0, 1], ["mlp", "norms"]):
            raise RuntimeError("boom")
    assert all(torch.equal(v, before[k]) for k, v in tgt.hf.state_dict().items())


def test_greedy_search_trajectory():
    tgt, src = tiny_model("llama", seed=0, n_layers=4), tiny_model("llama", seed=1, n_layers=4)
    with torch.no_grad():  # share embeddings and final norm so that all four blocks reproduce the source
        for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
            src.hf.get_parameter(name).copy_(tgt.hf.get_parameter(name))
    ids = torch.randint(5, 200, (3, 8), generator=torch.Generator().manual_seed(0))
    ref, own = _logits(src, ids), _logits(tgt, ids)

    def score(m):
        return -float((_logits(m, ids) - ref).pow(2).mean())

    res = greedy_transplant(tgt, src, score, parts=["block"], block_size=1)
    scores = [res.baseline] + [t["score"] for t in res.trajectory]
    assert all(b > a for a, b in zip(scores, scores[1:], strict=False))
    assert res.source_score == 0.0
    assert len(res.chosen) == 4 and abs(res.best) < 1e-12          # every block taken: the source exactly
    first = res.trajectory[0]
    assert first["score"] == max(first["tried"].values())
    assert res.evaluations == 1 + 4 + 3 + 2 + 1
    glob = greedy_transplant(tgt, src, score, parts=["block", "final_norm"], block_size=2)
    assert ((), "final_norm") not in glob.chosen                  # shared already: transplanting it gains nothing
    assert len(glob.trajectory) == 2 and abs(glob.best) < 1e-12
    pairs = greedy_transplant(tgt, src, score, blocks=[[0, 1], [2, 3]], parts=["attn", "mlp"],
                              config=SearchConfig(max_steps=2))
    assert len(pairs.trajectory) <= 2 and pairs.plot().data[0].mode == "lines+markers"
    assert torch.equal(_logits(tgt, ids), own)                     # the search leaves the target as it was


def test_mismatched_and_bad_input():
    llama, gpt2 = tiny_model("llama"), tiny_model("gpt2")
    with pytest.raises(ValueError, match="architecture"):
        check_compatible(llama, gpt2)
    with pytest.raises(ValueError, match="shape"):
        with transplant(llama, tiny_model("llama", d_model=32), [0]):
            pass
    with pytest.raises(ValueError, match="layers"):
        with transplant(llama, tiny_model("llama", n_layers=3), [0]):
            pass
    with pytest.raises(ValueError, match="out of range"):
        with transplant(llama, tiny_model("llama", seed=1), [5]):
            pass
    with pytest.raises(ValueError, match="unknown part"):
        with transplant(llama, tiny_model("llama", seed=1), [0], ["heads"]):
            pass
    with pytest.raises(ValueError, match="one number"):
        greedy_transplant(llama, tiny_model("llama", seed=1), lambda m: [1.0, 2.0])
