"""Every result: ``.plot()`` a plotly figure, ``.to_frame()`` a DataFrame, ``.summary()`` a JSON-ready dict of
headline numbers, and ``.save()`` / ``.load()`` through the one bundle (``interp.bundle``)."""

from __future__ import annotations

import ast
import importlib
import json
import math
from dataclasses import fields, is_dataclass
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

import interp.bundle
from interp.bundle import Result

from .conftest import REPO

RESULTS = [
    "sae.pages:FeaturePages",
    "interp.look.dla:DLA",
    "interp.look.lens_result:LogitLens",
    "interp.studies.entrainment.effect:EntrainmentEffect",
    "interp.studies.entrainment.heads:HeadSweep",
    "interp.studies.entrainment.heads:HeadAblationCheck",
    "interp.studies.entrainment.heads:ContextAttention",
    "interp.studies.entrainment.study:EntrainmentStudy",
    "interp.studies.refusal.frontier_result:FrontierResult",
    "interp.look.heads:HeadScores",
    "interp.patching.induction:InductionAblation",
    "interp.patching.attribution:Attribution",
    "interp.patching.attribution:AttributionCheck",
    "interp.patching.graph_edits:InterventionResult",
    "interp.patching.graph_result:AttributionGraph",
    "interp.patching.heads:HeadOutputs",
    "interp.patching.masks:MaskResult",
    "interp.patching.neurons:NeuronContrast",
    "interp.patching.neurons:NeuronEffect",
    "interp.patching.neurons:NeuronOverlap",
    "interp.patching.results:Sweep",
    "interp.patching.transplants:TransplantSearch",
    "interp.studies.circuits.refusal:RefusalCircuit",
    "interp.studies.directions.biases:BiasFamily",
    "interp.studies.directions.biases_causal:BiasCausal",
    "interp.studies.directions.biases_compare:CheckpointComparison",
    "interp.studies.directions.biases_overlap:BiasOverlap",
    "interp.studies.directions.similarity:RSAResult",
    "interp.studies.directions.similarity_language:CrossLanguageSimilarity",
    "interp.studies.directions.similarity_typicality:TypicalityResult",
    "interp.studies.directions.traits:TraitScales",
    "interp.studies.directions.traits_analysis:TraitSignature",
    "interp.studies.directions.traits_decompose:Decomposition",
    "interp.studies.directions.traits_steer:TraitSteering",
    "interp.studies.directions.values:ValueVectors",
    "interp.studies.directions.values:LayerSelection",
    "interp.studies.directions.values_steer:SteeringEffect",
    "interp.studies.directions.values_study:ValueStudy",
    "interp.studies.directions.values_study:CrossLingual",
    "interp.studies.finetune.diffing:DiffStudy",
    "interp.studies.finetune.elasticity:ElasticityStudy",
    "interp.studies.finetune.masking:MaskingStudy",
    "interp.studies.finetune.methods:MethodsStudy",
    "interp.studies.finetune.transplant:TransplantStudy",
    "interp.studies.multilingual.language:LanguageGeometry",
    "interp.studies.multilingual.neurons:SafetyNeurons",
    "interp.studies.multilingual.pathways:Pathways",
    "interp.studies.multilingual.retention:Retention",
    "interp.studies.multilingual.updates:RestrictedUpdate",
    "interp.studies.syntax.study:SyntaxRefusal",
    "interp.studies.moe.result:MoeRefusal",
    "interp.studies.refusal.writers:Writers",
    "probes.compare:Signature",
    "probes.graded:GradedDirection",
    "probes.transfer:TransferScores",
    "probes.transfer:ErasureScores",
    "probes.transfer:AblationScores",
    "probes.validation:ProbeScores",
    "probes.validation:DirectionScores",
    "sae.explain.result:LatentExplanations",
    "sae.analysis:LatentRanking",
    "sae.analysis:LatentSeparation",
    "sae.analysis:LatentDiff",
    "sae.probing:SparseProbing",
    "sae.absorption:Absorption",
    "sae.quality:SAEMetrics",
    "sae.quality:CELossRecovered",
    "sae.train_config:TrainResult",
    "sae.transcoder_quality:TranscoderQuality",
    "sae.transcoder_train:TranscoderTraining",
    "sae.clt_train:CLTTraining",
    "sae.crosscoder_analysis:LatentScaling",
    "sae.crosscoder_analysis:CrossDiff",
    "interp.studies.finetune.crossdiff:CrossDiffStudy",
    "steering.baking:BakeResult",
    "steering.generation:Generations",
    "steering.strength:ResidualNorms",
    "steering.sweep:AlphaSweep",
    "interp.studies.kit.stages:RefusalTokens",
    "interp.studies.kit.stages:Candidates",
    "interp.studies.kit.stages:Scores",
    "interp.studies.kit.stages:Selection",
    "interp.studies.refusal.estimate:Estimate",
    "interp.studies.refusal.evaluation:Evaluation",
    "interp.studies.refusal.evaluation:Subspaces",
    "interp.studies.refusal.result:RefusalResult",
    "interp.readout:TokenLogprobs",
]
# public dataclasses with one of the methods that are not results: fitted objects with their own bundle, and
# per-row helpers (a batch's rows, a prompt's token state)
NOT_RESULTS = {"Direction", "Subspace", "INLPEraser", "TunedLens", "RowEdits", "PromptRecord", "TokenState"}
# results holding an object that has its own save (a model, an SAE): they refuse save() with a clear error
HOLDS_A_MODEL = {"BakeResult", "TrainResult", "TranscoderTraining", "DiffStudy", "CLTTraining"}
# results whose scalar fields are their headline numbers, so Result.summary's default (scalar fields) is theirs
TRIVIALLY_SCALAR: dict[str, str] = {
    "CELossRecovered": "its fields are the CE per condition and the two recovered fractions, all scalars",
}


def _cls(name: str) -> type:
    module, cls = name.split(":")
    return getattr(importlib.import_module(module), cls)


def _ann(fn) -> str:
    return str(fn.__annotations__.get("return"))


def test_every_public_result_dataclass_is_listed():
    listed = {n.split(":")[1] for n in RESULTS}
    missing = []
    for root in ("interp", "probes", "sae", "steering"):
        for path in sorted((REPO / root).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if not isinstance(node, ast.ClassDef) or node.name.startswith("_") or node.name in NOT_RESULTS:
                    continue
                is_dc = any("dataclass" in ast.unparse(d) for d in node.decorator_list)
                methods = {m.name for m in node.body if isinstance(m, ast.FunctionDef)}
                if is_dc and methods & {"plot", "to_frame", "summary", "rows"} and node.name not in listed:
                    missing.append(f"{path.relative_to(REPO)}:{node.name}")
    assert not missing, f"result dataclasses missing from RESULTS (give them the Result methods): {missing}"


@pytest.mark.parametrize("name", RESULTS)
def test_result_has_the_uniform_methods(name):
    cls = _cls(name)
    assert is_dataclass(cls) and issubclass(cls, Result), f"{name}: a dataclass inheriting interp.bundle.Result"
    for method in ("plot", "to_frame", "summary", "save", "load"):
        assert callable(getattr(cls, method, None)), f"{name} lacks .{method}()"
    assert _ann(cls.summary) == "dict[str, Any]", f"{name}.summary returns {_ann(cls.summary)}, not dict[str, Any]"
    assert "DataFrame" in _ann(cls.to_frame), f"{name}.to_frame is annotated {_ann(cls.to_frame)}"
    assert "rows" not in vars(cls) or getattr(cls.rows, "__deprecated__", None), f"{name}.rows: use to_frame()"
    assert {f.name for f in fields(cls)}.isdisjoint({"summary", "plot", "to_frame", "save", "load"}), \
        f"{name}: a field shadows a method"


@pytest.mark.parametrize("name", RESULTS)
def test_result_overrides_summary_or_says_why_not(name):
    """The default summary keeps scalar fields only: a result whose headline numbers sit in tensors or sub-results
    (an effect with its interval, the chosen layer, the control) writes its own."""
    cls, short = _cls(name), name.split(":")[1]
    own = next(k for k in cls.__mro__ if "summary" in vars(k))
    if short in TRIVIALLY_SCALAR:
        assert own is Result, f"{name} writes its own summary: take it off TRIVIALLY_SCALAR"
    else:
        assert own is not Result, (f"{name} uses the default summary (scalar fields only): give it a summary() of "
                                   f"its headline numbers, or list it in TRIVIALLY_SCALAR with the reason")


def _check(res, tmp_path, frame=True, plot=True):
    """The methods on a real instance: one return type each, and the saved copy loads equal."""
    s = res.summary()
    assert isinstance(s, dict) and s and all(isinstance(k, str) for k in s)
    json.dumps(s, allow_nan=True)
    if frame:
        assert isinstance(res.to_frame(), pd.DataFrame) and len(res.to_frame()) > 0
    if plot:
        assert isinstance(res.plot(), go.Figure) and len(res.plot().data) > 0
    res.save(tmp_path / "r")
    back = type(res).load(tmp_path / "r")
    _same(back, res)
    assert isinstance(interp.bundle.load(tmp_path / "r"), type(res))
    with pytest.raises(FileExistsError, match="overwrite=True"):
        res.save(tmp_path / "r")
    return back


def _same(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    elif is_dataclass(a):
        for f in fields(a):
            _same(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert a == b


def test_patching_sweep_and_steering_alpha_sweep(tmp_path):
    from interp.patching.results import Sweep
    from steering.sweep import AlphaSweep

    g = torch.Generator().manual_seed(0)
    sw = Sweep(values=torch.rand(3, 4, generator=g), baseline=0.1, reference=0.9, rows=["0", "1", "2"],
               cols=["a", "b", "c", "d"], row_name="layer", col_name="position", site="resid_pre", method="patch",
               metric="logit_diff", meta={"n": 2})
    back = _check(sw, tmp_path / "sweep")
    assert back.summary() == sw.summary() and sw.summary()["baseline"] == 0.1
    d = sw.values - 0.1
    at = int(d.abs().argmax())
    s = sw.summary()
    assert (s["top_layer"], s["top_position"]) == (sw.rows[at // 4], sw.cols[at % 4])
    assert s["top_delta"] == pytest.approx(float(d.flatten()[at])) and s["top_normalized"] == pytest.approx(
        float(d.flatten()[at]) / 0.8) and s["n_cells"] == 12
    al = AlphaSweep(alphas=[0.0, 1.0], steered=torch.tensor([0.2, 0.7]), random=torch.tensor([[0.2, 0.3]]),
                    baseline=0.2, metric="rate", on="harmful", n_prompts=8, model_id="tiny", seeds=[1],
                    intervention="AddVector")
    _check(al, tmp_path / "alpha")


def test_sae_metrics_and_refusal_selection(tmp_path):
    from interp.studies.kit.stages import Selection
    from sae.quality import SAEMetrics

    m = SAEMetrics(l0=3.5, fvu=0.2, mse=0.01, dead_fraction=0.1, dense_fraction=0.0,
                   frequency=torch.tensor([0.0, 0.5, 0.25]), n_tokens=40, dense_threshold=0.1)
    assert _check(m, tmp_path / "sae").summary()["l0"] == 3.5
    sel = Selection(found=True, filters={"kl_threshold": 0.1}, passing={"induce": 3}, baseline_refusal_score={"h": 1.0},
                    layer_index=1, position_index=0, layer=1, position=-1, position_token="x", bypass_score=-2.0,
                    induce_score=1.5, kl=0.05)
    back = _check(sel, tmp_path / "sel")
    assert back.summary()["layer"] == 1 and back.summary()["passing"] is None  # "all" was not counted
    assert back.to_frame().to_dict("records") == [{"filter": "induce", "rule": "induce > nan", "passing": 3, "of": None}]
    assert list(sel.plot().data[0].x) == [3]


def test_multilingual_geometry_keeps_its_keys(tmp_path):
    from interp.studies.multilingual.language import LanguageGeometry

    t = torch.tensor([0.5, 0.75])
    geo = LanguageGeometry(layers=[0, 1], langs=["en", "fr"], source="en", identity_accuracy=t,
                           identity_ci=torch.stack([t - 0.1, t + 0.1]), chance=0.5, overlap=t / 2, random_overlap=0.1,
                           rank=2, ratio={"before": {"en": t, "fr": t + 1}}, auroc={"before": {"en": t, "fr": t}})
    back = _check(geo, tmp_path / "geo")
    assert len(back.to_frame()) == 4 and set(back.to_frame().lang) == {"en", "fr"}
    fig = geo.plot()
    lines = {t.name: t for t in fig.data}
    assert list(lines["identity accuracy"].y) == [0.5, 0.75] and list(lines["overlap"].y) == [0.25, 0.375]
    assert list(lines["fr before"].y) == [1.5, 1.75] and list(lines["en before"].x) == ["0", "1"]
    assert fig.layout.yaxis.title.text == "accuracy" and fig.layout.xaxis3.title.text == "layer"
    s = geo.summary()
    assert (s["identity_layer"], s["identity_accuracy"]) == (1, 0.75) and s["identity_ci95"] == pytest.approx([0.65, 0.85])
    assert (s["overlap_layer"], s["overlap"], s["random_overlap"]) == (1, 0.375, 0.1) and s["chance"] == 0.5
    assert s["ratio_mean"] == {"before": {"en": 0.625, "fr": 1.625}} and s["auroc_mean"]["before"]["fr"] == 0.625


def test_a_result_holding_a_model_refuses_to_save_and_says_why(tmp_path):
    from interp.testing.tiny import tiny_model
    from steering.baking import BakeResult

    res = BakeResult(model=tiny_model("llama"), writers=("o_proj",), edited=["x"], exact=True, max_logit_error=0.0,
                     rel_logit_error=0.0, notes=[], removed=[], added=[])
    with pytest.raises(TypeError, match="cannot go into a result bundle"):
        res.save(tmp_path / "bake")
    assert not (tmp_path / "bake" / "meta.json").exists()


def test_a_bundle_of_another_kind_is_refused_with_the_right_loader(tmp_path):
    from interp.patching.results import Sweep
    from sae.quality import SAEMetrics

    SAEMetrics(l0=1.0, fvu=0.0, mse=0.0, dead_fraction=0.0, dense_fraction=0.0, frequency=torch.zeros(2),
               n_tokens=1, dense_threshold=0.1).save(tmp_path / "m")
    with pytest.raises(ValueError, match="SAEMetrics"):
        Sweep.load(tmp_path / "m")
    assert Path(tmp_path / "m" / "tensors.safetensors").exists()


def test_multilingual_neurons_pathways_and_updates_plot_their_numbers(tmp_path):
    from interp.evals.rates import Rate
    from interp.patching.neurons import intersect_neurons
    from interp.studies.multilingual.neurons import SafetyNeurons
    from interp.studies.multilingual.pathways import SITES, Pathways
    from interp.studies.multilingual.updates import RestrictedUpdate, UpdateConfig

    sets = {"en": {(0, 1), (1, 2)}, "fr": {(0, 1), (1, 3)}}
    sn = SafetyNeurons(langs=["en", "fr"], k=2, n_candidates=8, sets=sets, overlap=intersect_neurons(sets),
                       chance_pairwise=0.1, baseline={"en": 2.0, "fr": 1.0},
                       effects={("en", "en"): -1.5, ("common", "fr"): -0.25},
                       random={("en", "en"): [-0.1, 0.1, 0.0], ("common", "fr"): [0.0, -0.2, 0.1]})
    _check(sn, tmp_path / "sn")
    bars, rand = sn.plot().data
    assert list(bars.x) == ["en on en", "common on fr"] and list(bars.y) == [-1.5, -0.25]
    assert list(rand.y) == pytest.approx([0.0, -1 / 30]) and rand.error_y.array[0] == pytest.approx(0.095)
    s = sn.summary()
    assert s["effects"]["en on en"] == {"size": 2, "delta": -1.5, "random_mean": pytest.approx(0.0), "beats_random": True}
    assert s["effects"]["common on fr"] == {"size": 1, "delta": -0.25, "random_mean": pytest.approx(-1 / 30),
                                            "beats_random": True}   # below the lowest random draw, -0.2
    assert s["overlap"] == {"sizes": {"en": 2, "fr": 2}, "jaccard": {"en/fr": pytest.approx(1 / 3)}, "n_common": 1,
                            "n_unique": {"en": 1, "fr": 1}} and s["n_random"] == 3
    g = torch.Generator().manual_seed(1)
    pw = Pathways(langs=["fr"], layers=[0, 1], restored={"fr": torch.rand(2, 3, generator=g)},
                  control={"fr": torch.rand(2, 3, generator=g)}, source_score={"fr": 3.0}, target_score={"fr": 1.0},
                  n_positions=2, n_pairs=4)
    _check(pw, tmp_path / "pw")
    fig = pw.plot()
    assert len(fig.data) == 2 * len(SITES) and [a.text for a in fig.layout.annotations] == list(SITES)
    mlp = [t for t in fig.data if t.name == "fr restored"][2]
    assert list(mlp.y) == pytest.approx(pw.restored["fr"][:, 2].tolist()) and list(mlp.x) == ["0", "1"]
    s = pw.summary()
    i = int(pw.restored["fr"][:, 2].argmax())
    assert s["best_by_site"]["fr"][SITES[2]] == {"layer": i, "restored": float(pw.restored["fr"][i, 2]),
                                                  "control": float(pw.control["fr"][i, 2])}
    assert s["gap"] == {"fr": 2.0} and s["top_components"] == [f"L{la} {p}" for la, p in pw.top_components(3)]
    rows = [{"condition": c, "lang": la, "set": w, **Rate(k if w == "harmful" else 0, 4).columns()}
            for c, k in (("before", 3), ("found", 1)) for w in ("harmful", "harmless") for la in ("en", "fr")]
    up = RestrictedUpdate(kind="neuron", config=UpdateConfig(), langs=["en", "fr"], train_langs=["fr"],
                          units={"found": [(0, 1)]}, rates=rows, training={}, n_pairs={"harmful": 4, "harmless": 4})
    fig = up.plot()
    assert [t.name for t in fig.data] == ["harmful/before", "harmless/before", "harmful/found", "harmless/found"]
    assert list(fig.data[2].y) == [0.25, 0.25] and list(fig.data[2].x) == ["en", "fr"]
    assert len(up.to_frame()) == 8 and up.summary()["found"] == {"harmful": 0.25, "harmless": 0.0}


def test_intervention_result_plots_before_after_and_the_prediction(tmp_path):
    from interp.patching.graph_edits import InterventionResult

    res = InterventionResult(mode="linear", labels=["logit A", "refusal"], before=torch.tensor([1.0, 2.0]),
                             after=torch.tensor([0.5, 3.0]), predicted=torch.tensor([-0.25, float("nan")]))
    _check(res, tmp_path / "iv")
    before, after, pred = res.plot().data
    assert (before.name, after.name) == ("before", "after") and list(after.y) == [0.5, 3.0]
    assert pred.y[0] == 0.75 and pred.y[1] is None   # before + predicted; not predictable: left out
    assert res.summary()["delta"] == {"logit A": -0.5, "refusal": 1.0}


def test_writers_frame_and_elasticity_summary_are_not_shadowed(tmp_path):
    from interp.studies.finetune.elasticity import ElasticityStudy
    from interp.studies.refusal.writers import Writers

    row = {"group": "baseline", "direction": "none", "sites": "nothing ablated", "rate": 0.5, "k": 2, "n": 4,
           "ci95": [0.15, 0.85], "score": 1.25}
    w = Writers(rows=[row], embedding="token embedding")
    fr = w.to_frame()
    assert fr.to_dict("records")[0] | {"low": 0, "high": 0} == {"group": "baseline", "direction": "none",
                                                                 "sites": "nothing ablated", "rate": 0.5, "k": 2, "n": 4,
                                                                 "low": 0, "high": 0, "score": 1.25}
    assert fr.low[0] < 0.5 < fr.high[0]
    out = {"curve": "compliance", "refusal_start": 1.0, "refusal_end": 0.25, "score_start": 4.0, "score_end": -1.0,
           "toward_other": 0.8, "fisher_p": 0.01, "start": "aligned"}
    st = ElasticityStudy(curves={}, fits={}, outcomes=[out])
    assert st.summary() == {"compliance": {k: out[k] for k in ("refusal_start", "refusal_end", "score_start",
                                                               "score_end", "toward_other", "fisher_p")}}
    assert st.to_frame("outcomes").toward_other.tolist() == [0.8]


def test_a_saved_result_keeps_the_order_of_its_dicts(tmp_path):
    """meta.json is written with sorted keys; a result's dicts (conditions, in plot order) load in their own order."""
    from interp.studies.refusal.evaluation import Evaluation

    rates = {"harmful/baseline": 1.0, "harmful/ablation": 0.0, "borderline/baseline": 0.25}
    ev = Evaluation({}, rates, {k: 2 * v for k, v in rates.items()}, {"max_abs_logit_diff": None}, {},
                    {"harmful/baseline": [True], "harmful/ablation": [False], "borderline/baseline": [False, True]})
    back = _check(ev, tmp_path / "ev")
    assert list(back.refusal_rate) == list(rates) and list(back.plot().data[0].x) == list(rates)
    assert list(back.to_frame().condition) == list(rates)


def test_tensor_heavy_results_summarise_their_headline_numbers(tmp_path):
    """The default summary() keeps scalar fields only; these results hold tensors and say what they found."""
    from probes.transfer import TransferScores
    from probes.validation import DirectionScores
    from sae.analysis import LatentRanking
    from steering.generation import Generations
    from steering.strength import ResidualNorms
    from steering.sweep import AlphaSweep

    al = AlphaSweep(alphas=[0.0, 1.0, 2.0], steered=torch.tensor([0.2, 0.5, 0.9]),
                    random=torch.tensor([[0.2, 0.3, 0.2], [0.2, 0.1, 0.4]]), baseline=0.2, metric="rate", on="harmful",
                    n_prompts=8, model_id="tiny")
    s = al.summary()
    assert s["largest_effect"] == pytest.approx(0.6) and s["at_alpha"] == 2.0 and s["random"] == pytest.approx([0.2, 0.2, 0.3])
    norms = ResidualNorms(mean=torch.tensor([1.0, 4.0]), std=torch.ones(2), max=torch.ones(2), layers=[3, 5],
                          site="resid_post", positions="all", exclude_special=True, n_tokens=20, model_id="m",
                          prompts=["a", "b"])
    assert norms.summary()["mean_norm"] == {"3": 1.0, "5": 4.0} and norms.summary()["n_prompts"] == 2
    rk = LatentRanking(indices=torch.tensor([4, 1]), scores=torch.tensor([0.9, 0.5]), all_scores=torch.rand(6),
                       what="auroc")
    assert rk.summary() == {"what": "auroc", "n_latents": 6, "top": [4, 1], "top_scores": pytest.approx([0.9, 0.5])}
    ds = DirectionScores(sites=["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"],
                         auroc=torch.tensor([0.6, 0.8]), cohens_d=torch.tensor([0.3, 1.2]), method="mean_diff")
    assert ds.summary() | {"auroc": 0} == {"method": "mean_diff", "best_site": "blocks.1.hook_resid_post",
                                           "best_layer": 1, "auroc": 0, "cohens_d": pytest.approx(1.2)}
    m = torch.tensor([[[0.9, 0.7], [0.6, 0.65]], [[0.5, 0.6], [0.95, 0.9]]])
    tr = TransferScores(datasets=["a", "b"], sites=["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"], matrix=m,
                        lodo=torch.tensor([[0.55, 0.6], [0.6, 0.7]]))
    c = tr.layer_choice()
    assert tr.summary()["best_site"] == tr.sites[c.index] and tr.summary()["lodo_auroc"] == pytest.approx(0.65)
    gen = Generations(prompts=["p", "q"], formatted=["P", "Q"], texts=["hi there", " "], token_ids=[[1, 2], []])
    assert gen.summary() == {"n_prompts": 2, "mean_new_tokens": 1.0, "max_new_tokens": 2, "n_empty": 1}
    for i, r in enumerate((al, norms, rk, ds, tr, gen)):
        _check(r, tmp_path / str(i), plot=False, frame=False)


def test_token_logprobs_is_a_result_and_an_empty_response_saves(tmp_path):
    from interp.readout import TokenLogprobs

    lp = TokenLogprobs(torch.tensor([-0.5, -2.0, -0.25]), torch.tensor([7, 9, 4]), ["a", "b", "c"], [3, 4, 5])
    assert lp.summary() == {"n_tokens": 3, "total": -2.75, "mean": pytest.approx(-2.75 / 3), "min": -2.0,
                            "lowest_token": "b", "lowest_position": 4}
    _check(lp, tmp_path / "lp")
    empty = TokenLogprobs(torch.zeros(0), torch.zeros(0, dtype=torch.long), [], [])
    assert empty.summary() == {"n_tokens": 0, "total": 0.0, "mean": None, "min": None, "lowest_token": None,
                               "lowest_position": None}
    _check(empty, tmp_path / "empty", frame=False, plot=False)
