"""Massive activations (attention sinks): detected at capture, left out of position means, SAE / transcoder
training data and per-token reads by default (``sinks="exclude"``), kept with ``sinks="keep"``.

On SmolLM2 without a chat template the first real token is a sink (residual norm ~23,500 against ~150-600 at
layers 11-27); a prompt-mean direction and an SAE fitted with the defaults must equal those fitted with that token
left out by hand. Models without sinks (the tiny ones) must be untouched."""

from __future__ import annotations

import pytest
import torch

import interp
from interp.positions import SINK_RATIO, massive, without_first
from interp.testing.tiny import FAMILIES, tiny_model
from probes.directions import diff_of_means
from sae.stream import TokenStream
from sae.trainer import TrainConfig, train_sae
from sae.transcoder_train import capture_pairs

TOPIC_A = ["How do I bake a loaf of sourdough bread at home?", "What is the best way to roast vegetables?",
           "Give me a simple recipe for tomato soup.", "How long should I boil an egg for a soft yolk?",
           "Which spices go well with roasted chicken?", "How do I make fresh pasta without a machine?",
           "What can I cook with rice, beans and onions?", "How do I keep a pancake batter from going lumpy?"]
TOPIC_B = ["What is 17 times 23? Show your working.", "Explain how to solve a quadratic equation.",
           "What is the derivative of x squared?", "How many prime numbers are there below fifty?",
           "Why is the square root of two irrational?", "What is the area of a circle of radius three?",
           "Convert three eighths into a decimal number.", "What is the sum of the angles in a triangle?"]
LAYER = 15  # in SmolLM2's massive band (layers 11-27)


@pytest.fixture(scope="module")
def smol():
    return interp.load_model("smollm2-135m-instruct")


def test_rule_flags_only_the_first_token_in_the_massive_band(smol):
    acts = interp.capture(smol, interp.Prompts(TOPIC_A, chat=False), sites="resid_post",
                          layers=[2, LAYER, 28], positions="all", runtime=interp.Runtime(progress=False))
    first = ~without_first(acts.mask) & acts.mask  # each prompt's first real token
    assert acts.sinks is not None and acts.sinks.shape == acts.tensor.shape[:3]
    assert torch.equal(acts.sinks[:, 1], first)          # layer 15: the first token and nothing else
    assert not acts.sinks[:, [0, 2]].any()                # layers 2 and 28: first token 5-17x, under the ratio
    assert acts.meta["sinks"]["flagged"] == {acts.sites[0]: 0, acts.sites[1]: len(TOPIC_A), acts.sites[2]: 0}
    assert acts.meta["sinks"]["ratio"] == SINK_RATIO


def test_prompt_mean_direction_equals_hand_exclusion(smol):
    prompts, y = TOPIC_A + TOPIC_B, [0] * len(TOPIC_A) + [1] * len(TOPIC_B)
    with pytest.warns(UserWarning, match="massive"):
        mean = interp.capture(smol, interp.Prompts(prompts, chat=False, labels=y), sites="resid_post",
                              layers=[LAYER], positions="prompt_mean", runtime=interp.Runtime(progress=False))
    tokens = interp.capture(smol, interp.Prompts(prompts, chat=False), sites="resid_post", layers=[LAYER],
                            positions="all", runtime=interp.Runtime(progress=False))
    keep = without_first(tokens.mask).float()                              # the sink left out by hand
    by_hand = torch.einsum("nsp...,np->ns...", tokens.tensor, keep) / keep.sum(1)[:, None, None]
    d_default, d_hand = diff_of_means(mean), diff_of_means(by_hand, y)
    torch.testing.assert_close(mean.tensor, by_hand, rtol=1e-5, atol=1e-4)
    assert float(d_default.vectors[0] @ d_hand.vectors[0]) > 1 - 1e-6
    assert d_default.meta["sinks"]["excluded"] == {mean.sites[0]: len(prompts)}
    kept = interp.capture(smol, interp.Prompts(prompts, chat=False, labels=y), sites="resid_post",
                          layers=[LAYER], positions=interp.Positions("prompt_mean", sinks="keep"),
                          runtime=interp.Runtime(progress=False))
    assert float(diff_of_means(kept).vectors[0] @ d_hand.vectors[0]) < 0.9  # the trap the default avoids


def test_sae_defaults_train_on_the_data_without_the_sink(smol):
    acts = interp.capture(smol, interp.Prompts(TOPIC_A + TOPIC_B, chat=False), sites="resid_post",
                          layers=[LAYER], positions="all", runtime=interp.Runtime(progress=False))
    by_hand = acts.tensor[:, 0][without_first(acts.mask)]
    cfg = TrainConfig(d_sae=256, k=8, total_tokens=2048, batch_size=128, progress=False, seed=3)
    with pytest.warns(UserWarning, match="massive"):
        default = train_sae(acts, cfg)
    hand = train_sae(by_hand, cfg)
    for name, p in default.sae.state_dict().items():
        torch.testing.assert_close(p, hand.sae.state_dict()[name], rtol=0, atol=0, msg=name)
    assert torch.equal(acts.flat_tokens(acts.sites[0]), by_hand)
    assert acts.flat_tokens(acts.sites[0], sinks="keep").shape[0] == int(acts.mask.sum())


def test_store_stream_and_transcoder_pairs_leave_the_sink_out(smol, tmp_path):
    store = interp.capture(smol, interp.Prompts(TOPIC_A, chat=False), sites="resid_post", layers=[LAYER],
                           positions="all", out=tmp_path / "store",
                           runtime=interp.Runtime(progress=False, batch_size=3))
    shard_rows = sum(int(without_first(s.mask).sum()) for s in store.iter_shards())
    assert sum(s.flat_tokens(store.sites[0]).shape[0] for s in store.iter_shards()) == shard_rows
    assert torch.equal(store.load().sinks[:, 0], ~without_first(store.load().mask) & store.load().mask)
    pairs = capture_pairs(smol, interp.Prompts(TOPIC_A, chat=False), layers=[11])  # block 11's MLP writes the sink: flagged at its output only
    assert not pairs.sinks[:, 0].any() and int(pairs.sinks[:, 1].sum()) == len(TOPIC_A)
    with pytest.warns(UserWarning, match="massive"):
        stream = TokenStream(pairs, 16, site=pairs.sites[0], target_site=pairs.sites[1])
    assert stream.n_sinks == len(TOPIC_A)                   # the pair keeps the same tokens on both sides
    assert stream._tokens.shape[0] == int(pairs.mask.sum()) - len(TOPIC_A)


@pytest.mark.parametrize("family", FAMILIES)
def test_models_without_sinks_are_untouched(family):
    m = tiny_model(family)
    prompts = ["the man said to the boy that a new house is big", "how do you find water", "tell me"]
    for chat in (False, True):
        acts = interp.capture(m, interp.Prompts(prompts, chat=chat), sites="resid_post", positions="all",
                              runtime=interp.Runtime(progress=False))
        assert not acts.sinks.any()
        assert set(acts.meta["sinks"]["flagged"].values()) == {0}
        a = interp.capture(m, interp.Prompts(prompts, chat=chat), sites="resid_post", positions="prompt_mean",
                           runtime=interp.Runtime(progress=False))
        b = interp.capture(m, interp.Prompts(prompts, chat=chat), sites="resid_post",
                           positions=interp.Positions("prompt_mean", sinks="keep"),
                           runtime=interp.Runtime(progress=False))
        assert torch.equal(a.tensor, b.tensor)


def test_massive_rule_and_bad_input():
    x = torch.ones(2, 4, 3)
    x[0, 1] *= 25.0   # 25x the median: massive
    x[1, 2] *= 15.0   # 15x: under the ratio
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]], dtype=torch.bool)
    assert massive(x, mask).tolist() == [[False, True, False, False], [False, False, False, False]]
    one = torch.ones(1, 1, 3) * 100
    assert not massive(one, torch.ones(1, 1, dtype=torch.bool)).any()  # a lone token is never a sink
    m = tiny_model("llama")
    with pytest.raises(ValueError, match="sinks='exclude' or 'keep'"):
        interp.capture(m, ["hello"], positions=interp.Positions("prompt_mean", sinks="drop"),
                       runtime=interp.Runtime(progress=False))
    with pytest.raises(ValueError, match="sinks='exclude' or 'keep'"):
        TrainConfig(sinks="yes")


def test_store_manifest_counts_the_sinks_per_site(smol, tmp_path):
    sites = [f"blocks.{la}.hook_resid_post" for la in (2, LAYER)]
    store = interp.capture(smol, interp.Prompts(TOPIC_A, chat=False), sites="resid_post", layers=[2, LAYER],
                           positions="all", out=tmp_path / "store", runtime=interp.Runtime(progress=False, batch_size=3))
    again = interp.ActivationStore(tmp_path / "store")                    # read back from the manifest alone
    assert again.sink_counts == store.sink_counts == {sites[0]: 0, sites[1]: len(TOPIC_A)}
    per_shard = again.manifest["sink_counts"]["shards"]
    assert [per_shard[str(k)] for k in range(3)] == [[0, 3], [0, 3], [0, 2]]   # written shard by shard
    assert {k: int(v) for k, v in zip(sites, store.load().sinks.sum((0, 2)))} == again.sink_counts
    assert again.summary()["sink_counts"] == again.sink_counts and "sinks" in repr(again)
    with pytest.warns(UserWarning, match="massive"):
        interp.capture(smol, interp.Prompts(TOPIC_A, chat=False), sites="resid_post", layers=[LAYER],
                       positions="prompt_mean", out=tmp_path / "mean", runtime=interp.Runtime(progress=False))
    assert interp.ActivationStore(tmp_path / "mean").sink_counts == {sites[1]: len(TOPIC_A)}
