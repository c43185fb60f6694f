"""``sae.from_pretrained(release, sae_id)``: a published SAE through sae-lens's own registry, offline.

sae-lens maps ``release`` / ``sae_id`` to a Hugging Face repo and folder (its bundled
``pretrained_saes.yaml``; a release that is not listed may be given as the repo id ``"ORG/REPO"`` with the
folder as ``sae_id``, which sae-lens supports) and loads it with the converter that release needs. We
only read the local Hugging Face cache: the Hub client is put in offline mode for the call, so a file
that is not cached is an error naming the download command, never a silent download. The result is
converted to our :class:`sae.SAE` through the sae-lens format (:func:`sae.saelens_io.load_saelens`).
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from interp.extras import import_extra
from sae.model import SAE
from sae.saelens_io import load_saelens


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache the call reads, from the environment now (``HF_HUB_CACHE``, else
    ``HF_HOME/hub``), else huggingface_hub's default."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


@contextmanager
def offline_hub(cache_dir: str | os.PathLike | None = None) -> Iterator[Path]:
    """Offline mode and ``cache_dir`` for huggingface_hub inside the block (it reads both from module
    constants set at import, so a later ``HF_HUB_OFFLINE``/``HF_HUB_CACHE`` would be ignored); restored on exit."""
    from huggingface_hub import constants

    cache = Path(cache_dir).expanduser() if cache_dir is not None else hub_cache_dir()
    saved = constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE
    constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE = True, str(cache)
    try:
        yield cache
    finally:
        constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE = saved


def resolve(release: str, sae_id: str) -> tuple[str, str]:
    """``(repo_id, folder)`` that sae-lens's registry gives ``release`` / ``sae_id`` (a repo id passes through)."""
    import_extra("sae_lens", "sae.from_pretrained (sae-lens's release registry)")
    from sae_lens.loading.pretrained_saes_directory import (
        get_pretrained_saes_directory,
        get_repo_id_and_folder_name,
    )

    if release not in get_pretrained_saes_directory() and "/" not in release:
        raise ValueError(f"release {release!r} is not in sae-lens's pretrained_saes.yaml; list the releases with "
                         f"`sae_lens.loading.pretrained_saes_directory.get_pretrained_saes_directory()`, or pass the "
                         f"Hugging Face repo id ('ORG/REPO') as release and the SAE's folder in it as sae_id")
    return get_repo_id_and_folder_name(release, sae_id)


def _load_saelens_sae(release: str, sae_id: str, repo_id: str, folder: str, cache: Path) -> torch.nn.Module:
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled
    from sae_lens import SAE as SaeLensSAE

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # sae-lens's "loading by repo id" advice
            return SaeLensSAE.from_pretrained(release, sae_id, device="cpu", dtype="float32")
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, FileNotFoundError) as e:
        raise FileNotFoundError(
            f"SAE {release!r} / {sae_id!r} (repo {repo_id}, folder {folder!r}) is not in the local Hugging Face cache "
            f"{cache}. Download it once with network: `hf download {repo_id} --include '{folder}/*'` (or point "
            f"HF_HUB_CACHE / HF_HOME at a cache that has it); we never download. ({type(e).__name__}: {e})") from None


def from_pretrained(release: str, sae_id: str, device: str | torch.device | None = None, dtype: str | None = None,
                    cache_dir: str | os.PathLike | None = None) -> SAE:
    """Load a published SAE by sae-lens ``release`` and ``sae_id`` from the local HF cache, as our :class:`SAE`.

    ``cache_dir`` overrides the cache (default: ``HF_HUB_CACHE`` / ``HF_HOME`` / huggingface_hub's default).
    Input transforms sae-lens applies (decoder-norm rescaling, the release's ``norm_scaling_factor``) are
    folded into the weights, so the SAE reads raw activations at ``sae.site``. Architectures: those
    :func:`~sae.saelens_io.load_saelens` reads (standard, topk, jumprelu, batchtopk); others are an error.
    """
    repo_id, folder = resolve(release, sae_id)
    with offline_hub(cache_dir) as cache:
        theirs = _load_saelens_sae(release, sae_id, repo_id, folder, cache)
    hook = getattr(getattr(theirs.cfg, "metadata", None), "hook_name", None)
    with tempfile.TemporaryDirectory(prefix="interp-sae-") as tmp:
        theirs.save_model(tmp)  # sae-lens's own format, with its loading-time transforms already applied
        ours = load_saelens(tmp, device=device, dtype=dtype, site=hook)
    ours.cfg.meta.pop("path", None)
    ours.cfg.meta.update({"source": "sae-lens pretrained", "release": release, "sae_id": sae_id,
                          "repo_id": repo_id, "folder": folder})
    return ours


__all__ = ["from_pretrained", "hub_cache_dir", "offline_hub", "resolve"]
