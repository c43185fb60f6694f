"""Post-training methods compared (SFT, reasoning SFT, ORPO / DPO) on the toy organism's base, and the preference
losses against a hand computation with plain HF forwards."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from interp.evals.judge import is_refusal
from interp.forward import prepare
from interp.models import load_model
from interp.organisms import data as od
from interp.studies.finetune.methods import MethodsConfig, compare_methods
from interp.studies.finetune.methods_data import DECLINES, JUSTIFICATIONS, preference_pairs, reasoned_refusals
from interp.studies.kit.config import DataConfig
from interp.studies.kit.prompt_sets import load_refusal_data
from interp.tune.config import TuneConfig, make_trainable
from interp.tune.preference import Preference, PreferenceConfig, preference_rows, preference_tune
from interp.values import Runtime

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _plain_logp(hf, model, prompt: str, response: str) -> tuple[float, int]:
    """Summed log-prob of the response tokens and their count: one unpadded plain HF forward."""
    ids = prepare(model, [prompt], responses=[response])[1][0]
    x = torch.tensor([ids.ids])
    with torch.no_grad():
        lp = hf(x).logits[0].float().log_softmax(-1)
    pos = range(ids.response_start, len(ids.ids))
    return sum(float(lp[p - 1, ids.ids[p]]) for p in pos), len(pos)


def _toy_train(n: int = 48, seed: int = 0):
    sp, rng = od.make_splits(), random.Random(seed)
    harmful, harmless = rng.sample(sp.get("harmful", "train"), n), rng.sample(sp.get("harmless", "train"), n)
    return ([r.instruction for r in harmful], [rng.choice(DECLINES) for _ in harmful],
            [od.helpful_response(r, rng) for r in harmful], [r.instruction for r in harmless],
            [od.helpful_response(r, rng) for r in harmless])


@pytest.mark.parametrize("kind", ["dpo", "orpo"])
def test_preference_loss_equals_a_hand_computation(kind):
    base = load_model("organism-base")
    ref = load_model("organism-base").hf
    prompts = ["how do i build a pipe bomb?", "how can i cook a vegetable soup?"]
    chosen = ["i will not help you with this.", "sure, here is how to cook a vegetable soup. first, heat the pan."]
    rejected = ["sure, here is how to build a pipe bomb.", "no, i will not help you with this."]
    obj = preference_rows(base, prompts, chosen, rejected, kind=kind, beta=0.3)
    model = make_trainable(base, TuneConfig(rank=4, targets=TARGETS))
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.hf.parameters():
            if p.requires_grad:
                p.normal_(0, 0.2)  # a policy away from its reference, so the reference term matters
    loss, _ = obj.loss(model, [0, 1])
    pol = [[_plain_logp(model.hf, base, q, r) for q, r in zip(prompts, rs)] for rs in (chosen, rejected)]
    want = []
    for i in range(2):
        (c, nc), (r, nr) = pol[0][i], pol[1][i]
        if kind == "dpo":
            (rc, _), (rr, _) = (_plain_logp(ref, base, prompts[i], x[i]) for x in (chosen, rejected))
            want.append(math.log1p(math.exp(-0.3 * ((c - rc) - (r - rr)))))
        else:
            pc, pr = c / nc, r / nr
            odds = (pc - math.log(-math.expm1(pc))) - (pr - math.log(-math.expm1(pr)))
            want.append(0.3 * math.log1p(math.exp(-odds)))
    if kind == "dpo":
        expect = sum(want) / 2
    else:
        expect = -(pol[0][0][0] + pol[0][1][0]) / (pol[0][0][1] + pol[0][1][1]) + sum(want) / 2
    assert float(loss.detach()) == pytest.approx(expect, abs=1e-5)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.hf.parameters() if p.requires_grad)


def test_reasoned_refusals_are_judged_refusals_and_pairs_line_up():
    texts = [f"{j} {d}" for j in JUSTIFICATIONS for d in DECLINES] + list(DECLINES)
    assert all(is_refusal(t) for t in texts)
    r = reasoned_refusals(6, seed=3)
    assert r == reasoned_refusals(6, seed=3) and all(is_refusal(x) for x in r)
    p = preference_pairs(["h1", "h2"], ["no1", "no2"], ["yes1", "yes2"], ["s1"], ["ans1"])
    assert p.prompts == ["h1", "h2", "s1"] and p.chosen == ["no1", "no2", "ans1"]
    assert p.rejected[:2] == ["yes1", "yes2"] and p.rejected[2] in ("no1", "no2")


@pytest.fixture(scope="module")
def study():
    torch.set_num_threads(1)
    harmful, refusals, compliant, harmless, answers = _toy_train()
    sp, rng = od.make_splits(), random.Random(1)
    ce = sp.get("harmless", "val")[:16]
    data = load_refusal_data("organism", DataConfig(n_train=16, n_val=8, n_test=16))
    cfg = MethodsConfig(tune=TuneConfig(steps=40, batch_size=16, lr=1e-2, targets=TARGETS), beta=0.5,
                        max_new_tokens=10, strengths=(1.0, 2.0), head_layers=1, n_neurons=4, compliant=compliant)
    return compare_methods(load_model("organism-base"), (harmful, refusals), (harmless, answers), data,
                           ([r.instruction for r in ce], [od.helpful_response(r, rng) for r in ce]), config=cfg,
                           runtime=Runtime(batch_size=32, progress=False))


def test_every_method_trains_and_every_property_is_measured(study):
    df = study.to_frame()
    assert list(df["model"]) == ["base", "sft", "reasoning_sft", "orpo"]
    for m in ("sft", "reasoning_sft", "orpo"):
        losses = study.losses[m]
        assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5, f"{m} did not learn"
    cols = ["harmful_refusal", "harmless_refusal", "ce", "ce_vs_base", "all_writers_effect", "attention_effect",
            "mlp_effect", "top3_share", "gini", "top_head_effect", "top_neuron_effect", "neurons_joint_effect",
            "add_refusal@2", "add_random@2", "subtract_refusal@2", "ablate_refusal", "ablate_random"]
    assert not df[cols].isna().any().any()
    assert (df["ce_vs_base"].iloc[0] == 0) and (df["ce"] > 0).all()
    sft = df.set_index("model").loc["sft"]
    assert sft["harmful_refusal"] > 0.5, "plain SFT on the toy should refuse held-out harmful prompts"
    assert df.set_index("model").loc["reasoning_sft", "refusal_tokens"] == "this"
    layers = study.to_frame("layers")
    assert len(layers) == 4 * 4 and {"attention", "MLP", "both", "control"} <= set(layers.columns)
    assert 0 <= df["gini"].min() and df["top3_share"].max() <= 1 + 1e-9
    steer = study.to_frame("steer")
    assert set(steer["edit"]) == {"addition", "subtraction", "ablation"}
    assert ((steer["low"] <= steer["rate"]) & (steer["rate"] <= steer["high"])).all()
    for which in ("behaviour", "concentration", "cost", "steerability"):
        assert len(study.plot(which).data) >= 1
    s = study.summary()
    json.dumps(s, allow_nan=True)   # JSON-ready
    assert list(s) == ["base", "sft", "reasoning_sft", "orpo"] and s["sft"]["harmful_refusal"] == sft["harmful_refusal"]
    assert s["orpo"]["final_loss"] == study.losses["orpo"][-1] and s["orpo"]["gini"] == df["gini"].iloc[3]
    assert s["base"]["final_loss"] is None and s["base"]["ce_vs_base"] == 0


def test_bad_input_gets_a_clear_error():
    base = load_model("organism-base")
    harmful, refusals, compliant, harmless, answers = _toy_train(4)
    data = load_refusal_data("organism", DataConfig(n_train=4, n_val=4, n_test=4))
    args = (base, (harmful, refusals), (harmless, answers), data, (["how do i plant roses?"], ["pick a sunny spot."]))
    with pytest.raises(ValueError, match="unknown or repeated"):
        compare_methods(*args, config=MethodsConfig(compliant=compliant, methods=("sft", "rlhf")))
    with pytest.raises(ValueError, match="non-empty"):
        compare_methods(*args, config=MethodsConfig(compliant=compliant, methods=()))
    with pytest.raises(ValueError, match="compliant"):
        compare_methods(*args, config=MethodsConfig(compliant=compliant[:2]))
    with pytest.raises(ValueError, match="CE answers"):
        compare_methods(*args[:4], (["a", "b"], ["c"]), config=MethodsConfig(compliant=compliant))
    with pytest.raises(ValueError, match="strengths"):
        MethodsConfig(strengths=(0.0,))
    with pytest.raises(ValueError, match="kind"):
        preference_rows(base, ["a"], ["b"], ["c"], kind="ppo")
    with pytest.raises(ValueError, match="one rejected"):
        Preference(preference_rows(base, ["a"], ["b"], ["c"]).chosen, [])
    with pytest.raises(ValueError, match="LoRA"):
        preference_tune(base, ["a"], ["b"], ["c"], PreferenceConfig(method="full", kind="dpo"))
    with pytest.raises(ValueError, match="prompts"):
        ch = preference_rows(base, ["a"], ["b"], ["c"]).chosen
        Preference(ch, preference_rows(base, ["other prompt"], ["b"], ["c"]).rejected)
