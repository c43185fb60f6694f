"""The crosscoder diffing study end to end on two tiny random models (a model and a perturbed copy): classes,
chosen latents, matched random draws and the steering conditions with their intervals and tests."""

from __future__ import annotations

import copy
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from interp.studies.finetune.crossdiff import CrossDiffConfig, crossdiff_study, load_pair, training_prompts
from interp.studies.kit.prompt_sets import PromptSplit, RefusalData
from interp.testing.tiny import tiny_model
from interp.values import Runtime
from sae.crosscoder import capture_paired, train_crosscoder
from sae.train_config import TrainConfig


def _data() -> RefusalData:
    def split(tag: str, n: int) -> PromptSplit:
        return PromptSplit([f"{tag} request {i}: {'please ' * (i % 3)}do it" for i in range(n)])

    return RefusalData(harmful={s: split(f"bad {s}", 4) for s in ("train", "val", "test")},
                       harmless={s: split(f"good {s}", 4) for s in ("train", "val", "test")}, source={})


def _tuned_copy(base, name: str):
    tuned = copy.deepcopy(base)
    with torch.no_grad():
        for p in tuned.hf.model.layers[1].parameters():
            p.add_(0.1 * torch.randn_like(p))
    tuned.name = name
    return tuned


def _study(base, tuned):
    site = "blocks.1.hook_resid_post"
    prompts = [f"training prompt {i} {'word ' * (i % 7)}" for i in range(40)]
    pairs = capture_paired((base, tuned), prompts, site, runtime=Runtime(batch_size=8, progress=False))
    res = train_crosscoder(pairs, TrainConfig(arch="crosscoder_batchtopk", d_sae=64, k=4, total_tokens=40 * 64,
                                              batch_size=64, lr=3e-3, progress=False))
    x = pairs.tensor[:, 0][pairs.kept(pairs.sites, "exclude")]
    d = base.d_model
    cfg = CrossDiffConfig(n_steer=3, n_random=2, strengths=(1.0,), max_new_tokens=3)
    xs = (x[:, :d], x[:, d:])
    return crossdiff_study((base, tuned), res.sae, xs, _data(), config=cfg), res.sae, xs


def _check(st) -> None:
    assert len(st.chosen) == 3 and len(st.meta["chosen_classes"]) == 3
    assert all(len(set(dr) & set(st.chosen)) == 0 and len(dr) == 3 for dr in st.meta["draws"])
    conds = [r["condition"] for r in st.rates]
    assert conds[:2] == ["tuned", "tuned, chosen latents subtracted"] and "base, chosen latents added x1" in conds
    assert len(conds) == 2 + 2 + 1 + 1 + 2
    assert all(0 <= r["rate"] <= 1 and r["ci95"][0] <= r["rate"] <= r["ci95"][1] for r in st.rates)
    assert all(0 <= r["degenerate"] <= r["n"] and 0 <= r["non_english"] <= r["n"] for r in st.rates)
    assert [t["hypothesis"] for t in st.meta["tests"]] == ["random refuse more", "chosen refuse more"]
    assert st.summary()["chosen"] == st.chosen and len(st.to_frame()) == len(st.rates)


def test_crossdiff_study_on_tiny_models(tmp_path):
    """The study, then a rerun that reads every steering row back from its rows file (the saved ``k`` of one row
    changed to show it is read, not recomputed) and one whose key differs (other draws), which recomputes."""
    from interp.io import read_json, write_json

    base = tiny_model("llama", seed=0)
    tuned = _tuned_copy(base, "tiny-llama-tuned")
    st, cc, xs = _study(base, tuned)
    _check(st)
    rows = tmp_path / "rows.json"
    cfg = CrossDiffConfig(n_steer=3, n_random=2, strengths=(1.0,), max_new_tokens=3, rows_file=str(rows))
    first = crossdiff_study((base, tuned), cc, xs, _data(), config=cfg)
    assert [r["k"] for r in first.rates] == [r["k"] for r in st.rates]
    saved = read_json(rows)
    assert set(saved["rows"]) == {r["condition"] for r in st.rates}
    saved["rows"]["tuned"]["k"] = 999
    saved["rows"]["base"]["k"] = 999
    del saved["rows"]["base"]["degenerate"]  # a row saved before the answer checks existed is recomputed
    write_json(rows, saved)
    again = crossdiff_study((base, tuned), cc, xs, _data(), config=cfg)
    assert again.rates[0]["k"] == 999 and [r["k"] for r in again.rates[1:]] == [r["k"] for r in st.rates[1:]]
    more = crossdiff_study((base, tuned), cc, xs, _data(), config=replace(cfg, subtract=(1.0, 0.5)))
    conds = [r["condition"] for r in more.rates]
    assert more.rates[0]["k"] == 999 and len(conds) == len(st.rates) + 3
    assert conds[4:7] == ["tuned, chosen latents subtracted x0.5"] + [
        f"tuned, random latents subtracted x0.5 (draw {i})" for i in range(2)]
    assert [t["condition"] for t in more.meta["tests"]][:2] == ["tuned, chosen latents subtracted",
                                                                "tuned, chosen latents subtracted x0.5"]
    assert all(t["random"].endswith("/8") for t in more.meta["tests"])
    # ablation: the chosen and the random latents taken out token by token through the "same"-inputs view
    abl = crossdiff_study((base, tuned), cc, xs, _data(), config=replace(cfg, ablate=True))
    conds = [r["condition"] for r in abl.rates]
    assert abl.rates[0]["k"] == 999 and conds[2 + 2:2 + 2 + 5] == ["tuned, chosen latents ablated"] + [
        f"tuned, random latents ablated (draw {i})" for i in range(2)] + [
        f"tuned, norm-matched random latents ablated (draw {i})" for i in range(2)]
    assert [(t["condition"], t["control"]) for t in abl.meta["tests"]][1:3] == [
        ("tuned, chosen latents ablated", "random"), ("tuned, chosen latents ablated", "norm-matched random")]
    # a saved row whose latents differ from this run's draw is recomputed, not reused
    saved = read_json(rows)
    saved["rows"]["tuned, random latents ablated (draw 0)"].update(k=999, latents=[0, 1, 2])
    write_json(rows, saved)
    redo = crossdiff_study((base, tuned), cc, xs, _data(), config=replace(cfg, ablate=True))
    assert [r["k"] for r in redo.rates] == [r["k"] for r in abl.rates]
    from interp.studies.finetune.crossdiff import _conditions
    from sae.edits import LatentAblation

    edits = {lab["condition"]: e for lab, _, _, e in _conditions((base, tuned), cc.view(1), st.chosen, [1.0] * 3,
                                                                st.meta["draws"], _data(), replace(cfg, ablate=True),
                                                                cc.view(1, inputs="same"))}
    (ab,) = edits["tuned, chosen latents ablated"]
    assert isinstance(ab, LatentAblation) and ab.latents == st.chosen and ab.sae.cfg.meta["view_inputs"] == "same"
    other = crossdiff_study((base, tuned), cc, xs, _data(), config=cfg, runtime=Runtime(seed=1))
    assert other.rates[0]["k"] == st.rates[0]["k"] and read_json(rows)["key"]["draws"] == other.meta["draws"]


def test_a_base_without_the_tunes_chat_template_gets_it(monkeypatch):
    """The Gemma pair's shape (gemma3-270m ships no chat template; gemma3-aligned's LoRA brings one): the crosscoder
    refuses the pair as loaded, load_pair gives the base the tune's template, and the study runs; the report names
    the pair, and the script's defaults keep the SmolLM2 run's command."""
    base = tiny_model("gemma3_text", seed=0)
    tuned = _tuned_copy(base, "tiny-gemma3-tuned")
    base.tokenizer = copy.deepcopy(base.tokenizer)
    base.tokenizer.chat_template = None
    with pytest.raises(ValueError, match="different chat templates"):
        capture_paired((base, tuned), ["a prompt"], "blocks.1.hook_resid_post")
    b, t = load_pair(base, tuned)
    assert base.tokenizer.chat_template is None and b.tokenizer.chat_template == t.tokenizer.chat_template
    assert b.hf is base.hf and t is tuned
    st, cc, xs = _study(b, t)
    _check(st)
    assert st.meta["site"] == "blocks.1.hook_resid_post"

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import crossdiff_report as cr
    from benchmarks import study_crossdiff as sc
    from sae.model import SAE, SAEConfig

    smol, gemma = sc.parse_args([]), sc.parse_args(["--tuned", "gemma3-aligned", "--prompts", "700"])
    assert (smol.base, smol.layer, smol.pair_flags) == ("smollm2-base", 19, "")
    assert (gemma.base, gemma.layer, gemma.pair_flags) == ("gemma3-270m", 11, " --tuned gemma3-aligned")
    assert sc.parse_args(["--drop-massive", "--delta-only"]).pair_flags == " --drop-massive --delta-only"
    with pytest.raises(SystemExit):  # a crosscoder on edited tokens cannot steer the models
        sc.parse_args(["--drop-massive"])
    args = sc.parse_args(["--tuned", "gemma3-aligned", "--base", b.name, "--n-random", "2"])
    args.tuned = t.name
    sae = SAE(SAEConfig(b.d_model, 32, arch="topk", k=4, site="blocks.1.hook_resid_post"), seed=0)
    fit = {"fvu": 0.1, "l0": 4.0, "dead": 0.0, "steps": 40, "seconds": 1.0}
    text = cr.report(args, st, cc, fit, (sae, list(range(10))), torch.randn(b.d_model), len(xs[0]), 40, 1.0, 0.5)
    assert text.startswith(cr.heading(t.name)) and f"{b.name} and {t.name} at `blocks.1.hook_resid_post`" in text
    assert "smollm2" not in text and f"--tuned gemma3-aligned --base {b.name}" in text
    delta = cr.delta_section({"BatchTopK": cc}, xs, "cmd", (b.name, t.name))
    assert delta.startswith(cr.delta_heading(t.name)) and f"FVU tuned ({t.name})" in delta
    assert cr.delta_section({"BatchTopK": cc}, xs, "cmd", (b.name, t.name), ", v").startswith(cr.delta_heading(t.name + ", v"))
    row = next(line for line in delta.split("\n") if line.startswith("| BatchTopK |"))
    assert "without the massive dimensions" in delta and len(row.split("|")) == 8
    assert "latents fire on these tokens; their ratios' 1 / 5 / 25 / 50 / 75 / 95 / 99% quantiles" in delta
    planted = torch.randn(100, 8)
    planted[:, 3] += 500.0
    assert cr.massive(planted).tolist() == [i == 3 for i in range(8)]


def test_training_prompts_hold_out_the_judged_prompts():
    from interp.studies.kit.prompt_sets import load_refusal_data

    data = load_refusal_data("smollm2-aligned")
    ps = training_prompts(data, 200, seed=0)
    held = set(data.harmful["test"].instructions) | set(data.harmless["val"].instructions)
    assert len(ps) == len(set(ps)) == 200 and not held & set(ps)
    assert ps == training_prompts(data, 200, seed=0) != training_prompts(data, 200, seed=1)
    with pytest.raises(ValueError, match="outside the val/test splits"):
        training_prompts(data, 10 ** 6)
