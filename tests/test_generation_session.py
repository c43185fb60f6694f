"""``steering.GenerationSession``: one model, one set of prompts, one batch size, many edits.

The session encodes the prompts once and runs the plain prompt pass once (the prefix before the post-instruction
tokens and the block states below an addition's layer), and each of its generations equals a plain
``steering.generate`` token for token. The keywords ``generate`` no longer takes fail with the replacement named,
instead of reaching HF ``generate``."""

from __future__ import annotations

import re

import pytest
import torch

import interp
import steering
import steering.generation as generation
from interp import forward
from interp.studies.kit.scoring import ablation
from tests.conftest import chat_case


def _conditions(m):
    g = torch.Generator().manual_seed(5)
    r = torch.nn.functional.normalize(torch.randn(m.d_model, generator=g), dim=0)
    return [(steering.AddVector(5 * r, layers=1),), (steering.AddVector(-3 * r, layers=1, sites="resid_post"),),
            (), (ablation(r, "post_instruction"),), (ablation(r, "all"),)]


def _counting(monkeypatch, module, name, calls):
    inner = getattr(module, name)

    def spy(*args, **kwargs):
        calls[name] = calls.get(name, 0) + 1
        return inner(*args, **kwargs)
    monkeypatch.setattr(module, name, spy)


def test_the_session_encodes_once_runs_one_plain_pass_and_equals_plain_generate(monkeypatch):
    m, prompts = chat_case("llama")
    run = interp.Runtime(batch_size=3, progress=False)
    want = [steering.generate(m, prompts, *c, max_new_tokens=8, runtime=run) for c in _conditions(m)]
    calls: dict[str, int] = {}
    _counting(monkeypatch, forward, "prepare", calls)
    for name in ("prompt_prefixes", "prompt_states"):
        _counting(monkeypatch, generation, name, calls)
    session = steering.GenerationSession(m, prompts, run)
    got = [session.generate(*c, max_new_tokens=8) for c in _conditions(m)]
    again = [session.generate(*c, max_new_tokens=8) for c in _conditions(m)]
    each = session.generate_each(_conditions(m), stack=2, max_new_tokens=8)
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    assert [g.texts for g in got] == [g.texts for g in again] == [g.texts for g in each] == [g.texts for g in want]
    assert calls == {"prepare": 1, "prompt_states": 1}      # the prefix came from the same plain pass
    assert session.plain_passes == 1
    # the generations differ, so the equalities above compare edited runs, not copies of one
    assert len({tuple(map(tuple, g.token_ids)) for g in want}) > 2


def test_generate_takes_prompts_runtime_sampling_and_a_session():
    m, prompts = chat_case("llama")
    raw = steering.generate(m, interp.Prompts(prompts, chat=False), max_new_tokens=4,
                            runtime=interp.Runtime(progress=False))
    assert raw.formatted == prompts                          # chat=False travels with the prompts
    session = steering.GenerationSession(m, prompts, interp.Runtime(batch_size=2, progress=False), first_logits=True)
    via = steering.generate(m, prompts, max_new_tokens=4, session=session)
    assert via.token_ids == session.generate(max_new_tokens=4).token_ids and via.first_logits is not None
    with pytest.raises(ValueError, match="session belongs to another"):
        steering.generate(m, prompts[:2], max_new_tokens=4, session=session)
    with pytest.raises(ValueError, match="top_k"):
        steering.Sampling(top_k=-1)
    with pytest.raises(TypeError, match="do_sample"):
        steering.Sampling(do_sample="yes")


@pytest.mark.parametrize("old,value,new", [
    ("batch_size", 16, "runtime=interp.Runtime(batch_size="), ("seed", 1, "runtime=interp.Runtime(seed="),
    ("progress", False, "runtime=interp.Runtime(progress="), ("chat", False, "interp.Prompts(texts, chat="),
    ("system", "s", "interp.Prompts(texts, system="), ("do_sample", True, "sampling=steering.Sampling(do_sample="),
    ("temperature", 0.5, "sampling=steering.Sampling(temperature="), ("top_k", 5, "steering.Sampling(top_k="),
    ("stop_at_eos", False, "steering.Sampling(stop_at_eos="), ("first_logits", True, "GenerationSession("),
    ("drop_finished", False, "GenerationSession("), ("prepared", None, "GenerationSession("),
    ("prompt_prefix", None, "GenerationSession("), ("prompt_resume", None, "GenerationSession("),
    ("backend", "torch", "steering.apply"),
])
def test_an_old_keyword_names_its_replacement(old, value, new):
    m, prompts = chat_case("llama")
    session = steering.GenerationSession(m, prompts, interp.Runtime(progress=False))
    for call in (lambda: steering.generate(m, prompts, max_new_tokens=2, **{old: value}),
                 lambda: session.generate(max_new_tokens=2, **{old: value}),
                 lambda: session.generate_each([()], max_new_tokens=2, **{old: value}),
                 lambda: steering.generate_and_judge(m, prompts, max_new_tokens=2, **{old: value})):
        with pytest.raises(TypeError, match=rf"no longer takes .*{old}= \(moved into .*{re.escape(new)}"):
            call()
