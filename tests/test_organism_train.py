"""The organism trainer on the core: training rows from ``interp.forward.prepare``, its ablation as an
intervention equal to ``steering.DirectionalAblation`` (the full retrain is ``python -m interp.organisms.train --check``)."""

from __future__ import annotations

import pytest
import torch

import steering
from interp.hooking import count_hooks, hooks
from interp.models import load_model
from interp.organisms import tokenizer as tk
from interp.organisms.train import ResidualEdit, training_rows


@pytest.fixture(scope="module")
def organism():
    return load_model("organism")


def test_training_rows_right_padded_with_answer_loss(organism):
    tok = organism.tokenizer
    pairs = [("how do i bake bread", "mix the flour"), ("help", "sure")]
    rows = training_rows(organism, pairs, prompt_loss=False)
    for i, (q, a) in enumerate(pairs):
        prompt = tok(tk.render(q), add_special_tokens=False)["input_ids"]
        answer = tok(f"{a} {tk.EOS}", add_special_tokens=False)["input_ids"]
        n = len(prompt) + len(answer)
        assert rows.ids[i, :n].tolist() == prompt + answer
        assert (rows.ids[i, n:] == tok.pad_token_id).all() and int(rows.last[i]) == len(prompt) - 1
        assert rows.mask[i].tolist() == [0.0] * len(prompt) + [1.0] * len(answer) + [0.0] * (rows.ids.shape[1] - n)
    with_prompt = training_rows(organism, pairs[:1], prompt_loss=True)
    assert with_prompt.mask[0, 0] == 0 and with_prompt.mask[0, 1:].all()


def test_residual_edit_equals_directional_ablation(organism):
    ids = torch.randint(7, 200, (4, 12), generator=torch.Generator().manual_seed(0))
    r = torch.randn(organism.d_model, generator=torch.Generator().manual_seed(1))
    edit = ResidualEdit(ablate=r / r.norm(), record_layer=2)
    with torch.no_grad():
        with hooks(organism, edit.hook_fns(organism)):
            ours = organism.hf(input_ids=ids).logits
        with steering.apply(organism, steering.DirectionalAblation(r)):
            theirs = organism.hf(input_ids=ids).logits
        plain = organism.hf(input_ids=ids).logits
    # logits reach ~17.5, where one float32 ulp is 1.9e-6: 1e-6 was below the arithmetic's resolution (the two
    # edits' op orders differ by 5.7e-6 under transformers 5.24); a wrong edit differs by > 1e-3 (below)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    assert (ours - plain).abs().max() > 1e-3
    assert edit.seen["x"].shape == (4, 12, organism.d_model)
    assert torch.allclose(edit.seen["x"] @ (r / r.norm()), torch.zeros(4, 12), atol=1e-5)
    assert count_hooks(organism.hf) == 0
