"""The library functions outside the studies take the value types (issue 37): at most 8 parameters, chat and
system from ``interp.Prompts``, batch size / seed / progress from ``interp.Runtime``, and an old keyword gets a
TypeError naming its new home."""

import inspect

import pytest
import torch

import interp
import steering
from interp.testing.tiny import tiny_model

PROMPTS = ["Tell me a story.", "How do I bake bread?", "What is two plus two?"]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def _n_params(fn):
    sig = inspect.signature(inspect.unwrap(fn))
    return len([p for p in sig.parameters.values() if p.name not in ("self", "cls")])


def test_steering_functions_take_at_most_eight_parameters():
    from steering.serve import vllm_token_ids
    for fn in (steering.alpha_sweep, steering.residual_norms, vllm_token_ids):
        assert _n_params(fn) <= 8, fn.__name__
    import steering.prefill as prefill
    assert not hasattr(prefill, "run_batches")   # plumbing, off the public surface


def test_alpha_sweep_refuses_moved_keywords(model):
    def make(a):
        return steering.AddVector(torch.ones(model.d_model), layers=[0], alpha=a)
    with pytest.raises(TypeError, match=r"batch_size= \(moved into runtime=interp.Runtime\(batch_size=...\)\)"):
        steering.alpha_sweep(model, PROMPTS, make, [1.0], lambda lg: lg.mean(), on="logits", batch_size=2)
    with pytest.raises(TypeError, match=r"chat= \(moved into prompts=interp.Prompts\(texts, chat=...\)\)"):
        steering.alpha_sweep(model, PROMPTS, make, [1.0], lambda lg: lg.mean(), on="logits", chat=False)
    with pytest.raises(TypeError, match=r"n_random= \(moved into config=steering.SweepConfig\(n_random=...\)\)"):
        steering.alpha_sweep(model, PROMPTS, make, [1.0], lambda lg: lg.mean(), on="logits", n_random=2)
    with pytest.raises(ValueError, match="n_random must be"):
        steering.SweepConfig(n_random=-1)


def test_alpha_sweep_reads_chat_from_prompts_and_seed_from_runtime(model):
    def make(a):
        return steering.AddVector(torch.ones(model.d_model), layers=[0], alpha=a)

    def metric(lg):
        return lg[:, 3].mean()
    run = interp.Runtime(seed=5, progress=False)
    chat = steering.alpha_sweep(model, PROMPTS, make, [0.5], metric, on="logits", runtime=run)
    plain = steering.alpha_sweep(model, interp.Prompts(PROMPTS, chat=False), make, [0.5], metric, on="logits",
                                 runtime=run)
    assert chat.seeds == [5] and chat.baseline != pytest.approx(plain.baseline)


def test_residual_norms_refuses_moved_keywords_and_reads_positions(model):
    with pytest.raises(TypeError, match=r"exclude_special= \(moved into positions=interp.Positions"):
        steering.residual_norms(model, PROMPTS, exclude_special=False)
    with pytest.raises(TypeError, match=r"batch_size= \(moved into runtime="):
        steering.residual_norms(model, PROMPTS, batch_size=2)
    every = steering.residual_norms(model, PROMPTS, positions=interp.Positions("all", skip_special=False))
    some = steering.residual_norms(model, PROMPTS, runtime=interp.Runtime(batch_size=2))
    assert every.n_tokens > some.n_tokens


def test_sae_functions_read_chat_from_prompts_and_refuse_old_keywords(model):
    from sae.edits import LatentAblation, LatentSteering
    from sae.model import SAE, SAEConfig
    from sae.quality import ce_loss_recovered
    from sae.transcoder_quality import evaluate_transcoders
    from sae.transcoder_train import train_transcoder
    s = SAE(SAEConfig(d_in=model.d_model, d_sae=16, k=4, site="blocks.0.hook_resid_post"))
    with pytest.raises(TypeError, match=r"chat= \(moved into inputs=interp.Prompts\(texts, chat=...\)\)"):
        ce_loss_recovered(model, s, PROMPTS, chat=False)
    with pytest.raises(TypeError, match=r'skip_sink= \(moved into sinks="exclude"'):
        LatentSteering(s, [1], skip_sink=True)
    with pytest.raises(TypeError, match=r'skip_sink= \(moved into sinks="exclude"'):
        evaluate_transcoders(model, {}, PROMPTS, skip_sink=True)
    with pytest.raises(TypeError, match=r"arch= \(moved into cfg=sae.TrainConfig\(arch=...\)\)"):
        train_transcoder(model, PROMPTS, arch="topk")
    with pytest.raises(ValueError, match="sinks"):
        LatentAblation(s, [1], sinks="drop")
    plain = ce_loss_recovered(model, s, PROMPTS)                                   # one default: the chat format
    chat = ce_loss_recovered(model, s, interp.Prompts(PROMPTS, chat=True))
    raw = ce_loss_recovered(model, s, interp.Prompts(PROMPTS, chat=False))
    assert plain.clean == chat.clean and raw.n_predictions < chat.n_predictions
    for fn in (train_transcoder, evaluate_transcoders, ce_loss_recovered):
        assert _n_params(fn) <= 8, fn.__name__


def test_patching_functions_take_runs_runtime_and_prompts(model):
    from interp.patching import (
        greedy_transplant,
        learn_mask,
        logit_diff,
        make_pairs,
        sweep_layers,
        sweep_positions,
    )
    from interp.patching.activation import run_variants
    from interp.patching.attribution import compare_attribution
    from interp.patching.graphs import attribution_graph
    from interp.patching.neurons import neuron_ablation_effect
    from interp.patching.path import path_patch_sweep
    for fn in (sweep_layers, sweep_positions, compare_attribution, attribution_graph, learn_mask,
               neuron_ablation_effect, path_patch_sweep, greedy_transplant):
        assert _n_params(fn) <= 8, fn.__name__
    assert _n_params(run_variants) <= 9        # the sweeps' plumbing: + the bar's label
    pairs = make_pairs(model, PROMPTS[:2], PROMPTS[1:])
    met = logit_diff(3, 4)
    quiet = interp.Runtime(batch_size=4, progress=False)
    with pytest.raises(TypeError, match=r"batch_size= \(moved into runtime=interp.Runtime\(batch_size=...\)\)"):
        sweep_positions(model, pairs, met, "resid_pre", batch_size=4)
    with pytest.raises(TypeError, match=r"target= \(moved into runs=\(source, target\)\)"):
        sweep_layers(model, pairs, met, target="clean")
    with pytest.raises(TypeError, match=r"chat= \(moved into prompts=interp.Prompts\(texts, chat=...\)\)"):
        neuron_ablation_effect(model, PROMPTS, met, [(0, 1)], chat=False)
    with pytest.raises(TypeError, match=r"chat= \(moved into clean=interp.Prompts\(texts, chat=...\)"):
        make_pairs(model, PROMPTS[:2], PROMPTS[1:], chat=False)
    with pytest.raises(TypeError, match=r"steps= \(moved into config=interp.patching.MaskConfig\(steps=...\)\)"):
        learn_mask(model, PROMPTS, met, steps=3)
    with pytest.raises(ValueError, match="each run must be"):
        sweep_positions(model, pairs, met, "resid_pre", runs=("clean", "noisy"), runtime=quiet)
    same = sweep_positions(model, pairs, met, "resid_pre", runs=("corrupted", "corrupted"), runtime=quiet)
    assert torch.allclose(same.delta, torch.zeros_like(same.delta), atol=1e-5)
    # chat travels with the prompts: raw text gives a different batch than the template
    chat = neuron_ablation_effect(model, PROMPTS, met, [(0, 1)], runtime=quiet)
    raw = neuron_ablation_effect(model, interp.Prompts(PROMPTS, chat=False), met, [(0, 1)], runtime=quiet)
    assert chat.baseline != pytest.approx(raw.baseline)


def test_probe_and_tune_functions_take_config_values():
    import probes
    from interp.tune import fine_tune
    from interp.tune.preference import preference_tune
    from probes.logistic import solve_logistic
    for fn in (solve_logistic, probes.cross_validate):
        assert _n_params(fn) <= 8, fn.__name__
    for fn in (probes.erasure_cv, probes.transfer.rank_ablation, fine_tune, preference_tune):
        assert _n_params(fn) <= 9, fn.__name__
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(40, 2, 8, generator=g), torch.arange(40) % 2
    with pytest.raises(TypeError, match=r"seed= \(moved into runtime=interp.Runtime\(seed=...\)\)"):
        probes.cross_validate(X, y, seed=1)
    with pytest.raises(TypeError, match=r"max_iter= \(moved into config=probes.LogisticConfig\(max_iter=...\)\)"):
        solve_logistic(X.transpose(0, 1), y, torch.ones(1, 40, dtype=torch.bool), 1e-3, max_iter=5)
    with pytest.raises(TypeError, match=r"chat= \(moved into prompts=interp.Prompts\(texts, chat=...\)\)"):
        fine_tune(tiny_model("llama"), PROMPTS, PROMPTS, chat=False)
    a = probes.cross_validate(X, y, runtime=interp.Runtime(seed=3, progress=False))
    b = probes.cross_validate(X, y, runtime=interp.Runtime(seed=3, progress=False))
    assert torch.equal(torch.as_tensor(a.accuracy), torch.as_tensor(b.accuracy))


def test_figures_take_grouped_series_or_the_result(model):
    from interp.viz.refusal import writer_bars
    from interp.viz.steering import alpha_cost_curve
    assert _n_params(writer_bars) <= 8 and _n_params(alpha_cost_curve) <= 8
    with pytest.raises(TypeError, match="control_rates"):     # viz imports nothing of ours: Python's own error
        writer_bars(["a"], ([0.5], [0.4], [0.6]), control_rates=[0.5])
    fig = writer_bars(["a", "b"], ([0.5, 0.2], [0.4, 0.1], [0.6, 0.3]), ([0.5, 0.5], None, None),
                      baseline=(0.55, (0.5, 0.6)))
    assert [t.name for t in fig.data] == ["refusal direction ablated", "orthogonal control ablated"]

    def make(a):
        return steering.AddVector(torch.ones(model.d_model), layers=[0], alpha=a)
    sweep = steering.alpha_sweep(model, PROMPTS, make, [0.0, 1.0], lambda lg: lg[:, 3].mean(), on="logits",
                                 config=steering.SweepConfig(n_random=1, cost=True),
                                 runtime=interp.Runtime(progress=False))
    assert len(alpha_cost_curve(sweep).data) == len(sweep.plot().data) >= 4


def test_capture_batches_takes_positions_and_runtime(model):
    from interp.capturing import capture_batches
    from interp.forward import batches, prepare
    from interp.sites import expand_sites
    assert _n_params(capture_batches) <= 8
    _, encs = prepare(model, PROMPTS)
    bs, sites = batches(model, encs, 2), expand_sites("resid_post", model.n_layers, [0])
    with pytest.raises(TypeError, match=r"dtype= \(moved into runtime=interp.Runtime\(dtype=...\)\)"):
        capture_batches(model, bs, sites, "prompt_mean", dtype=torch.float64)
    with pytest.raises(TypeError, match=r"sinks= \(moved into positions=interp.Positions\(rule, sinks=...\)\)"):
        capture_batches(model, bs, sites, "prompt_mean", sinks="keep")
    kept, *_ = capture_batches(model, bs, sites, interp.Positions("prompt_mean", skip_special=False),
                               runtime=interp.Runtime(dtype=torch.float64, progress=False))
    skipped, *_ = capture_batches(model, bs, sites, "prompt_mean")
    assert kept.dtype == torch.float64 and skipped.dtype == torch.float32 and not torch.allclose(kept.float(), skipped)
