"""The KL filter's reference level: the KL of random unit directions ablated the way the candidates are, on the
same harmless val prompts (``Scores.kl_random``), and the KL / CE of the evaluation's random ablation.

Oracles: plain hooks (``interp.hooks``) that project each random direction out of every writer at every token
(or at the tokens ``Batch.post_mask`` marks), and ``evals.logits.kl_div`` on plain last-token logits."""

from __future__ import annotations

import pytest
import torch

from interp.evals.logits import kl_div
from interp.forward import batches, last_logits, prepare
from interp.hooking import hooks
from interp.models import load_model
from interp.studies.kit.config import DataConfig, SelectionConfig
from interp.studies.kit.stages import find_candidates, find_refusal_tokens, score_candidates
from interp.studies.refusal import load_refusal_data
from interp.studies.refusal.diagnosis import random_kl_text
from interp.studies.refusal.estimate import writer_sites
from interp.values import Runtime
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
    data = load_refusal_data("organism", DataConfig(n_train=16, n_val=8, n_test=8))
    tok = find_refusal_tokens(m, data, max_new_tokens=6, min_refusals=1)
    cand = find_candidates(m, data, layers=[1])
    none = torch.zeros(1, cand.n_positions, dtype=torch.bool)   # no candidate: only the random reference is scored
    sc = score_candidates(m, data, cand, tok, only=none, config=SelectionConfig(ablate_positions=positions, n_random=3),
                          runtime=Runtime(batch_size=64, seed=5))
    assert sc.n_scored == 0 and len(sc.kl_random) == 3
    dirs = [d.vectors[0] for d in random_directions(m.d_model, 3, seed=5)]
    want = [_oracle_kl(m, data.harmless["val"].instructions, r, positions) for r in dirs]
    assert sc.kl_random == pytest.approx(want, abs=1e-5)
    assert all(k > 1e-6 for k in sc.kl_random)          # a random ablation is not free on this model
    assert score_candidates(m, data, cand, tok, only=none, config=SelectionConfig(n_random=0)).kl_random == []


def test_random_kl_text_places_the_threshold():
    assert "median; range 0.02-0.3" in random_kl_text([0.3, 0.02, 0.05, 0.1], 0.1)
    assert "KL 0.075 (median" in random_kl_text([0.3, 0.02, 0.05, 0.1], 0.1)
    assert "lies within" in random_kl_text([0.3, 0.02, 0.05, 0.1], 0.1)
    assert "lies below" in random_kl_text([0.3, 0.02], 0.01)
    assert "lies above" in random_kl_text([0.3, 0.02], 1.0)
    assert random_kl_text([], 0.1) == ""


def test_kl_reference_random_raises_the_cut_to_the_costliest_random_ablation():
    from interp.studies.kit.stages import Candidates, Scores, kl_cutoff, select_direction
    from interp.studies.refusal import SelectionConfig

    kl = torch.tensor([[0.05, 0.2, 0.3]])
    sc = Scores(bypass=torch.tensor([[0.0, -2.0, -3.0]]), induce=torch.ones(1, 3), kl=kl, baseline_harmful=1.0,
                baseline_harmless=-5.0, kl_random=[0.1, 0.25, 0.02, 0.05])
    cand = Candidates(torch.ones(1, 3, 4), torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 3, 4), [1], ["s"], ["a", "b", "c"],
                      [], "h")
    paper = select_direction(10, cand, sc, SelectionConfig())
    assert paper.found and paper.position_index == 0 and paper.filters["kl_threshold"] == 0.1
    calibrated = select_direction(10, cand, sc, SelectionConfig(kl_reference="random"))
    assert calibrated.filters["kl_threshold"] == 0.25 and calibrated.filters["kl_reference"] == "random"
    assert calibrated.position_index == 1 and calibrated.passing["kl"] == 2          # 0.3 still costs more
    assert kl_cutoff(SelectionConfig(kl_threshold=0.5, kl_reference="random"), sc) == 0.5  # never below the set one
    with pytest.raises(ValueError, match="kl_reference must be one of"):
        SelectionConfig(kl_reference="relative")
    sc.kl_random = []
    with pytest.raises(ValueError, match="needs the KL of random directions"):
        kl_cutoff(SelectionConfig(kl_reference="random"), sc)


def test_kl_reference_random_end_to_end_reselects_only_and_says_so(tmp_path):
    """A null every-token run (KL < 1e-9: nothing passes) re-selected with the random reference on the same
    folder: only selection (and what it feeds) re-runs, the cut is the costliest random ablation, and the notes,
    metrics and CLI flag say the filter was relaxed."""
    import argparse

    from interp.cli.refusal_job import add_refusal_parser
    from interp.studies.refusal import RefusalConfig, run_refusal

    small = dict(model="organism", n_test=16, subspace_rank=1, max_new_tokens=8, ablate_positions="all",
                 kl_threshold=1e-9, induce_threshold=float("-inf"))
    null = run_refusal(RefusalConfig.from_flat(**small), tmp_path / "run")
    assert not null.found
    res = run_refusal(RefusalConfig.from_flat(kl_reference="random", **small), tmp_path / "run")
    assert res.computed[0] == "selection" and "scores" not in res.computed
    sel = res.metrics["selection"]
    assert sel["filters"]["kl_threshold"] == pytest.approx(max(sel["kl_random"])) and sel["filters"]["kl_reference"] == "random"
    assert res.found and sel["kl"] < sel["filters"]["kl_threshold"]
    assert any("calibrated by random directions" in n for n in res.metrics["notes"])
    ap = argparse.ArgumentParser()
    add_refusal_parser(ap.add_subparsers(), lambda p, default="organism": p.add_argument("--model", default=default))
    assert ap.parse_args(["refusal", "--kl-reference", "random"]).kl_reference == "random"
    with pytest.raises(SystemExit):
        ap.parse_args(["refusal", "--kl-reference", "median"])


def test_with_the_random_reference_the_estimated_kl_does_not_rank():
    """The random cut is known only after exact scoring: the estimate search then ranks by induce and bypass."""
    from interp.studies.kit.stages import Candidates
    from interp.studies.refusal import SelectionConfig
    from interp.studies.refusal.estimate import Estimate, top_candidates

    est = Estimate(bypass=torch.tensor([[0.5, -3.0, -1.0]]), induce=torch.tensor([[1.0, 1.0, -1.0]]),
                   kl=torch.tensor([[0.01, 0.4, 0.01]]), baseline_harmful=1.0, baseline_harmless=-5.0, forwards=1,
                   backwards=1)
    cand = Candidates(torch.ones(1, 3, 4), torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 3, 4), [1], ["s"], ["a", "b", "c"],
                      [], "h")
    first = top_candidates(est, cand, 10, SelectionConfig(), 1)
    assert first[0].tolist() == [True, False, False]                       # the paper's cut: estimated KL first
    first = top_candidates(est, cand, 10, SelectionConfig(kl_reference="random"), 1)
    assert first[0].tolist() == [False, True, False]                       # induce, then the lowest bypass
