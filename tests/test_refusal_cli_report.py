"""``interp refusal``'s command line (help, reruns after bad input, columns) and its report's figures."""

from __future__ import annotations

import re

import pytest
import torch

from interp.studies.refusal import RefusalConfig, run_refusal
from interp.testing.tiny import tiny_model

from .test_refusal_pipeline import _files


def _refusal_parser():
    from interp.cli.main import build_parser

    ap = build_parser()
    sub = next(a for a in ap._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices["refusal"]


def test_every_refusal_option_has_help_with_its_default():
    """Each option's entry in ``interp refusal --help`` has text and states its default."""
    p = _refusal_parser()
    text = p.format_help()
    entries = re.split(r"\n  (?=-)", text.split("options:", 1)[1])
    by_option = {e.split()[0].rstrip(","): " ".join(e.split()) for e in entries if e.strip()}
    options = [a for a in p._actions if a.option_strings and "-h" not in a.option_strings]
    assert len(options) >= 20
    for a in options:
        flag = a.option_strings[-1]
        entry = by_option.get(flag)
        assert entry, f"{flag} missing from --help"
        assert a.help and len(a.help) > 10, f"{flag} has no help text"
        assert "(default:" in entry, f"{flag}: no default stated in --help: {entry!r}"
        if isinstance(a.default, (int, float)) and not isinstance(a.default, bool):
            assert f"(default: {a.default})" in entry, f"{flag}: help states another default than {a.default}"


def test_failed_run_leaves_no_marker_that_blocks_the_rerun(tmp_path):
    """A run that fails on a bad ``--column`` leaves no run.json: the corrected rerun needs no --overwrite."""
    m = tiny_model("llama")
    h, s = _files(tmp_path)
    out = tmp_path / "r"
    with pytest.raises(ValueError, match="column 'nope' does not exist"):
        run_refusal(RefusalConfig.from_flat(model="organism", harmful=str(h), harmless=str(s), column="nope"), out, model=m)
    assert not (out / "run.json").exists()
    res = run_refusal(RefusalConfig.from_flat(model="organism", harmful=str(h), harmless=str(s), column="goal", max_new_tokens=2),
                      out, model=m)
    assert (out / "run.json").exists() and "found_direction" in res.metrics
    # a failed run into another run's folder leaves that run's marker and outputs as they were
    before = (out / "run.json").read_text()
    with pytest.raises(ValueError, match="column 'nope' does not exist"):
        run_refusal(RefusalConfig.from_flat(model="organism", harmful=str(h), harmless=str(s), column="nope"), out, model=m,
                    overwrite=True)
    assert (out / "run.json").read_text() == before and (out / "report.html").exists()


def test_harmless_column_is_detected_from_its_own_file(tmp_path):
    """``--column goal`` names the harmful file's column only: the harmless file's is detected on its own."""
    m = tiny_model("llama")
    h, s = _files(tmp_path)
    res = run_refusal(RefusalConfig.from_flat(model="organism", harmful=str(h), harmless=str(s), column="goal", max_new_tokens=2),
                      tmp_path / "r1", model=m)
    assert "found_direction" in res.metrics
    # the built-in harmless set beside a harmful CSV with --column: a model that is not the toy organism gets the
    # realistic set (and the borderline set for over-refusal)
    res = run_refusal(RefusalConfig.from_flat(model="organism", harmful=str(h), column="goal", max_new_tokens=2, n_train=8, n_val=4,
                                              n_test=4), tmp_path / "r2", model=m)
    assert res.metrics["data"]["harmless"] == "interp/data/prompts/harmless_realistic.jsonl"
    assert "borderline" in res.metrics["data"]
    with pytest.raises(ValueError, match="--harmless-column"):
        run_refusal(RefusalConfig.from_flat(model="organism", harmful=str(h), harmless=str(s), harmless_column="goal"),
                    tmp_path / "r3", model=m)


def _synthetic_result(tmp_path):
    """A typed RefusalResult for a 4-layer model with 2 positions, layer 0's candidates zero (the embedding)."""
    from interp.studies.refusal import (
        Candidates,
        Evaluation,
        RefusalResult,
        RefusalTokens,
        Scores,
        Selection,
        Subspaces,
    )

    g = torch.Generator().manual_seed(0)
    raw = torch.randn(4, 2, 8, generator=g)
    raw[0] = 0.0
    cand = Candidates(raw, torch.randn(5, 4, 2, 8, generator=g), torch.randn(5, 4, 2, 8, generator=g), [0, 1, 2, 3],
                      [f"blocks.{i}.hook_resid_pre" for i in range(4)], ["<|end|>", "<|assistant|>"], [], "h")
    scores = Scores(torch.tensor([[5.0, 5.0], [2.0, 1.0], [-4.0, -6.0], [0.0, -1.0]]),
                    torch.tensor([[-6.0, -6.0], [-1.0, 1.0], [3.0, 5.0], [4.0, 2.0]]),
                    torch.tensor([[0.0, 0.0], [0.05, 0.2], [0.01, 0.02], [0.5, 1.0]]), 5.0, -6.0)
    sel = Selection(True, {"kl_threshold": 0.1, "prune_layer_fraction": 0.2, "induce_threshold": 0.0},
                    {"layer": 6, "kl": 5, "induce": 5, "bypass": 6, "all": 2, "of": 8},
                    {"harmful": 5.0, "harmless": -6.0}, 2, 1, 2, -1, "<|assistant|>", -6.0, 5.0, 0.02)
    ev = Evaluation({"harmful/baseline": ["i cannot"]}, {"harmful/baseline": 1.0, "harmful/ablation": 0.0},
                    {"harmful/baseline": 5.0, "harmful/ablation": -6.0},
                    {"max_abs_logit_diff": 0.0, "rel_logit_diff": 0.0, "exact_architecture": True}, {})
    sub = Subspaces(["a", "b"], [1, 2, 3], [0.0, 0.0, 0.0], [-6.0, -5.0, -5.5], [1.0, 1.0, 0.9], [5.0, 4.8, 4.1])
    return RefusalResult(tmp_path, tokens=RefusalTokens([1], ["i"], 1.0, 0.0), candidates=cand, scores=scores,
                         selection=sel, evaluation=ev, subspaces=sub, direction=object())


def test_report_summary_counts_candidates_not_layers(tmp_path):
    """The filter line reads as counts of layer x position candidates, never as a layer number."""
    from interp.studies.refusal.report import refusal_report

    html = refusal_report(_synthetic_result(tmp_path), "m", "llama", 4)
    assert "layer 6" not in html
    assert "2 of 8 (layer x position candidates)" in html and "depth (layer &lt; 3): 6 of 8" in html


def _colour_at(trace, value):
    stops = trace.colorscale
    t = (value - trace.zmin) / (trace.zmax - trace.zmin)
    return min(stops, key=lambda s: abs(s[0] - t))[1]


def test_candidate_heatmaps_share_one_colour_meaning(tmp_path):
    """Better for selection is the same colour in all three maps; white sits at each filter's threshold;
    colourbars lie under their panels (titled there), not over the next panel's axis."""
    from interp.studies.refusal.report import _candidate_sections
    from interp.viz.refusal import BETTER, NEUTRAL

    fig = dict(_candidate_sections(_synthetic_result(tmp_path)))["Candidate scores"]
    maps = [t for t in fig.data if t.type == "heatmap"]
    bypass, induce, kl = maps
    assert _colour_at(bypass, bypass.zmin) == BETTER      # low bypass is better
    assert _colour_at(induce, induce.zmax) == BETTER      # high induce is better
    assert _colour_at(kl, kl.zmin) == BETTER              # low KL is better
    for trace, mid in ((bypass, 5.0), (induce, 0.0), (kl, 0.1)):
        assert _colour_at(trace, mid) == NEUTRAL
        assert trace.colorbar.orientation == "h" and trace.colorbar.y < 0 and trace.colorbar.title.text
    assert fig.layout.yaxis2.title.text is None and fig.layout.yaxis3.title.text is None


def test_cosine_map_explains_the_empty_layer_0(tmp_path):
    from interp.studies.refusal.report import _candidate_sections

    fig = dict(_candidate_sections(_synthetic_result(tmp_path)))["Cosine similarity of candidates across layers"]
    z = fig.data[0].z
    assert all(v is None for v in z[0]) and z[1][1] == pytest.approx(1.0)
    note = " ".join(a.text for a in fig.layout.annotations)
    assert "layer 0" in note and "embedding" in note


def test_subspace_plot_has_one_axis_per_panel_and_a_random_control(tmp_path):
    from interp.studies.refusal.report import _evaluation_sections

    fig = dict(_evaluation_sections(_synthetic_result(tmp_path)))["Subspace ablation"]
    assert all(getattr(fig.layout[k], "overlaying", None) is None for k in fig.layout if k.startswith("yaxis"))
    ctrl = [t for t in fig.data if "random" in (t.name or "")]
    real = [t for t in fig.data if "refusal direction" in (t.name or "")]
    assert len(ctrl) == 2 and len(real) == 2 and all(list(c.x) == list(real[0].x) for c in ctrl)
    assert fig.layout.xaxis.matches == "x2" or fig.layout.xaxis2.matches == "x"  # shared, aligned x axes


def test_cli_run_prints_every_stage_and_the_summary(tmp_path, capsys):
    """``interp refusal`` end to end on the toy organism: the stage table (in the order the stages ran), the
    summary with the ablation mode used, and the outputs."""
    from interp.cli.main import main

    rc = main(["refusal", "--model", "organism", "--n-test", "8", "--max-new-tokens", "6", "--subspace-rank", "1",
               "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert rc == 0, out
    for stage in ("tokens", "candidates", "estimate", "scores", "selection", "evaluation", "writers", "subspaces",
                  "report"):
        assert re.search(rf"{stage}\s*│\s*done", out), (stage, out)
    assert out.index("estimate") < out.index("evaluation") < out.index("subspaces")
    assert re.search(r"ablated at\s*│\s*all", out) and "direction found" in out, out
    assert (tmp_path / "run" / "report.html").exists() and (tmp_path / "run" / "metrics.json").exists()
