"""The refusal job's last two stages: causal evaluation on test prompts, and per-category subspaces.

``evaluate`` generates and scores the test prompts under hook ablation, baked weights, addition and
random / orthogonal controls, and measures KL / CE on harmless responses; ``find_subspaces`` ablates the
refusal direction plus per-category directions, rank by rank. Both tokenise each test set once for
scoring (:class:`TestPrompts`); ``steering.generate`` tokenises once per generation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

import steering
from interp.bundle import Result
from interp.chat import Encoded
from interp.evals.judge import Judge, judge_many
from interp.evals.logits import cross_entropy, kl_div, refusal_score
from interp.evals.rates import rate
from interp.forward import batches, cached_forward, forward, prepare
from interp.models import Model
from interp.sites import WRITERS
from interp.studies.kit.config import RefusalConfig
from interp.studies.kit.moved import moved
from interp.studies.kit.prompt_sets import RefusalData
from interp.studies.kit.scoring import ablation, prompt_logits
from interp.studies.kit.stages import Candidates, RefusalTokens, Selection
from interp.studies.refusal.conditions import KL_CONTROLS
from interp.studies.refusal.conditions import conditions as make_conditions
from interp.values import Prompts, Runtime, moved_keywords
from probes.directions import random_directions
from steering.prefill import leaves_prompt_prefix

if TYPE_CHECKING:
    import pandas as pd

NOT_BAKEABLE = ("the run's ablation acts at the post-instruction and generated tokens only (ablate_positions="
                "'post_instruction'), which no weight edit reproduces (weights act on every token alike): the baked "
                "weights ablate the direction at every token, and are compared with the every-token hook ablation")
BAKED, BAKED_EVERY_TOKEN = "harmful/baked weights", "harmful/baked weights (every token)"
# the controls whose harmless KL / CE ``evaluate`` reports beside the direction's, as "kl_first_response_token (name)"
# and "ce_edited (name)": the random ablation always, the every-token ablation (the baked edit) in post-instruction runs


@dataclass
class Evaluation(Result):
    """Per condition (``"harmful/ablation"``, ``"borderline/addition"``, ...): generations, the judge's verdicts,
    refusal rate, mean refusal score; and checks."""

    generations: dict[str, list[str]]
    refusal_rate: dict[str, float]
    refusal_score: dict[str, float]
    hook_vs_baked: dict[str, Any]
    harmless_kl_ce: dict[str, float]
    refused: dict[str, list[bool]] = field(default_factory=dict)

    def rates(self) -> dict[str, dict[str, Any]]:
        """Each condition's refusal rate with its count, sample size and 95% Wilson interval."""
        return {name: rate(flags) for name, flags in self.refused.items()}

    def summary(self) -> dict[str, Any]:
        """Each condition's refusal rate and mean refusal score, the harmless KL / CE, the baked weights' error."""
        return {"refusal_rate": dict(self.refusal_rate), "refusal_score": dict(self.refusal_score),
                "harmless_kl_ce": dict(self.harmless_kl_ce),
                "baked_max_abs_logit_diff": self.hook_vs_baked.get("max_abs_logit_diff")}

    def to_frame(self) -> pd.DataFrame:
        """One row per condition: ``condition``, its ``prompts`` (harmful / harmless / borderline) and
        ``intervention``, the :meth:`~interp.evals.rates.Rate.columns` (rate, k, n, low, high) and the mean
        first-token ``refusal_score``."""
        import pandas as pd

        rates, rows = self.rates(), []
        for cond in dict.fromkeys([*self.refusal_rate, *self.refused]):
            prompts, _, what = cond.partition("/")
            cols = rates[cond].columns() if cond in rates else {"rate": self.refusal_rate[cond]}
            rows.append({"condition": cond, "prompts": prompts, "intervention": what, **cols,
                         "refusal_score": self.refusal_score.get(cond, float("nan"))})
        return pd.DataFrame(rows)

    def plot(self) -> Any:
        """Refusal rate per condition with its 95% Wilson interval (:func:`interp.viz.refusal.refusal_rates`)."""
        from interp.viz.refusal import refusal_rates

        return refusal_rates(self.refusal_rate, {k: r.ci95 for k, r in self.rates().items()})


@dataclass
class Subspaces(Result):
    """Ablating the refusal direction plus per-category directions (basis order), rank 1..k, on harmful test."""

    categories: list[str]
    ranks: list[int]
    rates: list[float]
    scores: list[float]
    control_rates: list[float] = field(default_factory=list)   # random subspaces of the same ranks
    control_scores: list[float] = field(default_factory=list)

    def added(self, rank: int) -> str:
        """What rank ``rank`` adds to the ablated subspace: the refusal direction, then one category each."""
        return "refusal direction" if rank == 1 else self.categories[rank - 2]

    def summary(self) -> dict[str, Any]:
        """Harmful refusal (and the random control's) at rank 1 and at the largest rank ablated."""
        if not self.ranks:
            return {"categories": list(self.categories), "max_rank": 0}
        ctrl = self.control_rates or [float("nan")] * len(self.ranks)
        return {"categories": list(self.categories), "max_rank": self.ranks[-1], "rate_rank_1": self.rates[0],
                "rate_max_rank": self.rates[-1], "control_rate_rank_1": ctrl[0], "control_rate_max_rank": ctrl[-1]}

    def to_frame(self) -> pd.DataFrame:
        """One row per rank: what it ``added``, harmful refusal ``rate`` and mean ``score``, and the random
        subspace's of the same rank (``control_rate``, ``control_score``)."""
        import pandas as pd

        nan = [float("nan")] * len(self.ranks)
        return pd.DataFrame({"rank": self.ranks, "added": [self.added(k) for k in self.ranks], "rate": self.rates,
                             "score": self.scores, "control_rate": self.control_rates or nan,
                             "control_score": self.control_scores or nan})

    def plot(self, baseline: float | None = None, baseline_score: float | None = None) -> Any:
        """Refusal rate and score by rank beside the random control; ``baseline*``: the no-ablation levels (from
        the :class:`Evaluation`'s ``harmful/baseline``), drawn dashed when given."""
        from interp.viz.refusal import subspace_curve

        return subspace_curve(self.ranks, self.rates, self.scores, baseline, self.control_rates or None,
                              self.control_scores or None, baseline_score)


class TestPrompts:
    """The test prompts of one run, each class tokenised once (on first use) and shared by every condition, with one
    :class:`steering.GenerationSession` per class and batch size: the plain prompt pass each class's conditions
    reuse is run once (exact). ``judge`` judges their generations (``None``: the anchored phrase judge)."""

    def __init__(self, model: Model, data: RefusalData, stack: int = 1, judge: Judge | None = None):
        self.model, self.data, self.stack = model, data, stack   # stack: conditions per generation (generate_each)
        self.judge = judge
        self._prompts: dict[str, Prompts] = {}
        self._sessions: dict[tuple[str, int], steering.GenerationSession] = {}

    def prompts(self, which: str) -> list[str]:
        """The ``"harmful"``, ``"harmless"`` or ``"borderline"`` (over-refusal) test instructions."""
        if which == "borderline":
            if self.data.borderline is None:
                raise ValueError("this run has no borderline (over-refusal) set")
            return self.data.borderline.instructions
        return (self.data.harmful if which == "harmful" else self.data.harmless)["test"].instructions

    def as_prompts(self, which: str) -> Prompts:
        """The test prompts of ``which`` as one :class:`interp.Prompts` (its encodings kept on it)."""
        if which not in self._prompts:
            self._prompts[which] = Prompts.of(self.prompts(which))
        return self._prompts[which]

    def prepared(self, which: str) -> tuple[list[str], list[Encoded]]:
        """The chat-formatted texts and encodings of the test prompts of ``which`` (tokenised once)."""
        return self.as_prompts(which).encode(self.model)

    def encodings(self, which: str) -> list[Encoded]:
        return self.prepared(which)[1]

    def session(self, which: str, batch_size: int, model: Model | None = None) -> steering.GenerationSession:
        """The generation session of ``which`` at ``batch_size`` on this run's model (kept: it reuses the plain
        prompt pass), or a fresh one without reuse on another ``model`` (the baked weights)."""
        run = Runtime(batch_size=batch_size, progress=False)
        if model is not None and model is not self.model:
            return steering.GenerationSession(model, self.as_prompts(which), run, first_logits=True, reuse=False)
        if (which, batch_size) not in self._sessions:
            self._sessions[which, batch_size] = steering.GenerationSession(self.model, self.as_prompts(which), run,
                                                                           first_logits=True)
        return self._sessions[which, batch_size]

    def last_logits(self, which: str, ivs: Sequence[Any], batch_size: int) -> torch.Tensor:
        """Next-token logits ``[n, vocab]`` (CPU) of the test prompts of ``which`` under ``ivs``; under edits that leave
        the columns before the post-instruction tokens as they are, those columns' keys and values come from the
        session's plain prompt pass (run once per session, shared with its generations; exact)."""
        reuse = leaves_prompt_prefix(self.model, ivs)
        return prompt_logits(self.model, self.encodings(which), *ivs, batch_size=batch_size,
                             prefixes=self.session(which, batch_size).prefixes() if reuse else None)

    def judged(self, which: str, ivs: Sequence[Any], max_new_tokens: int, batch_size: int, judge: Judge | None = None,
               model: Model | None = None) -> tuple[list[str], list[bool], torch.Tensor]:
        """Greedy generations of ``which`` under ``ivs`` (on ``model``, default this run's), the judge's verdicts,
        and the first step's logits ``[n, vocab]`` (the prompts' own: no second forward for a refusal score).
        On this run's model the session reuses the plain prompt pass where that is exact (the columns before the
        post-instruction tokens under edits of those and the generated tokens; the blocks below an addition)."""
        return self.judged_many(which, [ivs], max_new_tokens, batch_size, judge, model)[0]

    def judged_many(self, which: str, conditions: Sequence[Sequence[Any]], max_new_tokens: int, batch_size: int,
                    judge: Judge | None = None, model: Model | None = None
                    ) -> list[tuple[list[str], list[bool], torch.Tensor]]:
        """:meth:`judged` under each of ``conditions``, ``self.stack`` of them per generation
        (:meth:`steering.GenerationSession.generate_each`: the prompts stacked once per condition in one wider
        batch)."""
        outs = self.session(which, batch_size, model).generate_each(conditions, stack=self.stack,
                                                                    max_new_tokens=max_new_tokens)
        flags = judge_many(judge if judge is not None else self.judge, [t for out in outs for t in out.texts])
        n, res = len(self.prompts(which)), []
        for i, out in enumerate(outs):
            assert out.first_logits is not None
            res.append((out.texts, flags[i * n:(i + 1) * n], out.first_logits))
        return res


STAGE_MOVED = {**moved(config="RefusalConfig"),
               "max_new_tokens": "config=RefusalConfig(generation=GenerationConfig(max_new_tokens=...))",
               "rank": "config=RefusalConfig(generation=GenerationConfig(subspace_rank=...))",
               "ablate_positions": "config=RefusalConfig(selection=SelectionConfig(ablate_positions=...))",
               "judge": "the test prompts: TestPrompts(model, data, judge=...)",
               "test": "data=TestPrompts(model, data, ...)"}


def _setup(model: Model, data: RefusalData | TestPrompts, config: RefusalConfig | None, runtime: Runtime | None
           ) -> tuple[TestPrompts, RefusalConfig, Runtime, str]:
    """The test prompts (``data`` wrapped when it is plain), the config, the runtime (default batch size 64) and
    where the ablation acts (``config.selection.ablate_at()``)."""
    test = data if isinstance(data, TestPrompts) else TestPrompts(model, data)
    if test.model is not model:
        raise ValueError("these TestPrompts belong to another model; build TestPrompts(model, data) for this one")
    cfg = config if config is not None else RefusalConfig()
    return test, cfg, runtime if runtime is not None else Runtime(batch_size=64, progress=False), cfg.selection.ablate_at()


@moved_keywords(STAGE_MOVED)
def evaluate(model: Model, data: RefusalData | TestPrompts, cand: Candidates, sel: Selection, tokens: RefusalTokens,
             config: RefusalConfig | None = None, runtime: Runtime | None = None) -> Evaluation:
    """Generate, judge and score the test prompts under every condition (over-refusal on the borderline set
    too); KL / CE on harmless answers under the ablation and under the random ablation (its control); generate the
    harmful test prompts with the direction baked into the weights, and compare baked with hook logits. Weights act
    on every token alike, so under ``ablate_positions="post_instruction"`` the baked condition is
    ``"harmful/baked weights (every token)"`` and is compared with the every-token hook, not with the run's
    post-instruction ablation (``hook_vs_baked["compared_with"]`` says which).

    ``data``: the run's prompts, or its :class:`TestPrompts` (shared by the later stages; its ``judge``);
    ``config``: ``generation.max_new_tokens``, ``selection.ablate_at()``; ``runtime``: batch size, the seed of the
    random controls."""
    test, cfg, rt, ablate_positions = _setup(model, data, config, runtime)
    data, max_new_tokens, batch_size, seed, judge = test.data, cfg.generation.max_new_tokens, rt.batch_size, rt.seed, test.judge
    direction = sel.direction(cand, model.name)
    r, v = direction.vectors[0], direction.raw[0]
    gens, refused, logits = {}, {}, {}
    baked = steering.bake(model, r, allow_inexact=True)
    every_token = ablate_positions == "all"   # the run's ablation is the weight edit itself
    baked_name = BAKED if every_token else BAKED_EVERY_TOKEN
    rand_u = random_directions(model.d_model, 1, seed=seed)[0].vectors[0]
    conditions = make_conditions(r, v, rand_u, sel.layer, seed, data.borderline is not None, ablate_positions)
    conditions[baked_name] = ("harmful", ())
    for which in dict.fromkeys(w for w, _ in conditions.values()):   # each prompt set's conditions stacked
        names = [k for k, (w, _) in conditions.items() if w == which and k != baked_name]
        for name, got in zip(names, test.judged_many(which, [conditions[k][1] for k in names], max_new_tokens,
                                                     batch_size, judge)):
            gens[name], refused[name], logits[name] = got
    gens[baked_name], refused[baked_name], logits[baked_name] = test.judged(
        "harmful", (), max_new_tokens, batch_size, judge, baked.model)
    gens, refused, logits = ({k: d[k] for k in conditions} for d in (gens, refused, logits))
    scores = {k: refusal_score(lg, tokens.tokens).mean().item() for k, lg in logits.items()}
    hook = (logits["harmful/ablation"] if every_token else
            test.last_logits("harmful", (ablation(r, "all"),), batch_size))
    diff = (hook - logits[baked_name]).abs().max()
    equiv = {"max_abs_logit_diff": float(diff), "rel_logit_diff": float(diff / hook.abs().max()),
             "exact_architecture": bool(baked.exact), "notes": baked.notes if every_token else [*baked.notes, NOT_BAKEABLE],
             "compared_with": "harmful/ablation" if every_token else "the every-token hook ablation"}
    controls = {KL_CONTROLS[0]: (ablation(rand_u, ablate_positions),)}  # the same cost of a random ablation,
    if not every_token:                                                  # and of the baked (every-token) edit
        controls[KL_CONTROLS[1]] = (ablation(r, "all"),)
    kl_ce = harmless_kl_ce(model, test.prompts("harmless"), gens["harmless/baseline"], (ablation(r, ablate_positions),),
                           batch_size, controls=controls)
    rates = {k: sum(f) / len(f) for k, f in refused.items()}
    return Evaluation(gens, rates, scores, equiv, kl_ce, refused)


def harmless_kl_ce(model: Model, prompts: list[str], responses: list[str], ivs: tuple, batch_size: int = 64,
                   controls: dict[str, tuple] | None = None) -> dict[str, float]:
    """KL at the first response position, and cross-entropy of the baseline's own responses, without / with ``ivs``;
    each of ``controls`` (name -> interventions) adds its ``"... (name)"`` KL and edited CE, from the same plain pass.
    Only the response columns are unembedded; under edits of the post-instruction and generated tokens only, the
    edited passes reuse the plain pass's keys and values of the earlier columns (exact)."""
    pairs = [(p, r) for p, r in zip(prompts, responses) if r.strip()]
    if not pairs:
        return {}
    _, encs = prepare(model, [p for p, _ in pairs], responses=[r for _, r in pairs])
    runs = {"": ivs} | {f" ({name})": c for name, c in (controls or {}).items()}
    ce: dict[str, list[tuple[float, int]]] = {"baseline": []} | {k: [] for k in runs}
    kls: dict[str, list[torch.Tensor]] = {k: [] for k in runs}
    for b in batches(model, encs, batch_size):
        first = b.response_mask.float().argmax(1) - 1                              # last prompt position
        keep = b.input_ids.shape[1] - int(first.min())                           # the columns unembedded
        base, kv = cached_forward(model, b, keep)
        ids, resp = b.input_ids[:, -keep:], b.response_mask[:, -keep:]
        ce["baseline"].append(cross_entropy(base, ids, resp))
        at = (torch.arange(len(first)), first - (b.input_ids.shape[1] - keep))
        for name, edits in runs.items():
            edited = _edited_logits(model, b, edits, keep, kv)
            ce[name].append(cross_entropy(edited, ids, resp))
            kls[name].append(kl_div(base[at], edited[at]).cpu())
    mean = {k: sum(s for s, _ in v) / max(sum(n for _, n in v), 1) for k, v in ce.items()}
    return {"ce_baseline": mean["baseline"]} | {k: x for name in runs for k, x in (
        (f"kl_first_response_token{name}", float(torch.cat(kls[name]).mean())), (f"ce_edited{name}", mean[name]))}


def _edited_logits(model: Model, b: Any, ivs: tuple, keep: int, kv: Any) -> torch.Tensor:
    """The last ``keep`` columns' logits of ``b`` under ``ivs``, teacher-forced: the response tokens stand for
    generated ones (so a post-instruction ablation acts on them as on every generated token)."""
    start = int(b.post_mask.float().argmax(1).min()) if kv is not None and leaves_prompt_prefix(model, ivs) else 0
    reuse = {"prefix": kv, "start": start} if start > 0 and bool(b.post_mask.any(1).all()) else {}
    with steering.apply(model, *ivs) as handle:
        handle.set_batch(post_mask=b.post_mask | b.response_mask, cached=reuse.get("start", 0))
        out = forward(model, b, logits=keep, **reuse)
    assert out is not None
    return out


def _ablated(model: Model, test: TestPrompts, bases: list[torch.Tensor], tokens: RefusalTokens, max_new_tokens: int,
             batch_size: int, judge: Judge | None = None, positions: str = "all") -> list[tuple[float, float]]:
    """Per basis ``[k, d]`` of ``bases``: harmful test refusal rate and mean refusal score with its span ablated at
    every writer, at ``positions`` (every token, or the post-instruction ones and every generated one)."""
    ivs = [(steering.AblateSubspace(b, sites=WRITERS, positions=positions),)
           for b in bases]
    return [(sum(flags) / len(flags), refusal_score(logits, tokens.tokens).mean().item())
            for _, flags, logits in test.judged_many("harmful", ivs, max_new_tokens, batch_size, judge)]


def _rank_one(ev: Evaluation | None) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """Rank 1 of the subspaces and of their control, as the evaluation measured them (rate, mean score)."""
    names = ("harmful/ablation", "harmful/random ablation")
    if ev is None or not all(n in ev.refusal_rate and n in ev.refusal_score for n in names):
        return None
    return tuple((ev.refusal_rate[n], ev.refusal_score[n]) for n in names)  # type: ignore[return-value]


@moved_keywords(STAGE_MOVED)
def find_subspaces(model: Model, data: RefusalData | TestPrompts, cand: Candidates, sel: Selection,
                   tokens: RefusalTokens, evaluation: Evaluation | None = None, config: RefusalConfig | None = None,
                   runtime: Runtime | None = None) -> Subspaces:
    """Per-category mean differences at the selected site (from the candidates' train activations, no re-capture),
    orthonormalised after the refusal direction; ablate the first k for k = 1..``config.generation.subspace_rank``
    on harmful test prompts (``data``, ``config`` and ``runtime`` as in :func:`evaluate`).

    The control ablates the first k of ``rank`` random orthogonal directions (nested, seeded with ``runtime.seed``):
    a subspace of the same rank that should leave refusal as it is.
    ``evaluation`` (the evaluation stage of the same direction, prompts and seed) already measured rank 1: its
    ablation of the refusal direction, and of the seeded random direction that spans the control's first rank.
    """
    test, cfg, rt, ablate_positions = _setup(model, data, config, runtime)
    data, rank, max_new_tokens, batch_size, seed = (test.data, cfg.generation.subspace_rank,
                                                    cfg.generation.max_new_tokens, rt.batch_size, rt.seed)
    judge = test.judge
    cats = sorted(set(data.harmful["train"].categories))
    if len(cats) < 2:
        return Subspaces(cats, [], [], [])
    li, pi = sel.layer_index, sel.position_index
    h, s_mean = cand.harmful_acts[:, li, pi], cand.harmless_acts[:, li, pi].mean(0)
    labels = data.harmful["train"].categories
    vecs = torch.stack([h[[i for i, c in enumerate(labels) if c == cat]].mean(0) - s_mean for cat in cats])
    order = vecs.norm(dim=-1).argsort(descending=True)
    r = sel.direction(cand, model.name).vectors[0]
    basis = torch.linalg.qr(torch.cat([r[None], vecs[order]]).T).Q.T               # refusal direction first
    k_max = min(rank, basis.shape[0])
    rand = torch.stack([d.vectors[0] for d in random_directions(model.d_model, k_max, seed=seed)])
    rand = torch.linalg.qr(rand.T.double()).Q.T.to(basis.dtype)
    out = Subspaces([cats[i] for i in order.tolist()], [], [], [])
    known = _rank_one(evaluation)
    todo = [k for k in range(1, k_max + 1) if not (k == 1 and known is not None)]
    got = iter(_ablated(model, test, [b[:k] for k in todo for b in (basis, rand)], tokens, max_new_tokens,
                        batch_size, judge, ablate_positions))
    for k in range(1, k_max + 1):
        if k == 1 and known is not None:
            (k_rate, score), (c_rate, c_score) = known
        else:
            (k_rate, score), (c_rate, c_score) = next(got), next(got)
        out.ranks.append(k)
        out.rates.append(k_rate)
        out.scores.append(score)
        out.control_rates.append(c_rate)
        out.control_scores.append(c_score)
    return out


__all__ = ["Evaluation", "Subspaces", "TestPrompts", "evaluate", "find_subspaces", "harmless_kl_ce"]
