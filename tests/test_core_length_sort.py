"""Batches sorted by length: less padding, the same activations (1e-5) in the caller's order, in memory and in a
store (which records its row order and refuses to resume an unsorted run)."""

from __future__ import annotations

import pytest
import torch

import interp
from interp.forward import batches, length_order, prepare
from tests.conftest import mixed_prompts


def _padding(bs) -> float:
    slots = sum(b.input_ids.numel() for b in bs)
    return 1 - sum(int(b.attention_mask.sum()) for b in bs) / slots


def test_length_order_is_stable_longest_first_and_cuts_padding(tiny_models):
    m = tiny_models("llama")
    _, encs = prepare(m, mixed_prompts(40, seed=1), chat=False)
    order = length_order(encs)
    lengths = [len(encs[i].ids) for i in order]
    assert sorted(order) == list(range(40)) and lengths == sorted(lengths, reverse=True)
    ties = [i for i in order if len(encs[i].ids) == lengths[0]]
    assert ties == sorted(ties)  # equal lengths keep the caller's order
    before, after = _padding(batches(m, encs, 8)), _padding(batches(m, [encs[i] for i in order], 8))
    assert before > 0.4 and after < before / 2  # measured: 0.46 -> 0.17


@pytest.mark.parametrize("positions", ["all", "last", "prompt_mean"])
def test_sorted_capture_equals_unsorted_in_the_callers_order(tiny_models, positions):
    m = tiny_models("llama")
    ps = mixed_prompts(13, seed=4)
    labels = list(range(13))
    a = interp.capture(m, interp.Prompts(ps, labels=labels), positions=positions,
                       runtime=interp.Runtime(batch_size=4, progress=False))
    b = interp.capture(m, interp.Prompts(ps, labels=labels), positions=positions,
                       runtime=interp.Runtime(batch_size=4, progress=False, sort_by_length=True))
    torch.testing.assert_close(b.tensor, a.tensor, rtol=0, atol=1e-5)
    assert b.prompt_ids == a.prompt_ids and b.labels == labels
    assert (a.mask is None and b.mask is None) or torch.equal(a.mask, b.mask)


def test_sorted_store_records_its_order_and_refuses_an_unsorted_resume(tiny_models, tmp_path):
    m = tiny_models("llama")
    ps = mixed_prompts(10, seed=6)
    ref = interp.capture(m, interp.Prompts(ps, labels=list(range(10))), positions="all",
                         runtime=interp.Runtime(batch_size=3, progress=False))
    st = interp.capture(m, interp.Prompts(ps, labels=list(range(10))), positions="all", out=tmp_path / "s",
                        runtime=interp.Runtime(batch_size=3, progress=False, sort_by_length=True))
    _, encs = prepare(m, ps)
    assert st.order == length_order(encs) != list(range(10))
    assert st.shard(0).labels == st.order[:3] and st.shard(0).prompt_ids == [ref.prompt_ids[i] for i in st.order[:3]]
    got = st.load()
    torch.testing.assert_close(got.tensor, ref.tensor, rtol=0, atol=1e-5)
    assert got.prompt_ids == ref.prompt_ids and got.labels == list(range(10))
    (tmp_path / "s" / "store.json").write_text((tmp_path / "s" / "store.json").read_text()
                                               .replace('"complete": true', '"complete": false'))
    with pytest.raises(FileExistsError, match="differs in: order"):
        interp.capture(m, interp.Prompts(ps, labels=list(range(10))), positions="all",
                       out=tmp_path / "s", runtime=interp.Runtime(batch_size=3, progress=False))


def test_token_ids_capture_as_given(tiny_models, tmp_path):
    """Pretokenised rows (SAE data) capture as they are, every token real: equal to HF's hidden states."""
    m = tiny_models("llama")
    ids = torch.randint(7, 250, (5, 9), generator=torch.Generator().manual_seed(0))
    a = interp.capture(m, ids, sites="resid_post.0", positions="all", runtime=interp.Runtime(progress=False))
    with torch.no_grad():
        hs = m.hf(ids, output_hidden_states=True).hidden_states[1]
    torch.testing.assert_close(a.tensor[:, 0], hs, rtol=0, atol=1e-5)
    st = interp.capture(m, [r.tolist() for r in ids], sites="resid_post.0", positions="all",
                        out=tmp_path / "s", runtime=interp.Runtime(progress=False))
    assert torch.equal(st.load().tensor, a.tensor) and st.load().prompt_ids == a.prompt_ids
    with pytest.raises(TypeError, match="prompts must be strings"):  # responses, chat: only for texts
        interp.Prompts(ids, responses=["x"] * 5)
