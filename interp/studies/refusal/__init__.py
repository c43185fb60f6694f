"""The refusal-direction analysis (Arditi et al. 2024): ``run_refusal(RefusalConfig(...), out)``, or stage by stage.

    data = load_refusal_data()
    tokens = find_refusal_tokens(model, data); cand = find_candidates(model, data)
    scores = score_candidates(model, data, cand, tokens); sel = select_direction(model.n_layers, cand, scores, cfg)
    (or est = estimate_candidates(model, data, cand, tokens); only = top_candidates(est, cand, model.n_layers, cfg, 8);
     scores = score_candidates(model, data, cand, tokens, only=only): exact scores of the top 8 only)
    ev = evaluate(model, data, cand, sel, tokens); sub = find_subspaces(model, data, cand, sel, tokens)
"""

from interp.studies.kit.config import (
    DataConfig,
    GenerationConfig,
    RefusalConfig,
    RuntimeConfig,
    SelectionConfig,
)
from interp.studies.kit.prompt_sets import RefusalData, load_refusal_data
from interp.studies.kit.stages import (
    Candidates,
    RefusalTokens,
    Scores,
    Selection,
    find_candidates,
    find_refusal_tokens,
    score_candidates,
    select_direction,
)
from interp.studies.refusal.estimate import Estimate, estimate_candidates, top_candidates
from interp.studies.refusal.evaluation import Evaluation, Subspaces, TestPrompts, evaluate, find_subspaces
from interp.studies.refusal.result import RefusalResult
from interp.studies.refusal.run import run_refusal

__all__ = ["Candidates", "DataConfig", "Estimate", "Evaluation", "GenerationConfig", "RefusalConfig", "RefusalData",
           "RefusalResult", "RefusalTokens", "RuntimeConfig", "Scores", "Selection", "SelectionConfig", "Subspaces",
           "TestPrompts", "estimate_candidates", "evaluate", "find_candidates", "find_refusal_tokens", "find_subspaces", "load_refusal_data",
           "run_refusal", "score_candidates", "select_direction", "top_candidates"]
