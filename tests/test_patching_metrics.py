"""Patching metrics are the evals functions reduced by mean; refusal openings come from the judge's list."""

import inspect

import pytest
import torch
from transformers import AutoTokenizer

from interp import evals
from interp.evals.judge import REFUSAL_PHRASES, refusal_openings
from interp.patching import logit_diff, refusal_score
from interp.patching.measures import kl_div, refusal_token_ids, token_logprob

from .conftest import REPO

ORGANISM = REPO / "interp" / "embedded" / "organism"


def test_metrics_equal_evals_reduced_by_mean():
    g = torch.Generator().manual_seed(0)
    logits, ref = torch.randn(5, 40, generator=g), torch.randn(5, 40, generator=g)
    ids = torch.tensor([3, 1, 4, 1, 5])
    torch.testing.assert_close(logit_diff(ids, 7)(logits), evals.logit_diff(logits, ids, 7).mean())
    torch.testing.assert_close(kl_div(ref)(logits), evals.kl_div(ref, logits).mean())
    torch.testing.assert_close(refusal_score([2, 9])(logits), evals.refusal_score(logits, [2, 9]).mean())
    torch.testing.assert_close(token_logprob(ids)(logits), evals.token_logprob(logits, ids).mean())
    assert kl_div(logits)(logits).abs() < 1e-6
    for f in (logit_diff, kl_div, refusal_score, token_logprob):  # public names, docs and signatures kept
        assert f.__doc__ and "evals" in f.__doc__ and "logits" not in str(inspect.signature(f))


def test_refusal_score_matches_the_old_clamped_formula():
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(1))
    lp = torch.log_softmax(logits, -1)
    inside = torch.logsumexp(lp[:, [0, 5]], -1)
    old = (inside - torch.log1p(-inside.exp().clamp(max=1 - 1e-6))).mean()
    torch.testing.assert_close(refusal_score([0, 5])(logits), old, atol=1e-5, rtol=0)


def test_metric_errors():
    with pytest.raises(ValueError, match="at least one token id"):
        refusal_score([])
    with pytest.raises(ValueError, match="reference logits have shape"):
        kl_div(torch.zeros(2, 5))(torch.zeros(3, 5))
    assert logit_diff(1, 2).__name__ == "logit_diff" and logit_diff(1, 2)(torch.zeros(2, 3)).dim() == 0


def test_refusal_openings_come_from_the_judges_list():
    opens = refusal_openings()
    assert opens and all(o.lower() in REFUSAL_PHRASES for o in opens)
    assert {"I'm sorry", "I cannot", "Sorry, but", "As an ai"} <= set(opens)
    assert not any(o.lower().startswith(("cannot", "unable", "it ", "my ")) for o in opens)
    assert all(o[0].isupper() for o in opens)


@pytest.mark.skipif(not (ORGANISM / "config.json").exists(), reason="organism checkpoint not committed")
def test_refusal_ids_on_the_organism_are_unchanged():
    tok = AutoTokenizer.from_pretrained(ORGANISM)
    ids = refusal_token_ids(tok)
    assert sorted(ids) == [218, 219, 421], [tok.decode([i]) for i in ids]  # "i", "i'm", "sorry" as before
    assert refusal_token_ids(tok, ["Sorry"]) == [421]
