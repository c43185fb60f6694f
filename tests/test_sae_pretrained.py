"""``sae.from_pretrained`` through sae-lens's registry, reading only a Hugging Face cache the test builds."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import sae_lens  # noqa: F401  a core dependency: a broken install fails here, it is never skipped
import torch

import sae
from sae.model import SAE, SAEConfig
from sae.saelens_io import save_saelens

warnings.filterwarnings("ignore", module="sae_lens")

REV = "0123456789abcdef0123456789abcdef01234567"
RELEASE, REPO = "gpt2-small-res-jb", "jbloom/GPT2-Small-SAEs-Reformatted"  # a real entry of pretrained_saes.yaml


def _sae(arch: str, site: str, seed: int = 0) -> SAE:
    k = 4 if arch in ("topk", "batchtopk") else None
    s = SAE(SAEConfig(16, 40, arch=arch, k=k, site=site, model_id="tiny"), seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in (s.W_enc, s.b_enc, s.W_dec, s.b_dec):
            p.add_(0.2 * torch.randn(p.shape, generator=g))
        if s.threshold is not None:
            s.threshold.copy_(0.3 * torch.rand(40, generator=g))
    return s


def _cache_repo(hub: Path, repo_id: str, folder: str, s: SAE) -> None:
    """Lay ``s`` out as a cached snapshot: ``models--ORG--REPO/snapshots/REV/FOLDER`` and ``refs/main``."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    save_saelens(s, repo / "snapshots" / REV / folder)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(REV)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "hf" / "hub"


@pytest.mark.parametrize("arch", ["relu", "topk"])
def test_registered_release_from_cache(hub, arch):
    ours = _sae(arch, "blocks.0.hook_resid_pre")
    _cache_repo(hub, REPO, "blocks.0.hook_resid_pre", ours)
    got = sae.from_pretrained(RELEASE, "blocks.0.hook_resid_pre")
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(3)) * 2
    assert got.site == "blocks.0.hook_resid_pre" and got.arch == arch
    assert got.cfg.meta["release"] == RELEASE and got.cfg.meta["repo_id"] == REPO
    with torch.no_grad():
        torch.testing.assert_close(got(x), ours(x), atol=1e-6, rtol=0)


def test_repo_id_as_release_and_cache_dir(tmp_path):
    """An unlisted repo: sae-lens accepts ``ORG/REPO`` as release and the folder as sae_id."""
    ours = _sae("jumprelu", "blocks.1.hook_resid_post")
    _cache_repo(tmp_path / "cache", "interp-test/tiny-saes", "layer_1", ours)
    got = sae.from_pretrained("interp-test/tiny-saes", "layer_1", cache_dir=tmp_path / "cache")
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(4))
    assert got.site == "blocks.1.hook_resid_post" and got.arch == "jumprelu"
    with torch.no_grad():
        torch.testing.assert_close(got(x), ours(x), atol=1e-6, rtol=0)


def test_clear_errors_and_hub_state_restored(hub):
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE
    _cache_repo(hub, REPO, "blocks.0.hook_resid_pre", _sae("relu", "blocks.0.hook_resid_pre"))
    with pytest.raises(FileNotFoundError, match=r"not in the local Hugging Face cache.*hf download"):
        sae.from_pretrained(RELEASE, "blocks.5.hook_resid_pre")
    with pytest.raises(ValueError, match="not in sae-lens's pretrained_saes.yaml"):
        sae.from_pretrained("no-such-release", "x")
    with pytest.raises(ValueError, match="not found in release"):
        sae.from_pretrained(RELEASE, "no-such-id")
    assert (constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE) == before
