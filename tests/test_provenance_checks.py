"""A fitted object applied to a model other than its provenance's: silent on the same model, a warning on another
model of the same width and layer count, a clear error when the width or the layer count differs."""

from __future__ import annotations

import warnings

import pytest
import torch

import interp
import steering
from interp.testing.tiny import tiny_model
from probes.directions import diff_of_means
from sae.edits import SAESplice
from sae.trainer import TrainConfig, train_sae

PROMPTS = ["the man said to the boy", "how do you find water", "tell me about the house", "what is a big animal"]


@pytest.fixture(scope="module")
def fitted():
    m = tiny_model("llama")
    acts = interp.capture(m, interp.Prompts(PROMPTS, labels=[0, 1, 0, 1]), sites="resid_post",
                          positions="last", runtime=interp.Runtime(progress=False))
    tokens = interp.capture(m, PROMPTS, sites="resid_post", layers=[1], positions="all",
                            runtime=interp.Runtime(progress=False))
    sae = train_sae(tokens, TrainConfig(d_sae=64, k=4, total_tokens=256, batch_size=32, progress=False)).sae
    return m, diff_of_means(acts), sae


def _edits(direction, sae):
    return {"add": lambda: steering.AddVector(direction, layers=[1], alpha=2.0, magnitude="unit"),
            "ablate": lambda: steering.DirectionalAblation(direction),
            "sae": lambda: SAESplice(sae)}


def _run(model, edit):
    ids = torch.tensor([[5, 6, 7]])
    with steering.apply(model, edit()):
        model.hf(input_ids=ids)


def test_provenance_records_the_model(fitted):
    m, d, sae = fitted
    assert d.model_id == m.name and d.meta["model"] == {"n_layers": 2, "d_model": 64}
    assert sae.provenance.meta["model"] == {"n_layers": 2, "d_model": 64}


@pytest.mark.parametrize("kind", ["add", "ablate", "sae"])
def test_same_model_is_silent(fitted, kind):
    m, d, sae = fitted
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _run(m, _edits(d, sae)[kind])


@pytest.mark.parametrize("kind", ["add", "ablate", "sae"])
def test_another_model_of_the_same_shape_warns(fitted, kind):
    _, d, sae = fitted
    other = tiny_model("mistral")  # width 64, 2 layers, another model
    with pytest.warns(UserWarning, match="fitted on 'tiny-llama'.*'tiny-mistral'"):
        _run(other, _edits(d, sae)[kind])


@pytest.mark.parametrize("kind", ["add", "ablate", "sae"])
@pytest.mark.parametrize("shape", [{"d_model": 32}, {"n_layers": 3}])
def test_another_width_or_layer_count_is_refused(fitted, kind, shape):
    _, d, sae = fitted
    other = tiny_model("llama", **shape)
    with pytest.raises(ValueError, match="refit"):
        _run(other, _edits(d, sae)[kind])


def test_bake_checks_too(fitted):
    _, d, _ = fitted
    with pytest.raises(ValueError, match="refit"):
        steering.bake(tiny_model("llama", n_layers=3), d.select([1]))
    with pytest.warns(UserWarning, match="fitted on 'tiny-llama'"):
        steering.bake(tiny_model("mistral"), d.select([1]))
