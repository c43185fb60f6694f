"""benchmarks/bench_heretic.py's own parts: the between-models KL / CE is the refusal job's definition, heretic's
Pareto rule, the model cache that never reuses another model's folder, and heretic_run.py's refusals of bad input.
(heretic itself runs in its own environment; its run is a benchmark, not a test.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import steering
from interp.studies.refusal.evaluation import harmless_kl_ce
from interp.testing.tiny import tiny_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import bench_heretic as bh  # noqa: E402

PROMPTS = ["Tell me a story about a cat.", "How do clouds form?", "Name three colours.", "Why is the sky blue?"]


def test_kl_ce_between_models_equals_the_jobs_hooked_measure():
    m = tiny_model("llama")
    d = torch.randn(m.d_model, generator=torch.Generator().manual_seed(0))
    baked = steering.bake(m, d).model                        # the same ablation as weights, in another model
    answers = steering.generate(m, PROMPTS, max_new_tokens=6).texts
    ours = bh.kl_ce(m, baked, PROMPTS, answers, batch_size=3)
    job = harmless_kl_ce(m, PROMPTS, answers, (steering.DirectionalAblation(d),), batch_size=3)
    assert ours["kl_first_token"] > 1e-5                     # the edit moves the first token
    assert ours["kl_first_token"] == pytest.approx(job["kl_first_response_token"], rel=1e-3, abs=1e-7)
    assert ours["ce_base"] == pytest.approx(job["ce_baseline"], rel=1e-5)
    assert ours["ce_edited"] == pytest.approx(job["ce_edited"], rel=1e-4)
    same = bh.kl_ce(m, m, PROMPTS, answers, batch_size=3)
    assert same["kl_first_token"] == pytest.approx(0.0, abs=1e-7) and same["ce_edited"] == same["ce_base"]


def test_pareto_is_herectics_rule():
    rows = [{"index": i, "state": "COMPLETE", "refusals": r, "kl_divergence": kl}
            for i, (r, kl) in enumerate([(5, 0.1), (2, 0.5), (2, 0.3), (0, 0.9), (3, 0.05), (0, 1.2)])]
    rows.append({"index": 9, "state": "FAIL", "refusals": None, "kl_divergence": None})
    assert [t["index"] for t in bh.pareto(rows)] == [3, 2, 4]


def test_heretic_gets_whole_train_and_val_splits_and_ours_the_jobs_test_split():
    from interp.studies.kit.config import DataConfig
    from interp.studies.kit.prompt_sets import load_refusal_data

    got, job = bh.test_data(), load_refusal_data("smollm2-aligned", DataConfig())
    for what in ("harmful", "harmless"):
        g, j = getattr(got, what), getattr(job, what)
        assert g["test"].instructions == j["test"].instructions          # the same held-out prompts as the job
        assert len(g["train"]) > len(j["train"]) and len(g["val"]) >= len(j["val"])
        assert not set(g["test"].instructions) & (set(g["train"].instructions) | set(g["val"].instructions))
    assert got.borderline.instructions == job.borderline.instructions


def test_model_folder_refuses_a_folder_of_another_model(tmp_path, monkeypatch):
    monkeypatch.setattr(bh, "RUNS", tmp_path)
    other = tmp_path / "models" / "smollm2-aligned"
    other.mkdir(parents=True)
    (other / bh.STAMP).write_text(json.dumps({"name": "gemma3-aligned"}))
    with pytest.raises(FileExistsError, match="holds 'gemma3-aligned'"):
        bh.model_folder("smollm2-aligned")
    (other / bh.STAMP).unlink()
    with pytest.raises(FileExistsError, match="without interp-source.json"):
        bh.model_folder("smollm2-aligned")


def test_heretic_run_refuses_a_used_folder_and_a_bad_command_line(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import heretic_run

    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "trials.json").write_text("{}")
    with pytest.raises(SystemExit, match="not empty"):
        heretic_run.main([str(tmp_path / "old"), "--", "--model", "x"])
    with pytest.raises(SystemExit, match="usage"):
        heretic_run.main([str(tmp_path / "new"), "--model", "x"])


def _result(model: str, kl: float) -> dict:
    rate = {"rate": 0.5, "k": 1, "n": 2, "ci95": [0.09, 0.91]}
    settings = {"n_startup_trials": 1, "n_trials": 2, "seed": 0, "batch_size": 8, "row_normalization": "full",
                "orthogonalize_direction": True, "system_prompt": "s", "max_response_length": 32}
    rows = [{"trial": "unedited", "harmful": rate, "borderline": rate, "kl_first_token": 0.0},
            {"trial": 2, "heretic_refusals": 1, "heretic_n": 50, "heretic_kl": 0.2, "harmful": rate, "borderline": rate,
             "kl_first_token": kl, "ce_base": 1.0, "ce_edited": 1.5}]
    return {"model": model, "rows": rows, "heretic_seconds": 10.0, "search_seconds": 8.0, "trials": 2,
            "settings": settings, "flags": ["--x"], "machine": "m", "sizes": {}}


def test_results_keep_our_frontier_section_last_and_replace_a_models_rows(tmp_path, monkeypatch):
    md = tmp_path / "RESULTS_frontier.md"
    monkeypatch.setattr(bh, "OUT_MD", md)
    bh.write_results(_result("smollm2-aligned", 0.123))
    md.write_text(md.read_text() + "| our point | 5% |\n")           # the frontier helper's rows
    bh.write_results(_result("gemma3-aligned", 0.456))
    bh.write_results(_result("smollm2-aligned", 0.789))               # a rerun replaces its own section
    text = md.read_text()
    assert text.count("### heretic-llm 1.4 on smollm2-aligned") == 1 and "0.1230" not in text and "0.7890" in text
    assert "0.4560" in text and text.index(bh.OURS) > text.index("on gemma3-aligned")
    assert text.rstrip().endswith("| our point | 5% |")


def test_our_section_replaces_the_placeholder_and_keeps_heretics(tmp_path, monkeypatch):
    from benchmarks import bench_frontier as bf

    md = tmp_path / "RESULTS_frontier.md"
    monkeypatch.setattr(bh, "OUT_MD", md)
    res = _result("smollm2-aligned", 0.123) | {"cpu_seconds": 42.0, "stop_after": 2400.0, "stopped_trials": 1}
    bh.write_results(res)
    assert bh.OURS in md.read_text().split("\n") and "(42 CPU s)" in md.read_text()
    assert "2 completed of 2 trials" in md.read_text() and "2400 s budget (1 trial pruned)" in md.read_text()
    bf.write_side_by_side("smollm2-aligned", ["| point | 1 |"], md)
    bf.write_side_by_side("smollm2-aligned", ["| point | 2 |"], md)    # a rerun replaces its own section
    bh.write_results(_result("smollm2-aligned", 0.456))                 # and heretic's rerun keeps ours
    text = md.read_text()
    assert bh.OURS not in text.split("\n") and "(Left for" not in text
    assert text.count("### Our frontier on smollm2-aligned") == 1 and "| point | 2 |" in text and "| 1 |" not in text
    assert "0.4560" in text and text.startswith("# The refusal-vs-damage frontier")


def test_heretic_run_time_budget_interrupts_like_ctrl_c_and_is_cancelled_after_the_trials():
    import time

    sys.path.insert(0, str(ROOT / "scripts"))
    import heretic_run

    timer = heretic_run.deadline(0.05)
    with pytest.raises(KeyboardInterrupt):
        for _ in range(500):                  # heretic's trials: stopped by the budget, as Ctrl+C stops them
            time.sleep(0.01)
    done = heretic_run.deadline(0.05)
    select, _ = heretic_run._answers(Path("out"), [], done)
    assert select("Which trial do you want to use?", ["", "continue"]) == ""   # the trials are over: cancelled
    time.sleep(0.2)                            # no interrupt arrives after the cancel
    assert not done.is_alive() and heretic_run.deadline(None) is None and timer.finished.is_set()
