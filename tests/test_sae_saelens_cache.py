"""Our store exported to sae-lens's cached-activations format reads back, through sae-lens's own loader, equal."""

from __future__ import annotations

import pytest
import torch

import interp
from sae.saelens_cache import export_saelens_activations
from tests.conftest import mixed_prompts

SITE = "blocks.1.hook_resid_post"


def _saelens_reader(path: str, context_size: int, d_in: int, rows: int):
    from sae_lens.training.activations_store import ActivationsStore

    return ActivationsStore(model=None, dataset=None, streaming=False, hook_name=SITE, hook_head_index=None,
                            context_size=context_size, d_in=d_in, n_batches_in_buffer=2, total_training_tokens=10**6,
                            store_batch_size_prompts=rows, train_batch_size_tokens=64, prepend_bos=False,
                            normalize_activations="none", device=torch.device("cpu"), dtype="float32",
                            cached_activations_path=path)


def test_export_reads_back_equal_through_saelens(tiny_models, tmp_path):
    store = interp.capture(tiny_models("llama"), interp.Prompts(mixed_prompts(10, seed=2), chat=False),
                           sites="resid_post", positions="all", out=tmp_path / "st",
                           runtime=interp.Runtime(batch_size=3, sort_by_length=True, progress=False))
    tokens = torch.cat([s.flat_tokens(SITE) for s in store.iter_shards()])  # the store's row order
    info = export_saelens_activations(store, tmp_path / "lens", site=SITE, context_size=8, rows_per_part=3)
    rows = tokens.shape[0] // 8
    assert info["rows"] == rows and info["dropped_tokens"] == tokens.shape[0] - rows * 8 and info["d_in"] == 64
    reader = _saelens_reader(info["path"], 8, 64, rows)  # sae-lens checks the column and its [8, 64] shape
    acts, token_ids = reader.get_raw_llm_batch()
    assert token_ids is None
    torch.testing.assert_close(acts, tokens[:rows * 8], rtol=0, atol=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lens", "st"]  # no temp folder left
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export_saelens_activations(store, tmp_path / "lens", site=SITE, context_size=8)
    with pytest.raises(ValueError, match="fewer than one row of 100000"):
        export_saelens_activations(store, tmp_path / "big", site=SITE, context_size=100_000)
    with pytest.raises(ValueError, match="pass site="):
        export_saelens_activations(store, tmp_path / "x")
    assert not (tmp_path / "big").exists()
