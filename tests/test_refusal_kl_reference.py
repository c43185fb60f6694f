"""The KL filter's reference level: the KL of random unit directions ablated the way the candidates are, on the
same harmless val prompts (``Scores.kl_random``), and the KL / CE of the evaluation's random ablation.

Oracles: plain hooks (``interp.hooks``) that project each random direction out of every writer at every token
(or at the tokens ``Batch.post_mask`` marks), and ``evals.logits.kl_div`` on plain last-token logits."""

from __future__ import annotations

import pytest
import torch

from evals.logits import kl_div
from interp.forward import batches, last_logits, prepare
from interp.hooks import hooks
from interp.models import load_model
from pipelines.refusal import load_refusal_data
from pipelines.refusal.diagnosis import random_kl_text
from pipelines.refusal.estimate import writer_sites
from pipelines.refusal.stages import find_candidates, find_refusal_tokens, score_candidates
from probes.directions import random_directions


def _oracle_kl(m, prompts, r, positions):
    """Mean KL(plain || r projected out of every writer at ``positions``) at the last prompt token."""
    _, encs = prepare(m, prompts)
    (b,) = batches(m, encs, len(encs))
    where = torch.ones_like(b.post_mask) if positions == "all" else b.post_mask
    w = where.to(m.dtype)[..., None]
    plain = last_logits(m, b)
    fns = [(s.name, lambda x, ctx: x - (x @ r)[..., None] * r * w) for s in writer_sites(m)]
    with hooks(m, fns):
        edited = last_logits(m, b)
    return kl_div(plain, edited).mean().item()


@pytest.mark.parametrize("positions", ["all", "post_instruction"])
def test_random_kl_equals_plain_hooks(positions):
    m = load_model("organism")
    data = load_refusal_data(model="organism", n_train=16, n_val=8, n_test=8)
    tok = find_refusal_tokens(m, data, max_new_tokens=6, min_refusals=1)
    cand = find_candidates(m, data, layers=[1])
    none = torch.zeros(1, cand.n_positions, dtype=torch.bool)   # no candidate: only the random reference is scored
    sc = score_candidates(m, data, cand, tok, only=none, ablate_positions=positions, n_random=3, seed=5)
    assert sc.n_scored == 0 and len(sc.kl_random) == 3
    dirs = [d.vectors[0] for d in random_directions(m.d_model, 3, seed=5)]
    want = [_oracle_kl(m, data.harmless["val"].instructions, r, positions) for r in dirs]
    assert sc.kl_random == pytest.approx(want, abs=1e-5)
    assert all(k > 1e-6 for k in sc.kl_random)          # a random ablation is not free on this model
    assert score_candidates(m, data, cand, tok, only=none, n_random=0).kl_random == []


def test_random_kl_text_places_the_threshold():
    assert "median; range 0.02-0.3" in random_kl_text([0.3, 0.02, 0.05, 0.1], 0.1)
    assert "KL 0.075 (median" in random_kl_text([0.3, 0.02, 0.05, 0.1], 0.1)
    assert "lies within" in random_kl_text([0.3, 0.02, 0.05, 0.1], 0.1)
    assert "lies below" in random_kl_text([0.3, 0.02], 0.01)
    assert "lies above" in random_kl_text([0.3, 0.02], 1.0)
    assert random_kl_text([], 0.1) == ""
