"""The one activations-or-tensor coercion module and its width check."""

import numpy as np
import pytest
import torch

from interp.activations import Activations
from interp.coerce import check_width, layer_tensor, site_indices, token_rows

SITES = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post", "blocks.2.hook_resid_post"]


def test_tensor_and_activations_give_the_same_layers():
    X = torch.randn(5, 3, 4)
    acts = Activations(tensor=X, sites=SITES)
    assert torch.equal(layer_tensor(X), X) and torch.equal(layer_tensor(acts), X)
    assert torch.equal(layer_tensor(acts, [SITES[2], SITES[0]]), X[:, [2, 0]])  # picked by name, in order
    assert torch.equal(layer_tensor(X[:, 0]), X[:, :1])                          # [n, d] is one layer
    assert torch.equal(layer_tensor(X.numpy(), SITES), X)
    assert site_indices(acts, [SITES[1]]) == [1]


def test_clear_errors():
    X = torch.randn(5, 3, 4)
    with pytest.raises(ValueError, match=r"must be \[n, 2, d\] to match the 2 fitted layers"):
        layer_tensor(X, SITES[:2])
    with pytest.raises(ValueError, match="lack sites"):
        layer_tensor(Activations(tensor=X[:, :2], sites=SITES[:2]), SITES)
    with pytest.raises(ValueError, match="positions='last'.*flat_tokens"):
        layer_tensor(Activations(tensor=torch.randn(2, 3, 4, 4), sites=SITES))
    with pytest.raises(TypeError, match="Activations or a tensor"):
        layer_tensor([[1.0]])
    bad = X.clone()
    bad[0, 0, 0] = float("nan")
    assert layer_tensor(bad) is not None
    with pytest.raises(ValueError, match="NaN or Inf"):
        layer_tensor(bad, check_finite=True)


def test_token_rows():
    acts = Activations(tensor=torch.randn(2, 2, 3, 4), sites=SITES[:2], positions="all",
                       mask=torch.tensor([[False, True, True], [True, True, True]]))
    assert token_rows(acts, SITES[1]).shape == (5, 4)
    assert torch.equal(token_rows(torch.ones(2, 3, 4)), torch.ones(6, 4))
    with pytest.raises(ValueError, match="pass site="):
        token_rows(acts)
    with pytest.raises(TypeError, match="Activations or a tensor"):
        token_rows(np.ones((2, 4)))


def test_width_error_names_both_widths_and_the_fix():
    check_width(torch.zeros(2, 8), 8)
    with pytest.raises(ValueError, match="probe has width 8 but the activations have width 6; use a probe fitted"):
        check_width(torch.zeros(2, 8), 6, "probe")
    with pytest.raises(ValueError, match="vector has width 8 but the model's residual stream has width 6"):
        check_width(torch.zeros(8), 6, "vector", "the model's residual stream has")
