"""Issue 37 (one vocabulary), the fine-tune, circuits and refusal studies and the kit: each entry point takes at most
8 parameters (model, data, a few choices, ``config``, ``runtime``), and an old keyword fails naming its new home."""

import inspect

import pytest

from interp.studies.circuits.refusal import refusal_circuit
from interp.studies.finetune.diffing import diff_study
from interp.studies.finetune.elasticity import elasticity_study
from interp.studies.finetune.masking import masking_study
from interp.studies.finetune.methods import compare_methods
from interp.studies.finetune.transplant import transplant_study
from interp.studies.kit.prompt_sets import load_refusal_data
from interp.studies.kit.stages import score_candidates
from interp.studies.refusal.evaluation import evaluate, find_subspaces
from interp.studies.refusal.writers import writer_attribution

FUNCTIONS = [refusal_circuit, diff_study, elasticity_study, masking_study, compare_methods, transplant_study,
             load_refusal_data, score_candidates, evaluate, find_subspaces, writer_attribution]


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_at_most_eight_parameters_and_no_chat_keyword(fn):
    params = inspect.signature(fn).parameters
    assert len(params) <= 8, (fn.__name__, list(params))
    assert not {"chat", "system", "seed", "batch_size", "progress"} & set(params), (fn.__name__, list(params))
    if fn is not load_refusal_data:
        assert "runtime" in params, fn.__name__


# one old keyword per family, with the home its error must name (checked before anything runs)
OLD = [(load_refusal_data, (), {"n_train": 8}, "config=DataConfig"),
       (load_refusal_data, (), {"seed": 1}, "runtime=interp.Runtime(seed="),
       (score_candidates, (None, None, None, None), {"batch_size": 4}, "runtime=interp.Runtime(batch_size="),
       (evaluate, (None, None, None, None, None), {"batch_size": 4}, "runtime=interp.Runtime(batch_size="),
       (find_subspaces, (None, None, None, None, None), {"seed": 1}, "runtime=interp.Runtime(seed="),
       (find_subspaces, (None, None, None, None, None), {"judge": None}, "TestPrompts(model, data, judge="),
       (writer_attribution, (None, None, None, None), {"batch_size": 4}, "runtime=interp.Runtime(batch_size="),
       (transplant_study, (None, None, None), {"progress": False}, "runtime=interp.Runtime(progress="),
       (diff_study, (None, None, None, 2), {"seed": 1}, "runtime=interp.Runtime(seed="),
       (elasticity_study, (None, None, None, 2), {"batch_size": 4}, "runtime=interp.Runtime(batch_size="),
       (masking_study, (None, None, None, None, None, None), {"chat": False}, "Prompts("),
       (compare_methods, (None,), {"seed": 1}, "runtime=interp.Runtime(seed="),
       (refusal_circuit, (None, None, None, 2, None), {"batch_size": 4}, "runtime=interp.Runtime(batch_size=")]


@pytest.mark.parametrize("fn,args,kwargs,home", OLD, ids=lambda x: getattr(x, "__name__", None))
def test_old_keyword_names_its_new_home(fn, args, kwargs, home):
    with pytest.raises(TypeError, match="no longer takes") as e:
        fn(*args, **kwargs)
    assert home in str(e.value), str(e.value)


def test_the_scores_key_follows_the_knobs_that_moved_into_selection_config():
    """n_random and max_rows now live in SelectionConfig: the exact scores' key still changes with each (they change
    the scores), not with a selection threshold; n_random re-runs the scores of the same run (run identity kept)."""
    from interp.studies.kit.config import DataConfig, RefusalConfig
    from interp.studies.refusal.run import _Keys
    from interp.testing.tiny import tiny_model

    m = tiny_model("llama")
    data = load_refusal_data("organism", DataConfig(n_train=4, n_val=4, n_test=4))

    def key(**flat):
        return _Keys(RefusalConfig.from_flat(**flat), m, "weights", data, "judge").scores

    assert key(n_random=2) != key() != key(max_rows=128)
    assert key(kl_threshold=0.2) == key()
    assert RefusalConfig.from_flat(n_random=2).run_identity() == RefusalConfig().run_identity()
    assert RefusalConfig.from_flat(max_rows=128).run_identity() != RefusalConfig().run_identity()


def test_the_multilingual_studies_take_seed_and_batch_size_in_runtime():
    from interp.studies.multilingual.features import features_by_language, fit_sae
    from interp.studies.multilingual.geometry import capture_last, geometry
    from interp.studies.multilingual.language import language_geometry
    from interp.studies.multilingual.neurons import language_neurons, safety_neurons
    from interp.studies.multilingual.pathways import refusal_pathways
    from interp.studies.multilingual.retention import judged_rates

    for fn in (fit_sae, features_by_language, capture_last, geometry, language_geometry, language_neurons,
               safety_neurons, refusal_pathways, judged_rates):
        params = inspect.signature(fn).parameters
        assert "runtime" in params and not {"chat", "seed", "batch_size"} & set(params), (fn.__name__, list(params))
    with pytest.raises(TypeError, match=r"no longer takes batch_size= \(moved into runtime=interp.Runtime\(batch_size="):
        refusal_pathways(None, None, batch_size=8)
    with pytest.raises(TypeError, match=r"no longer takes seed= \(moved into runtime=interp.Runtime\(seed="):
        geometry({}, [0], "en", seed=0)
