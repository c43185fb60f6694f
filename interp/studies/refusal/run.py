"""The refusal-direction analysis (Arditi et al. 2024) end to end, stage by stage, resumable.

tokens -> candidates -> scores -> selection -> evaluation -> writers -> subspaces -> outputs (direction,
metrics.json, generations.jsonl, report.html, optional baked model). Each stage is a public function returning a
dataclass (:mod:`.stages`, :mod:`.evaluation`), cached in the run folder under a key of its own inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

import torch

from interp.evals.judge import Judge
from interp.fingerprint import weights_hash
from interp.io import content_hash
from interp.models import Model, load_model
from interp.studies.kit.config import RefusalConfig, stage_key
from interp.studies.kit.prompt_sets import RefusalData, load_refusal_data
from interp.studies.kit.stages import (
    Candidates,
    RefusalTokens,
    Scores,
    Selection,
    fill_skipped,
    find_candidates,
    find_refusal_tokens,
    kl_threshold,
    score_candidates,
    select_direction,
)
from interp.studies.refusal.cache import Run
from interp.studies.refusal.diagnosis import auto_notes, diagnose, kl_rejected_notes, relaxed_notes
from interp.studies.refusal.estimate import PROBES, Estimate, estimate_modes, top_candidates
from interp.studies.refusal.evaluation import Evaluation, Subspaces, TestPrompts, evaluate, find_subspaces
from interp.studies.refusal.frontier import FrontierConfig, run_frontier
from interp.studies.refusal.frontier_result import FrontierResult
from interp.studies.refusal.outputs import finish, start_notes
from interp.studies.refusal.result import RefusalResult
from interp.studies.refusal.writers import Writers, writer_attribution
from interp.values import Runtime

Progress = Callable[[str, str], None]
NOT_SAVED = ("--save-model: no model saved: the direction was selected with the post-instruction ablation, which "
             "no weight edit reproduces; --ablate-positions all searches the bakeable every-token ablation only")


def resolve_judge(spec: str | None, given: Judge | None) -> tuple[Judge | None, str]:
    """The run's refusal judge and its name (part of the stage keys): ``given`` (a callable), else ``spec``
    (``None`` / ``"phrases"``: the anchored phrase judge; a path: a local classifier folder)."""
    if given is not None:
        if not callable(given):
            raise TypeError(f"judge must be a callable str -> bool, got {type(given).__name__}")
        return given, f"callable:{getattr(given, '__qualname__', type(given).__name__)}"
    if spec in (None, "phrases"):
        return None, "phrases"
    from interp.evals.judge import load_judge

    return load_judge(spec), f"classifier:{Path(spec).resolve()}"


def run_refusal(cfg: RefusalConfig, out: str | Path, overwrite: bool = False, progress: Progress | None = None,
                model: Model | None = None, judge: Judge | None = None,
                frontier: FrontierConfig | None = None) -> RefusalResult:
    """Run (or resume) the analysis into ``out``. ``progress(stage, status)`` is called around each stage.

    The folder is checked first (another run's folder needs ``overwrite``) but marked as this run's only after
    the prompt files and the model loaded: a run that fails on bad input leaves nothing that blocks its rerun.
    The run stops after the tokens stage when the diagnosis finds no refusal behaviour (:func:`diagnose`).
    ``judge`` (any callable ``str -> bool``) overrides ``cfg.runtime.judge``.
    ``cfg.runtime.threads`` sets torch's thread count for the run (restored after). ``frontier``: after the paper's
    stages, the refusal-vs-damage frontier search (:func:`~interp.studies.refusal.frontier.run_frontier`).
    """
    with _threads(cfg.runtime.threads):
        return _run_refusal(cfg, out, overwrite, progress, model, judge, frontier)


@contextmanager
def _threads(n: int | None) -> Iterator[None]:
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _run_refusal(cfg: RefusalConfig, out: str | Path, overwrite: bool, progress: Progress | None,
                 model: Model | None, judge: Judge | None, frontier: FrontierConfig | None = None) -> RefusalResult:
    say: Progress = progress or (lambda stage, status: None)
    run = Run(out, cfg, overwrite)
    d, s, g, rt = cfg.data, cfg.selection, cfg.generation, cfg.runtime
    data: RefusalData = load_refusal_data(model.name if model is not None else rt.model, d)
    data.check()
    judge, judge_name = resolve_judge(rt.judge, judge)
    model = model or load_model(rt.model, dtype=rt.dtype, device=rt.device)
    model_key = weights_hash(model)
    run.begin(model_key)  # inputs and model are valid: only now is the folder marked as this run's
    torch.manual_seed(d.seed)
    res = RefusalResult(run.out, notes=start_notes(model) + relaxed_notes(s), computed=run.computed)
    keys = _Keys(cfg, model, model_key, data, judge_name)
    bs = rt.batch_size
    res.tokens = run.stage("tokens", keys.tokens, RefusalTokens, lambda: find_refusal_tokens(
        model, data, min(g.max_new_tokens, 12), bs, judge, s.min_refusals), say)
    res.diagnosis = diagnose(res.tokens, s)
    if not res.diagnosis.refuses:  # nothing to find: stop before capture and scoring, with the finding
        return finish(run, model, cfg, data, res, say)
    res.candidates = cand = run.stage("candidates", keys.candidates, Candidates, lambda: find_candidates(
        model, data, s.layers, bs), say)
    if res.tokens.tokens:
        tried: list[dict] = []
        later: dict[str, Estimate] = {}  # estimates of the later modes, computed in the first mode's passes
        for at in s.modes():  # "auto": every token first; the post-instruction ablation only if nothing passes there
            sel = _search(run, model, data, cand, res, keys.mode(at), at, cfg, say, later)
            tried.append({"ablate_positions": at, "found": sel.found, "passing": sel.passing,  # type: ignore[union-attr]
                          "n_scored_exactly": res.scores.n_scored, "kl_random": res.scores.kl_random,  # type: ignore[union-attr]
                          "bypass_induce_scored": res.scores.n_gated == 0,  # type: ignore[union-attr]
                          "kl_threshold": sel.filters["kl_threshold"]})
            if sel.found:
                break
        if s.ablate_positions == "auto":  # record what "auto" tried and where it ended
            res.ablation_search = tried
            res.notes += auto_notes(tried, s)
        res.notes += kl_rejected_notes(sel)
        runtime = rt
        if at != "all" and rt.save_model:  # "auto" ended in the post-instruction mode: nothing to bake
            runtime = replace(rt, save_model=False)
            if sel.found:
                res.notes.append(NOT_SAVED)
        # downstream stages and outputs see the mode used
        cfg = replace(cfg, selection=replace(s, ablate_positions=at), runtime=runtime)
        if sel.found:
            test = TestPrompts(model, data, stack=max(1, s.max_rows // bs), judge=judge)  # conditions per generation
            run_rt = Runtime(batch_size=bs, seed=d.seed, progress=False)
            res.evaluation = run.stage("evaluation", keys.evaluation(sel), Evaluation, lambda: evaluate(
                model, test, cand, sel, res.tokens, cfg, run_rt), say)  # type: ignore[arg-type]
            res.writers = run.stage("writers", keys.writers(sel), Writers, lambda: writer_attribution(
                model, test, sel.direction(cand, model.name).vectors[0], res.tokens, res.evaluation, cfg, run_rt),
                say)  # type: ignore[arg-type]
            res.subspaces = run.stage("subspaces", keys.subspaces(sel), Subspaces, lambda: find_subspaces(
                model, test, cand, sel, res.tokens, res.evaluation, cfg, run_rt), say)  # type: ignore[arg-type]
        if frontier is not None:
            res.frontier = run.stage("frontier", keys.frontier(frontier), FrontierResult, lambda: run_frontier(
                model, data, cand, res.tokens.tokens, frontier, judge), say)  # type: ignore[union-attr]
    return finish(run, model, cfg, data, res, say, save_frontier=rt.save_model and res.frontier is not None)


def _search(run: Run, model: Model, data: RefusalData, cand: Candidates, res: RefusalResult, keys: _Keys, at: str,
            cfg: RefusalConfig, say: Progress, later: dict[str, Estimate]) -> Selection:
    """Estimate (``search="estimate"``), score exactly and select with the ablation at ``at``; sets ``res``'s
    estimate, scores and selection. Each mode's stages have folders of their own (``scores``,
    ``scores.post_instruction``), so an ``auto`` run resumes both. The first mode's estimate also computes the
    later modes' (the same passes; each equal to its own run) into ``later``, used if their stage is reached."""
    s, d, bs = cfg.selection, cfg.data, cfg.runtime.batch_size
    suffix = "" if at == "all" else f".{at}"
    only = None
    if s.search == "estimate":  # attribution estimates of every candidate; only the top k are scored exactly
        def compute() -> Estimate:
            if at in later:
                return later.pop(at)
            modes = s.modes()[s.modes().index(at):]
            got = estimate_modes(model, data, cand, res.tokens, bs, seed=d.seed, modes=modes)  # type: ignore[arg-type]
            later.update({m: e for m, e in got.items() if m != at})
            return got[at]

        res.estimate = run.stage("estimate" + suffix, keys.estimate, Estimate, compute, say)
        only = top_candidates(res.estimate, cand, model.n_layers, s, s.top_k)
    # with a later search to try, bypass and induce are scored only if some candidate passes the KL filter here;
    # a later run that needs them (new thresholds, or this mode alone) fills them in
    gate = partial(kl_threshold, s) if at != s.modes()[-1] else None
    res.scores = run.stage("scores" + suffix, keys.exact(only), Scores, lambda: score_candidates(
        model, data, cand, res.tokens, only, gate, replace(s, ablate_positions=at),
        Runtime(batch_size=bs, seed=d.seed, progress=False)), say, complete=lambda sc: fill_skipped(  # type: ignore[arg-type]
            model, data, cand, res.tokens, sc, bs, s.max_rows, at, gate))
    res.selection = run.stage("selection" + suffix, keys.selection(model.n_layers, res.scores), Selection, lambda: select_direction(
        model.n_layers, cand, res.scores, s), say)  # type: ignore[arg-type]
    return res.selection


class _Keys:
    """Each stage's cache key: its inputs' digests and upstream keys, only the settings that change it."""

    def __init__(self, cfg: RefusalConfig, model: Model, weights: str, data: RefusalData, judge: str):
        """``weights``: the model's :func:`~interp.fingerprint.weights_hash` (its name says nothing: two unnamed
        ``from_hf`` models share one, and a name can be reused for new weights)."""
        self.cfg, rt, g = cfg, cfg.runtime, cfg.generation
        template = getattr(model.tokenizer, "chat_template", None)
        self.model = {"weights": weights, "chat_template": content_hash(template), "vocab": len(model.tokenizer),
                      "batch_size": rt.batch_size, "judge": judge}
        self.tokens = stage_key("tokens", {**self.model, "train": data.digest("train"),
                                           "max_new_tokens": min(g.max_new_tokens, 12),
                                           "min_refusals": cfg.selection.min_refusals})
        self.candidates = stage_key("candidates", {**self.model, "train": data.digest("train"),
                                                   "layers": cfg.selection.layers})
        self.data = data
        self.mode("all")

    def mode(self, at: str) -> _Keys:
        """Set the keys of the stages that depend on where the ablation acts (search, evaluation) to ``at``."""
        cfg, g, data = self.cfg, self.cfg.generation, self.data
        self.scores = stage_key("scores", {"tokens": self.tokens, "candidates": self.candidates,
                                           "val": data.digest("val"), "max_rows": cfg.selection.max_rows, **self.model,
                                           "ablate_positions": at, "random_kl": [cfg.selection.n_random, cfg.data.seed]})
        self.estimate = stage_key("estimate", {"tokens": self.tokens, "candidates": self.candidates,
                                               "val": data.digest("val"), "probes": PROBES, "seed": cfg.data.seed,
                                               **self.model, "ablate_positions": at, "bypass": "logit curvature"})
        self.test = {"test": data.digest("test"), "train": data.digest("train"), "seed": cfg.data.seed,
                     "max_new_tokens": g.max_new_tokens, "tokens": self.tokens, "candidates": self.candidates,
                     "ablate_positions": at}
        return self

    def exact(self, only: torch.Tensor | None) -> str:
        """The exact scores' key: all candidates, or the ``only`` mask (so a threshold change that picks the
        same top k re-scores nothing); selection is keyed on it."""
        if only is not None:
            self.scores = stage_key("scores", {"all": self.scores, "only": only.flatten().tolist()})
        return self.scores

    def selection(self, n_layers: int, scores: Scores) -> str:
        """Keyed on the scores' key and, for scores a KL gate left partly unscored, how many it left (a later run
        that fills them in selects again)."""
        s = self.cfg.selection
        unscored = scores.n_gated
        # "record": the Selection's fields (2: with kl_rejected), so a run folder from before recomputes it (cheap)
        return stage_key("selection", {"scores": self.scores, "n_layers": n_layers, "kl": s.kl_threshold,
                                       "kl_reference": s.kl_reference, "record": 2,
                                       "prune": s.prune_layer_fraction, "induce": s.induce_threshold,
                                       **({"unscored": unscored} if unscored else {})})

    def evaluation(self, sel: Selection) -> str:
        """Keyed on the selection's result (the chosen candidate), not its thresholds."""
        return stage_key("evaluation", {**self.test, **self.model, "chosen": [sel.layer_index, sel.position_index],
                                        "kl_control": "random ablation"})

    def frontier(self, fc: FrontierConfig) -> str:
        return stage_key("frontier", {**{k: v for k, v in self.test.items() if k != "ablate_positions"}, **self.model,
                                       "val": self.data.digest("val"), "config": asdict(fc)})

    def writers(self, sel: Selection) -> str:
        return stage_key("writers", {**self.test, **self.model, "chosen": [sel.layer_index, sel.position_index],
                                     "control": "random orthogonal, seeded"})

    def subspaces(self, sel: Selection) -> str:
        return stage_key("subspaces", {**self.test, **self.model, "chosen": [sel.layer_index, sel.position_index],
                                       "rank": self.cfg.generation.subspace_rank,
                                       "control": "random nested, same ranks"})
