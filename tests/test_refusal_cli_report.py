"""``interp refusal``'s command line (help, reruns after bad input, columns) and its report's figures."""

from __future__ import annotations

import json
import re

import pytest

from interp.testing.tiny import tiny_model
from pipelines.refusal import RefusalConfig, run_refusal


def _refusal_parser():
    from interp_cli.main import build_parser

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


def _files(tmp_path, n=12):
    h = tmp_path / "harm.csv"
    h.write_text("goal,category\n" + "\n".join(f"do bad thing {i},c{i % 2}" for i in range(n)))
    s = tmp_path / "safe.json"
    s.write_text(json.dumps([{"prompt": f"say hello {i}"} for i in range(n)]))
    return h, s


def test_failed_run_leaves_no_marker_that_blocks_the_rerun(tmp_path):
    """A run that fails on a bad ``--column`` leaves no run.json: the corrected rerun needs no --overwrite."""
    m = tiny_model("llama")
    h, s = _files(tmp_path)
    out = tmp_path / "r"
    with pytest.raises(ValueError, match="column 'nope' does not exist"):
        run_refusal(RefusalConfig.from_flat(harmful=str(h), harmless=str(s), column="nope"), out, model=m)
    assert not (out / "run.json").exists()
    res = run_refusal(RefusalConfig.from_flat(harmful=str(h), harmless=str(s), column="goal", max_new_tokens=2),
                      out, model=m)
    assert (out / "run.json").exists() and "found_direction" in res.metrics
    # a failed run into another run's folder leaves that run's marker and outputs as they were
    before = (out / "run.json").read_text()
    with pytest.raises(ValueError, match="column 'nope' does not exist"):
        run_refusal(RefusalConfig.from_flat(harmful=str(h), harmless=str(s), column="nope"), out, model=m,
                    overwrite=True)
    assert (out / "run.json").read_text() == before and (out / "report.html").exists()


def test_harmless_column_is_detected_from_its_own_file(tmp_path):
    """``--column goal`` names the harmful file's column only: the harmless file's is detected on its own."""
    m = tiny_model("llama")
    h, s = _files(tmp_path)
    res = run_refusal(RefusalConfig.from_flat(harmful=str(h), harmless=str(s), column="goal", max_new_tokens=2),
                      tmp_path / "r1", model=m)
    assert "found_direction" in res.metrics
    # the built-in harmless set beside a harmful CSV with --column
    res = run_refusal(RefusalConfig.from_flat(harmful=str(h), column="goal", max_new_tokens=2, n_train=8, n_val=4,
                                              n_test=4), tmp_path / "r2", model=m)
    assert res.metrics["data"]["harmless"].startswith("interp/data/prompts/organism_harmless")
    with pytest.raises(ValueError, match="--harmless-column"):
        run_refusal(RefusalConfig.from_flat(harmful=str(h), harmless=str(s), harmless_column="goal"),
                    tmp_path / "r3", model=m)
