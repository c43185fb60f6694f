"""Several conditions in one batch (``steering.RowGroups``, ``GenerationSession.generate_each``).

Each block of rows of a stacked batch runs its own interventions; every block must equal the same condition run
alone, through a forward and through cached generation (post-instruction positions, generated-token scope,
additions at one layer, subspace ablations, plain blocks), with and without the reused prompt prefix."""

from __future__ import annotations

import pytest
import torch

import interp
import steering
from interp.forward import batches, prepare
from interp.studies.kit.scoring import ablation
from interp.testing.tiny import tiny_model
from steering.prefill import leaves_prompt_prefix
from tests.conftest import PREFIX_PROMPTS as PROMPTS
from tests.conftest import chat_case


def _conditions(m):
    g = torch.Generator().manual_seed(4)
    r = torch.nn.functional.normalize(torch.randn(m.d_model, generator=g), dim=0)
    basis = torch.linalg.qr(torch.randn(m.d_model, 2, generator=g)).Q.T
    return [(), (ablation(r, "post_instruction"),), (steering.AddVector(6 * r, layers=1),),
            (steering.AddVector(4 * r, layers=0, scope="generated"), ablation(basis[1], "all")),
            (steering.AblateSubspace(basis, sites=("resid_pre", "attn_out", "mlp_out"), positions="post_instruction"),)]


def test_each_block_of_a_forward_equals_its_condition_alone():
    m = tiny_model("llama")
    _, encs = prepare(m, PROMPTS)
    conds = _conditions(m)
    (b,) = batches(m, encs, len(encs))
    (wide,) = batches(m, encs * len(conds), len(encs) * len(conds))
    with torch.no_grad(), steering.apply(m, steering.RowGroups(conds)) as h:
        h.set_batch(wide)
        got = m.hf(**wide.model_inputs).logits
    n = len(encs)
    for i, c in enumerate(conds):
        with torch.no_grad(), steering.apply(m, *c) as h:
            h.set_batch(b)
            want = m.hf(**b.model_inputs).logits
        torch.testing.assert_close(got[i * n:(i + 1) * n], want, atol=1e-5, rtol=0)
    # the conditions differ, so the blocks compare edited runs, not copies of one
    assert (got[n:2 * n] - got[:n]).abs().max() > 1e-3 and (got[2 * n:3 * n] - got[:n]).abs().max() > 1e-3


@pytest.mark.parametrize("model", ["llama", "organism"])
def test_generate_each_equals_generating_each_condition(model):
    m, prompts = chat_case(model)
    conds = _conditions(m)
    run = interp.Runtime(batch_size=3, progress=False)
    session = steering.GenerationSession(m, prompts, run, first_logits=True)
    alone = steering.GenerationSession(m, prompts, run, first_logits=True, reuse=False)
    got = session.generate_each(conds, stack=2, max_new_tokens=8)
    assert len(got) == len(conds)
    for c, g in zip(conds, got):
        want = alone.generate(*c, max_new_tokens=8)
        assert g.token_ids == want.token_ids and g.texts == want.texts and g.prompts == prompts
        torch.testing.assert_close(g.first_logits, want.first_logits, atol=1e-4, rtol=0)
    # which conditions reused the prefix: those that leave the earlier prompt columns as they are
    assert [leaves_prompt_prefix(m, c) for c in conds] == [True, True, False, False, True]
    assert session.plain_passes == 1                  # one plain pass: the prefix and the states below layer 1
    # a stack of 4 conditions is one generation of 4 x the rows per batch
    seen: list[int] = []
    handle = m.hf.register_forward_pre_hook(lambda mod, args, kw: seen.append(kw["input_ids"].shape[0]),
                                            with_kwargs=True)
    try:
        session.generate_each([conds[0], conds[1], conds[4], conds[1]], stack=4, max_new_tokens=8)
    finally:
        handle.remove()
    assert set(seen) == {12, 8}                                   # batches of 3 and 2 prompts, 4 conditions each
    # the prompts formatted as generate formats them (here without the chat template)
    raw = steering.GenerationSession(m, interp.Prompts(prompts, chat=False), run).generate_each(
        conds[:2], stack=2, max_new_tokens=4)
    assert [g.texts for g in raw] == [steering.generate(m, interp.Prompts(prompts, chat=False), *c, max_new_tokens=4,
                                                        runtime=run).texts for c in conds[:2]]
    assert raw[0].formatted == prompts


def test_row_groups_refuse_what_cannot_be_split_by_rows():
    m = tiny_model("llama")
    _, encs = prepare(m, PROMPTS)
    r = torch.nn.functional.normalize(torch.ones(m.d_model), dim=0)
    with pytest.raises(ValueError, match="cannot split RowEdits"):
        steering.RowGroups([(), (steering.RowEdits(ablate=r[None]),)])
    with pytest.raises(ValueError, match="at least one group"):
        steering.RowGroups([])
    (b,) = batches(m, encs, len(encs))
    with pytest.raises(ValueError, match="not a multiple"), torch.no_grad(), \
            steering.apply(m, steering.RowGroups([(), (ablation(r, "all"),)])):
        m.hf(**b.model_inputs)                                    # 5 rows for 2 groups
    with pytest.raises(ValueError, match="greedy decoding"):
        steering.GenerationSession(m, PROMPTS).generate_each([()], sampling=steering.Sampling(do_sample=True))
    with pytest.raises(ValueError, match="stack must be"):
        steering.GenerationSession(m, PROMPTS).generate_each([()], stack=0)
