"""Shared fixtures: tiny seeded models (no downloads) and the path of ../shared."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("INTERP_SHARED", REPO.parent / "shared"))

torch.set_num_threads(1)  # tiny models: one thread beats two (no sync overhead, no oversubscription)


def shared_path(*parts: str) -> Path:
    """A path under ../shared, skipping the test with a reason when it is absent."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} is absent: ../shared (evaluation data and models) is only laid beside developer and CI checkouts")
    return p


@pytest.fixture(scope="session")
def tiny_models():
    """Cache of tiny models by family, built once per session."""
    from interp.testing.tiny import tiny_model

    cache: dict[str, object] = {}

    def get(family: str):
        if family not in cache:
            cache[family] = tiny_model(family)
        return cache[family]

    return get


@pytest.fixture(scope="module")
def sae():
    """A small ReLU SAE with a negative encoder bias (sparse codes), shared by the SAE analysis tests."""
    from sae.model import SAE, SAEConfig

    s = SAE(SAEConfig(32, 128, arch="relu", site="resid_post.0"), seed=0)
    with torch.no_grad():
        s.b_enc.fill_(-0.3)
    return s
