"""Progress bars of the patching tools: ``progress=False`` prints nothing, ``progress=True`` prints a bar named
after the job on stderr, and the results are the same either way."""

from __future__ import annotations

import pytest
import torch

import interp
from interp.patching import (
    attribute,
    greedy_transplant,
    learn_mask,
    logit_diff,
    make_pairs,
    sweep_layers,
    sweep_positions,
)
from interp.patching.activation import sweep_heads
from interp.patching.attribution import compare_attribution
from interp.patching.heads import head_ablation_sweep
from interp.patching.masks import MaskConfig
from interp.patching.neurons import neuron_ablation_effect
from interp.patching.path import path_patch_sweep
from interp.testing.tiny import tiny_model

CLEAN = ["the man is big", "a man can go home"]
CORRUPT = ["the boy is small", "a boy can see home"]


@pytest.fixture(scope="module")
def setup():
    m = tiny_model("llama", n_layers=2)
    tok = m.tokenizer
    met = logit_diff(tok.convert_tokens_to_ids("the"), tok.convert_tokens_to_ids("a"))
    return m, make_pairs(m, CLEAN, CORRUPT), met


def _values(res):
    """The numbers of any result, for comparing a quiet and a verbose run."""
    if isinstance(res, torch.Tensor):
        return res
    for attr in ("values", "scores"):
        if hasattr(res, attr):
            return getattr(res, attr)
    if hasattr(res, "sweeps"):
        return torch.cat([sw.values.flatten() for sw in res.sweeps.values()])
    if hasattr(res, "estimate"):
        return torch.cat([torch.cat([res.exact[k].flatten(), res.estimate[k].flatten()]) for k in res.exact])
    return torch.tensor([res.baseline] + [t["score"] for t in res.trajectory])


def _rt(batch_size: int, progress: bool) -> interp.Runtime:
    return interp.Runtime(batch_size=batch_size, progress=progress)


JOBS = {
    "patching resid_pre by position": lambda m, p, met, **kw: sweep_positions(m, p, met, runtime=_rt(4, **kw)),
    "patching heads": lambda m, p, met, **kw: sweep_heads(m, p, met, runtime=_rt(4, **kw)),
    "patching layers": lambda m, p, met, **kw: sweep_layers(m, p, met, runtime=_rt(4, **kw)),
    "path patching": lambda m, p, met, **kw: path_patch_sweep(m, p, met, runtime=_rt(4, **kw)),
    "attribution": lambda m, p, met, **kw: attribute(m, p, met, runtime=_rt(64, **kw)),
    "checking attribution": lambda m, p, met, **kw: compare_attribution(m, p, met, sites=("resid_pre", "attn_z"),
                                                                          runtime=_rt(64, **kw)),
    "zero-ablating heads": lambda m, p, met, **kw: head_ablation_sweep(m, CLEAN, met, batch_size=4, **kw),
    "zero-ablating neurons": lambda m, p, met, **kw: neuron_ablation_effect(m, CLEAN, met, [(0, 1), (1, 2)],
                                                                           n_control=2, runtime=_rt(2, **kw)),
    "learning mask": lambda m, p, met, **kw: learn_mask(m, CLEAN, met, config=MaskConfig(steps=4), runtime=_rt(16, **kw)),
}


@pytest.mark.parametrize("desc", list(JOBS))
def test_progress_bar_on_stderr_only_when_asked(setup, capsys, desc):
    m, pairs, met = setup
    quiet = JOBS[desc](m, pairs, met, progress=False)
    out = capsys.readouterr()
    assert out.err == "" and out.out == ""
    loud = JOBS[desc](m, pairs, met, progress=True)
    err = capsys.readouterr().err
    assert desc in err and "|" in err, err                  # tqdm's "desc:  50%|#####     | 1/2" line
    if desc == "checking attribution":
        assert "patching" not in err                         # the exact sweeps inside keep quiet
    assert torch.equal(_values(quiet), _values(loud))


def test_transplant_search_progress(capsys):
    tgt, src = tiny_model("llama", seed=0, n_layers=2), tiny_model("llama", seed=1, n_layers=2)
    ids = torch.randint(5, 200, (2, 6), generator=torch.Generator().manual_seed(0))

    def score(model):
        with torch.no_grad():
            return float(model.hf(input_ids=ids).logits[:, -1, 3].mean())

    quiet = greedy_transplant(tgt, src, score, parts=["attn", "mlp"], runtime=_rt(1, progress=False))
    assert capsys.readouterr().err == ""
    loud = greedy_transplant(tgt, src, score, parts=["attn", "mlp"], runtime=_rt(1, progress=True))
    err = capsys.readouterr().err
    assert "transplant search" in err and "eval" in err
    assert torch.equal(_values(quiet), _values(loud)) and quiet.chosen == loud.chosen
