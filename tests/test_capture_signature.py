"""``interp.capture``'s short signature: prompts options travel in ``interp.Prompts``, how it runs in
``interp.Runtime``, the mean options in ``interp.Positions``; the old keywords fail naming their new home, and the
value types give exactly what a hand-built capture over the same batches gives."""

from __future__ import annotations

import inspect

import pytest
import torch

import interp
from interp.capturing import capture_batches
from interp.fingerprint import content_ids, fingerprint, run_parts
from interp.forward import batches, prepare
from interp.positions import RULES, Positions
from interp.sites import expand_sites
from interp.values import Runtime

from .conftest import mixed_prompts

MOVED = {"batch_size": "runtime=interp.Runtime(batch_size=...)", "dtype": "runtime=interp.Runtime(dtype=...)",
         "progress": "runtime=interp.Runtime(progress=...)", "distributed": "runtime=interp.Runtime(distributed=...)",
         "sort_by_length": "runtime=interp.Runtime(sort_by_length=...)",
         "chat": "prompts=interp.Prompts(texts, chat=...)", "labels": "prompts=interp.Prompts(texts, labels=...)",
         "responses": "prompts=interp.Prompts(texts, responses=...)",
         "system": "prompts=interp.Prompts(texts, system=...)", "prompt_ids": "prompts=interp.Prompts(texts, ids=...)",
         "mean_skip_special": "positions=interp.Positions(rule, skip_special=...)",
         "sinks": "positions=interp.Positions(rule, sinks=...)"}


def test_the_signature_is_eight_parameters():
    names = list(inspect.signature(interp.capture).parameters)
    assert names == ["model", "prompts", "sites", "positions", "layers", "out", "overwrite", "runtime"]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_keyword_fails_naming_its_new_home(tiny_models, old):
    with pytest.raises(TypeError) as err:
        interp.capture(tiny_models("llama"), ["a b"], **{old: None})
    assert f"{old}= (moved into {MOVED[old]})" in str(err.value)


def _by_hand(m, texts, responses, site, rule, batch_size, dtype, chat=True, skip_special=True, sinks="exclude"):
    """What the old keywords computed: the same encodings, batches and capture loop, spelled out."""
    _, encs = prepare(m, texts, chat=chat, responses=responses)
    sites = expand_sites(site, m.n_layers, None)
    return capture_batches(m, batches(m, encs, batch_size), sites, Positions(rule, sinks, skip_special),
                           runtime=Runtime(dtype=dtype, progress=False))


def test_prompts_and_runtime_give_what_the_old_keywords_gave(tiny_models):
    m = tiny_models("llama")
    texts = mixed_prompts(5, seed=1)
    responses = ["the", "a of", "to and in", "it you", "he"]
    prompts = interp.Prompts(texts, responses=responses, labels=[1, 0, 1, 0, 1])
    run = interp.Runtime(batch_size=2, dtype=torch.float64, progress=False)
    acts = interp.capture(m, prompts, "resid_post.1", "response_mean", runtime=run)
    tensor, mask, _, _ = _by_hand(m, texts, responses, "resid_post.1", "response_mean", 2, torch.float64)
    assert mask is None and acts.tensor.dtype == torch.float64
    torch.testing.assert_close(acts.tensor, tensor, atol=0, rtol=0)
    formatted, _ = prepare(m, texts, responses=responses)
    assert acts.labels == [1, 0, 1, 0, 1] and acts.prompt_ids == content_ids(formatted, responses)
    assert acts.meta["chat"] is True and acts.meta["batch_size"] == 2 and acts.positions == "response_mean"
    ids = interp.capture(m, interp.Prompts(texts[:2], ids=["x", "y"]), runtime=run).prompt_ids
    assert ids == ["x", "y"]


def test_chat_defaults_to_true_and_a_list_equals_its_prompts(tiny_models):
    m = tiny_models("llama")
    texts = mixed_prompts(4, seed=2)
    run = interp.Runtime(progress=False)
    plain = interp.capture(m, texts, "resid_post.0", "post_instruction", runtime=run)
    given = interp.capture(m, interp.Prompts(texts, system="Be brief."), "resid_post.0", "post_instruction",
                           runtime=run)
    tensor, mask, _, _ = _by_hand(m, texts, None, "resid_post.0", "post_instruction", 16, torch.float32)
    assert plain.meta["chat"] is True
    torch.testing.assert_close(plain.tensor, tensor, atol=0, rtol=0)
    assert torch.equal(plain.mask, mask)
    _, sys_encs = prepare(m, texts, system="Be brief.")
    assert given.tensor.shape[0] == len(sys_encs) and given.prompt_ids != plain.prompt_ids  # the system prompt counts


def test_positions_carries_the_mean_options(tiny_models):
    m = tiny_models("llama")
    texts = mixed_prompts(4, seed=3)
    run = interp.Runtime(progress=False)
    pos = interp.Positions("prompt_mean", sinks="keep", skip_special=False)
    acts = interp.capture(m, interp.Prompts(texts, chat=False), "resid_post.1", pos, runtime=run)
    tensor, _, _, _ = _by_hand(m, texts, None, "resid_post.1", "prompt_mean", 16, torch.float32, chat=False,
                               skip_special=False, sinks="keep")
    torch.testing.assert_close(acts.tensor, tensor, atol=0, rtol=0)
    assert acts.positions == "prompt_mean+special+sinks" and acts.meta["sinks"]["mode"] == "keep"
    assert acts.meta["chat"] is False
    assert interp.capture(m, texts, "resid_post.1", "prompt_mean", runtime=run).positions == "prompt_mean"
    assert interp.Positions.of([0, -1]) == interp.Positions((0, -1)) and interp.Positions.of(pos) is pos


def test_positions_refuses_another_spelling():
    with pytest.raises(ValueError, match="unknown position rule 'last_token'") as err:
        interp.Positions("last_token")
    assert str(RULES) in str(err.value)
    with pytest.raises(ValueError, match="sinks='exclude' or 'keep'"):
        interp.Positions("prompt_mean", sinks="drop")
    with pytest.raises(TypeError, match="list of ints"):
        interp.Positions(1.5)


def test_a_store_keeps_the_old_fingerprint(tiny_models, tmp_path):
    m = tiny_models("llama")
    texts = mixed_prompts(5, seed=4)
    prompts = interp.Prompts(texts, chat=False, labels=list("ababa"))
    run = interp.Runtime(batch_size=2, sort_by_length=True, progress=False)
    store = interp.capture(m, prompts, "resid_post", "all", out=tmp_path / "s", runtime=run)
    formatted, _ = prepare(m, texts, chat=False)
    sites = [s.name for s in expand_sites("resid_post", m.n_layers, None)]
    parts = run_parts(m, formatted, sites, "all", 2, torch.float32, list("ababa"), content_ids(formatted, None),
                      sort_by_length=True)
    assert store.manifest["fingerprint"] == fingerprint(parts) and store.manifest["labels"] == list("ababa")
    assert store.manifest["meta"]["chat"] is False and "order" in store.manifest
