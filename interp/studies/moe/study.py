"""The study: the refusal direction of a mixture of experts (the kit's selection), ablated from attention, dense
MLPs + shared experts and routed experts alone and jointly, a random orthogonal direction, category subspaces of
rank 1..k, judged rates for the main conditions, and the joint edit baked into the weights against the hooks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import torch

import steering
from interp.evals.judge import Judge, load_judge
from interp.evals.rates import Rate
from interp.forward import prepare
from interp.models import Model
from interp.studies.kit.config import DataConfig
from interp.studies.kit.direction import own_direction
from interp.studies.kit.prompt_sets import RefusalData, load_refusal_data
from interp.studies.kit.stages import find_refusal_tokens
from interp.studies.moe.conditions import ALONE, JOINT, bake_check, writer_conditions, writer_sites
from interp.studies.moe.config import MoeConfig
from interp.studies.moe.measure import Removal, category_bases, category_rows, overlap, scores
from interp.studies.moe.result import MoeRefusal
from interp.values import Runtime
from probes.directions import random_orthogonal

MANY = 10 ** 6   # "every prompt of the split"


def refusal_direction(model: Model, cfg: MoeConfig, rt: Runtime) -> tuple[list[int], dict[str, Any], torch.Tensor]:
    """The model's refusal tokens and its own direction by the kit's selection (train / val prompts)."""
    n = cfg.n_direction
    rd = load_refusal_data(model.name, DataConfig(n_train=n, n_val=n, n_test=2, borderline="none"), runtime=rt)
    toks = find_refusal_tokens(model, rd, batch_size=rt.batch_size)
    if not toks.tokens:
        raise ValueError(f"{model.name} refused none of the {n} harmful train prompts, so it has no refusal to "
                         f"remove; use a safety-tuned model (load_model('smollm2-moe-aligned')) or pass direction= "
                         f"and tokens=")
    d = own_direction(model, rd, toks, rt.batch_size, list(range(0, model.n_layers, cfg.layer_stride)))
    return toks.tokens, {"layer": d.layer, "how": d.how, "raw_norm": float(d.raw.norm())}, d.unit


def _checked(model: Model, direction: Any, tokens: Sequence[int]) -> tuple[torch.Tensor, list[int]]:
    r = torch.as_tensor(direction).detach().float().cpu()
    if r.shape != (model.d_model,) or not abs(float(r.norm()) - 1) < 1e-4:
        raise ValueError(f"direction must be a unit vector of width {model.d_model}, got shape {tuple(r.shape)} and "
                         f"norm {float(r.norm()):.4g}; pass direction / direction.norm()")
    toks, vocab = [int(t) for t in tokens], int(model.hf.get_output_embeddings().weight.shape[0])
    if not toks or not all(0 <= t < vocab for t in toks):
        raise ValueError(f"tokens must be refusal token ids in [0, {vocab}), got {list(tokens)[:8]}")
    return r, toks


def writer_study(model: Model, encs: Any, harmless: Any, r: torch.Tensor, toks: list[int], cfg: MoeConfig,
                 rt: Runtime) -> dict[str, Any]:
    """Scores and fractions removed for the writer conditions, the joint-only share and the random directions."""
    bs, seed = rt.batch_size, rt.seed
    base = scores(model, encs, [], toks, bs)
    rem = Removal(base, scores(model, harmless, [], toks, bs), cfg.n_boot, seed)
    conds = writer_conditions(model, r)
    s = {name: scores(model, encs, edits, toks, bs) for name, edits in conds.items()}
    sites = writer_sites(model)
    writers = {name: {**rem.fraction(s[name]), "sites": "; ".join(f"{site} {ls}" for site, ls in sites[name])}
               for name in conds}
    rnd = [q.vectors[0] for q in random_orthogonal(r[None], cfg.n_random, seed=seed)]
    random = [{**rem.fraction(scores(model, encs, writer_conditions(model, u)[JOINT], toks, bs)),
               "cos": float(u.double() @ r.double())} for u in rnd]
    return {"rem": rem, "writers": writers, "joint_only": rem.joint_only([s[a] for a in ALONE], s[JOINT]),
            "random": random, "random_dirs": rnd}


def subspace_sweep(model: Model, rem: Removal, encs: Any, r: torch.Tensor, toks: list[int], layer: int,
                   cfg: MoeConfig, rt: Runtime) -> dict[str, list[dict[str, float]]]:
    """Each category's subspace (and a random one orthogonal to ``r``) of every rank, ablated jointly."""
    data = load_refusal_data(model.name, DataConfig(n_train=MANY, n_val=MANY, n_test=1, borderline="none"),
                             runtime=rt)
    prompts = data.harmful["train"].instructions + data.harmful["val"].instructions
    labels = data.harmful["train"].categories + data.harmful["val"].categories
    missing = [c for c in cfg.categories if c not in labels]
    if missing:
        raise ValueError(f"no harmful prompts of categories {missing}; choose among {sorted(set(labels))}")
    top, acts = max(cfg.ranks), category_rows(model, prompts, labels, layer, rt)
    raw = category_bases(acts, labels, cfg.categories, cfg.n_category, top)
    bases = category_bases(acts, labels, cfg.categories, cfg.n_category, top, r) if cfg.exclude_refusal else raw
    bases["random subspace"] = raw["random subspace"] = torch.stack(
        [q.vectors[0] for q in random_orthogonal(r[None], top, seed=rt.seed + 7)])
    out = {}
    for name, q in bases.items():
        out[name] = [{"rank": k, **rem.fraction(scores(model, encs, writer_conditions(model, q[:k])[JOINT], toks,
                                                       rt.batch_size)), "overlap": overlap(raw[name][:k], r)}
                     for k in cfg.ranks]
    return out


def judged_rates(model: Model, prompts: list[str], r: torch.Tensor, u: torch.Tensor, cfg: MoeConfig, judge: Judge,
                 rt: Runtime) -> dict[str, Rate]:
    """Judged refusal rates of greedy answers: nothing ablated, each condition, the first random direction."""
    if cfg.n_generate == 0:
        return {}
    conds = {"baseline": [], **writer_conditions(model, r), "random": writer_conditions(model, u)[JOINT]}
    return {name: steering.generate_and_judge(model, prompts[:cfg.n_generate], *edits, judge=judge,
                                              max_new_tokens=cfg.max_new_tokens, runtime=rt)
            for name, edits in conds.items()}


def moe_refusal(model: Model, config: MoeConfig | None = None, direction: Any = None,
                tokens: Sequence[int] | None = None, judge: Judge | str | None = None,
                runtime: Runtime | None = None) -> MoeRefusal:
    """The whole study on a mixture of experts (see :class:`MoeRefusal`). ``direction`` (a unit ``[d]``) and
    ``tokens`` (refusal token ids) together replace the model's own (found by the kit's selection when both are
    None); ``judge``: a :func:`interp.evals.judge.load_judge` spec (default the phrase judge); ``runtime``: batch
    size and seed."""
    cfg = config if config is not None else MoeConfig()
    rt = runtime if runtime is not None else Runtime(batch_size=16, progress=False)
    writer_sites(model)  # a dense model is refused before any work
    if (direction is None) != (tokens is None):
        raise ValueError("pass direction= and tokens= together, or neither (the model's own are then found)")
    if direction is None:
        toks, info, r = refusal_direction(model, cfg, rt)
    else:
        r, toks = _checked(model, direction, tokens)
        info = {"layer": model.n_layers // 2, "how": "given", "raw_norm": 1.0}
    test = load_refusal_data(model.name, DataConfig(n_train=1, n_val=1, n_test=cfg.n_eval, borderline="none"),
                             runtime=rt)
    encs = prepare(model, test.harmful["test"].instructions)[1]
    harmless = prepare(model, test.harmless["test"].instructions)[1]
    w = writer_study(model, encs, harmless, r, toks, cfg, rt)
    sub = subspace_sweep(model, w["rem"], encs, r, toks, info["layer"], cfg, rt)
    rates = judged_rates(model, test.harmful["test"].instructions, r, w["random_dirs"][0], cfg, load_judge(judge), rt)
    bake = bake_check(model, r, encs[:16], rt.batch_size, cfg.tolerance)
    notes = _notes(test, cfg)
    return MoeRefusal(model.name, info, [model.tokenizer.decode([t]) for t in toks], len(encs),
                      float(w["rem"].base.mean()), float(w["rem"].harmless.mean()), w["writers"], w["joint_only"],
                      w["random"], list(cfg.ranks), sub, rates, bake, notes, asdict(cfg))


def _notes(test: RefusalData, cfg: MoeConfig) -> list[str]:
    return [f"prompts: {test.source['harmful']} (harmful, test split) and {test.source['harmless']} (harmless)",
            "category subspaces: per prompt of the category, its resid_pre at the direction's layer minus the mean of "
            "the other harmful categories' prompts" + (", the refusal direction projected out" if cfg.exclude_refusal
                                                       else "") + "; top singular vectors (train + val splits); "
            "overlap: the refusal direction's projection norm into the subspace built without projecting it out",
            *(["the seed's 'sexual content' category is not in our set; 'harassment' stands in"]
              if "harassment" in cfg.categories else [])]


__all__ = ["judged_rates", "moe_refusal", "refusal_direction", "subspace_sweep", "writer_study"]
