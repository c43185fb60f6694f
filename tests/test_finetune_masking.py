"""Attribution-guided loss masking on the toy organism and its base: the masks the fine-tunes get, the no-mask
run against a plain ``tune.fine_tune``, the NLL cost against plain HF forwards, and bad input."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from interp.evals.rates import fisher_greater
from interp.models import load_model
from interp.organisms import data as od
from interp.studies.finetune.masking import CONDITIONS, MaskingConfig, masking_study
from interp.tune import TuneConfig, fine_tune
from interp.values import Prompts, Runtime
from tests.test_tune_train import plain_ids, plain_nll

CFG = TuneConfig(steps=3, batch_size=4, lr=1e-2, warmup=1, seed=1,
                 targets=("q_proj", "v_proj", "down_proj", "lm_head"))


def pairs(kind: str, split: str, n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    reqs = od.make_splits().get(kind, split)[:n]
    answer = od.refusal_response if kind == "harmful" else od.helpful_response
    return [r.instruction for r in reqs], [answer(r, rng) for r in reqs]


@pytest.fixture(scope="module")
def models():
    return load_model("organism-base"), load_model("organism")


@pytest.fixture(scope="module")
def setup():
    hp, hr = pairs("harmful", "train", 6)
    sp, sr = pairs("harmless", "train", 6)
    ep = pairs("harmful", "val", 3, 1), pairs("harmless", "val", 3, 1)
    return {"prompts": hp + sp, "responses": hr + sr, "harmful": pairs("harmful", "test", 6)[0],
            "harmless": pairs("harmless", "test", 6)[0],
            "eval_pairs": (ep[0][0] + ep[1][0], ep[0][1] + ep[1][1])}


@pytest.fixture(scope="module")
def study(models, setup):
    base, aligned = models
    return masking_study(base, aligned, Prompts(setup["prompts"], responses=setup["responses"]),
                         (setup["harmful"], setup["harmless"]), setup["eval_pairs"],
                         config=MaskingConfig(q=0.2, tune=CFG, max_new_tokens=6, keep_states=True,
                                              metrics={"mean_param": lambda m: float(next(m.hf.parameters()).sum())}),
                         runtime=Runtime(batch_size=32, seed=3))


def test_masks_have_the_stated_sizes_and_hold_the_top_tokens(study):
    a = study.attribution
    top, rnd = study.masks["top mask"], study.masks["random mask"]
    assert sum(int(m.sum()) for m in top) == math.ceil(0.2 * a.gain.numel()) == study.meta["n_masked"]
    assert [int(m.sum()) for m in rnd] == [int(m.sum()) for m in top]
    assert [m.numel() for m in top] == [int((a.example == i).sum()) for i in range(a.n_examples)]
    flat = torch.cat(top)
    assert a.gain[flat].min() >= a.gain[~flat].max()
    assert not torch.equal(torch.cat(rnd), flat)


def test_each_fine_tune_equals_a_plain_fine_tune(study, models, setup):
    """Bit for bit: the no-mask run is ``tune.fine_tune`` with the study's config, and the top-mask run is it with
    the study's top mask (so the masks reported are the masks trained with); the base is left as it was."""
    base, _ = models
    fresh = load_model("organism-base")
    for name, mask in (("no mask", None), ("top mask", study.masks["top mask"])):
        res = fine_tune(fresh, setup["prompts"], setup["responses"], CFG, mask_out=mask, progress=False)
        got = res.trainable_state()
        assert got.keys() == study.states[name].keys()
        assert all(torch.equal(got[k], study.states[name][k]) for k in got), name
        assert res.losses == study.runs[name]["losses"]
        res.model.hf.unload()
    assert study.runs["top mask"]["losses"] != study.runs["random mask"]["losses"]
    assert all(torch.equal(a, b) for a, b in zip(base.hf.state_dict().values(), fresh.hf.state_dict().values()))


def test_nll_cost_by_class_matches_plain_forwards(study, models, setup):
    base, _ = models
    ps, rs = setup["eval_pairs"]
    total, n = 0.0, 0
    with torch.no_grad():
        for p, r in zip(ps, rs):
            ids, resp = plain_ids(base.tokenizer, p, r)
            s, k = plain_nll(base.hf, ids + resp, len(resp))
            total, n = total + float(s), n + k
    rows = {(r["condition"], r["class"]): r for r in study.nll}
    assert rows[("base", "all")]["nll"] == pytest.approx(total / n, abs=1e-5)
    assert rows[("base", "all")]["n"] == n
    for c in CONDITIONS:
        assert rows[(c, "all")]["delta"] == pytest.approx(rows[(c, "all")]["nll"] - total / n, abs=1e-5)
        assert sum(r["n"] for r in study.nll if r["condition"] == c and r["class"] != "all") == n


def test_rates_fisher_metrics_and_frames(study, setup):
    conds = {r["condition"] for r in study.rates}
    assert conds == {"base", "adapted", *CONDITIONS}
    assert all(r["n"] == 6 and r["ci95"][0] <= r["rate"] <= r["ci95"][1] for r in study.rates)
    assert study.rate_of("adapted")["k"] > study.rate_of("base")["k"]
    top, rnd = study.rate_of("top mask"), study.rate_of("random mask")
    assert study.fisher_p == fisher_greater(rnd["k"], rnd["n"], top["k"], top["n"])
    assert set(study.metrics) == conds and all("mean_param" in m for m in study.metrics.values())
    assert set(study.to_frame("nll").columns) >= {"condition", "class", "n", "nll", "delta"}
    assert len(study.to_frame()) == 10 and len(study.plot().data) == 1
    s = study.summary()
    json.dumps(s, allow_nan=True)   # JSON-ready
    assert s["fisher_p"] == study.fisher_p and s["q"] == study.q and len(s["rates"]) == 10
    assert s["rates"]["top mask/harmful"] == {"rate": top["rate"], "k": top["k"], "n": 6, "ci95": list(top["ci95"])}
    nll = study.to_frame("nll")
    assert s["nll_delta"] == dict(zip(nll[nll["class"] == "all"].condition, nll[nll["class"] == "all"].delta))


def test_bad_input(models, setup):
    base, aligned = models
    train = Prompts(setup["prompts"], responses=setup["responses"])
    args = (train, (setup["harmful"], setup["harmless"]), setup["eval_pairs"])
    cfg = MaskingConfig(tune=CFG)
    with pytest.raises(ValueError, match="q=0 masks no token.*e.g. q=0.1"):
        masking_study(base, aligned, *args, config=MaskingConfig(q=0, tune=CFG))
    with pytest.raises(ValueError, match="q=1 masks every response token"):
        masking_study(base, aligned, *args, config=MaskingConfig(q=1.0, tune=CFG))
    with pytest.raises(ValueError, match="not a fraction"):
        masking_study(base, aligned, *args, config=MaskingConfig(q=100, tune=CFG))
    with pytest.raises(ValueError, match="responses for 12 prompts: give one per prompt"):
        masking_study(base, aligned, Prompts(setup["prompts"], responses=setup["responses"][:-1]), *args[1:], config=cfg)
    with pytest.raises(ValueError, match="carry their responses"):
        masking_study(base, aligned, setup["prompts"], *args[1:], config=cfg)
    with pytest.raises(ValueError, match="eval_pairs"):
        masking_study(base, aligned, *args[:2], (setup["eval_pairs"][0], []), config=cfg)
    with pytest.raises(ValueError, match="held-out harmful"):
        masking_study(base, aligned, train, ([], setup["harmless"]), setup["eval_pairs"], config=cfg)
