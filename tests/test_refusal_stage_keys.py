"""The refusal job's stage cache is keyed on the model's weights, not its name: a name reused for other weights
recomputes every stage (and needs --overwrite to replace the folder); the weight fingerprint is exact and cheap."""

from __future__ import annotations

import json

import pytest
import torch

import interp
from interp.fingerprint import weights_hash
from interp.studies.refusal import RefusalConfig, run_refusal
from interp.testing.tiny import tiny_model

# small enough for a test; the toy organism refuses, so every stage runs
SMALL = dict(model="organism", n_train=16, n_val=8, n_test=8, max_new_tokens=4, subspace_rank=2, min_refusals=4,
             batch_size=16)


def test_weights_hash_tells_seeds_and_one_edited_value_apart():
    a, b = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    assert weights_hash(a) != weights_hash(b)
    assert weights_hash(a) == weights_hash(tiny_model("llama", seed=0))
    h = weights_hash(a)
    w = a.hf.model.layers[0].mlp.down_proj.weight
    keep = w.detach().clone()
    with torch.no_grad():
        w[3, 5] += 1.0  # one value, away from the sampled ones
    assert weights_hash(a) != h
    with torch.no_grad():
        w.copy_(keep)
    assert weights_hash(a) == h


def _edited_organism() -> interp.Model:
    m = interp.load_model("organism")
    with torch.no_grad():
        m.hf.model.layers[0].mlp.down_proj.weight.mul_(1.5)  # other weights, the same name
    return m


def test_a_name_reused_for_other_weights_recomputes_every_stage(tmp_path):
    out = tmp_path / "run"
    cfg = RefusalConfig.from_flat(**SMALL)
    first = run_refusal(cfg, out, model=interp.load_model("organism"))
    assert first.candidates is not None and first.scores is not None  # it got past the diagnosis
    other = _edited_organism()
    assert other.name == "organism"
    second = run_refusal(cfg, out, model=other, overwrite=True)
    assert {"tokens", "candidates"} <= set(second.computed)
    assert not torch.equal(second.candidates.raw, first.candidates.raw)
    fresh = run_refusal(cfg, tmp_path / "fresh", model=_edited_organism())
    assert torch.equal(second.candidates.raw, fresh.candidates.raw)
    for got, want in ((second.scores.bypass, fresh.scores.bypass), (second.scores.kl, fresh.scores.kl)):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    with pytest.raises(FileExistsError, match="other weights.*--overwrite"):  # the first model's again
        run_refusal(cfg, out, model=interp.load_model("organism"))
    again = run_refusal(cfg, out, model=other)  # the same weights again: every stage from the cache
    assert again.computed == []
    assert json.loads((out / "run.json").read_text())["model"] == weights_hash(other)
