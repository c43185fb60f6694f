"""The refusal-direction analysis (Arditi et al. 2024) end to end, stage by stage, resumable.

find refusal tokens -> candidate directions (difference of means at every layer x post-instruction
position) -> score candidates (bypass, induce, KL; batched) -> select with the paper's filters ->
evaluate on test prompts (hook ablation, baked weights, addition, random controls, KL / CE) -> per-category
subspaces -> outputs (direction, metrics.json, generations.jsonl, report.html, optional baked model).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from evals.judge import is_refusal
from interp.capture import capture
from interp.io import atomic_write, write_json
from interp.models import Model, load_model
from pipelines.refusal import scoring as S
from pipelines.refusal.data import RefusalData, load_refusal_data

OUR_FILES = ("metrics.json", "generations.jsonl", "report.html", "run.json", "direction", "stages", "model")


@dataclass
class RefusalConfig:
    model: str = "organism"
    harmful: str | None = None
    harmless: str | None = None
    column: str | None = None
    harmless_column: str | None = None
    n_train: int = 64
    n_val: int = 32
    n_test: int = 64
    kl_threshold: float = 0.1
    prune_layer_fraction: float = 0.2
    induce_threshold: float = 0.0
    max_new_tokens: int = 24
    batch_size: int = 64
    max_rows: int = 256
    subspace_rank: int = 8
    layers: list[int] | None = None
    seed: int = 0
    dtype: str | None = None
    device: str | None = None
    save_model: bool = False

    def key(self, *fields_: str) -> str:
        d = asdict(self)
        return hashlib.sha256(json.dumps({k: d[k] for k in fields_}, sort_keys=True).encode()).hexdigest()[:16]


DATA_KEYS = ("model", "harmful", "harmless", "column", "harmless_column", "n_train", "n_val", "n_test", "seed", "dtype")


@dataclass
class RefusalResult:
    out: Path
    metrics: dict[str, Any]
    direction: Any = None
    notes: list[str] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return self.direction is not None


class Run:
    """The run folder: refuses another run's folder unless ``overwrite``; never deletes a user's files."""

    def __init__(self, out: str | Path, cfg: RefusalConfig, overwrite: bool):
        self.out = Path(out)
        self.cfg = cfg
        if self.out.exists() and not self.out.is_dir():
            raise FileExistsError(f"{self.out} is a file; choose an output folder")
        self.out.mkdir(parents=True, exist_ok=True)
        foreign = [p.name for p in self.out.iterdir() if p.name not in OUR_FILES]
        if foreign:
            raise FileExistsError(f"{self.out} holds files that are not from a refusal run ({foreign[:3]}); choose "
                                  f"an empty or new --out folder (nothing was deleted)")
        run_file = self.out / "run.json"
        key = cfg.key(*[f for f in asdict(cfg) if f != "save_model"])
        if run_file.exists():
            old = json.loads(run_file.read_text())
            if old.get("key") != key:
                if not overwrite:
                    raise FileExistsError(f"{self.out} holds another refusal run (different settings); pass "
                                          f"--overwrite to replace it, or choose another --out")
                import shutil

                for name in OUR_FILES:  # only our own outputs
                    p = self.out / name
                    if p.is_dir():
                        shutil.rmtree(p)
                    elif p.exists():
                        p.unlink()
        (self.out / "stages").mkdir(exist_ok=True)
        write_json(run_file, {"key": key, "config": asdict(cfg)})

    def stage(self, name: str, compute: Callable[[], dict]) -> tuple[dict, bool]:
        """Load a finished stage or compute and save it; returns ``(result, was_cached)``."""
        f = self.out / "stages" / f"{name}.pt"
        if f.exists():
            return torch.load(f, weights_only=False), True
        res = compute()
        atomic_write(f, lambda tmp: torch.save(res, tmp))
        return res, False


def _first_token_and_refusal(gens: Any) -> tuple[list[int], list[bool]]:
    first = [ids[0] if ids else -1 for ids in gens.token_ids]
    return first, [is_refusal(t) for t in gens.texts]


def run_refusal(cfg: RefusalConfig, out: str | Path, overwrite: bool = False, progress: Any = None,
                model: Model | None = None) -> RefusalResult:
    """Run (or resume) the analysis into ``out``. ``progress(stage, status)`` is called around each stage."""
    import steering
    from probes.directions import diff_of_means, random_directions, random_orthogonal

    say = progress or (lambda stage, status: None)
    run = Run(out, cfg, overwrite)
    data: RefusalData = load_refusal_data(cfg.harmful, cfg.harmless, cfg.column, cfg.harmless_column, cfg.n_train,
                                          cfg.n_val, cfg.n_test, cfg.seed)
    for what, parts in (("harmful", data.harmful), ("harmless", data.harmless)):
        for part, ps in parts.items():
            if len(ps) < 2:
                raise ValueError(f"the {what} {part} split has {len(ps)} prompts; at least 2 are needed per class")
    model = model or load_model(cfg.model, dtype=cfg.dtype, device=cfg.device)
    torch.manual_seed(cfg.seed)
    notes: list[str] = []
    from interp.chat import has_chat_template

    if not has_chat_template(model):
        notes.append("the model has no chat template: prompts use the plain 'User: ...\\nAssistant:' fallback")
    gen_kw = dict(max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size, progress=False)
    L = model.n_layers

    # 1. refusal tokens from the model's own refusals ------------------------------------------------
    def stage_tokens() -> dict:
        short = {**gen_kw, "max_new_tokens": min(cfg.max_new_tokens, 12)}  # the judge needs only the opening
        gh = steering.generate(model, data.harmful["train"].instructions, **short)
        gs = steering.generate(model, data.harmless["train"].instructions, **short)
        fh, rh = _first_token_and_refusal(gh)
        fs, rs = _first_token_and_refusal(gs)
        toks = S.refusal_tokens([f for f, r in zip(fh, rh) if r], [f for f, r in zip(fs, rs) if not r])
        return {"tokens": toks, "strings": [model.tokenizer.decode([t]) for t in toks],
                "train_refusal_harmful": sum(rh) / len(rh), "train_refusal_harmless": sum(rs) / len(rs)}

    say("refusal tokens", "start")
    tok, cached = run.stage("tokens", stage_tokens)
    say("refusal tokens", "cached" if cached else "done")
    metrics: dict[str, Any] = {"model": cfg.model, "family": model.spec.family, "n_layers": L, "data": data.source,
                               "refusal_tokens": tok["strings"], "train_refusal_rate": {
                                   "harmful": tok["train_refusal_harmful"], "harmless": tok["train_refusal_harmless"]}}

    # 2. candidates: difference of means at resid_pre x post-instruction positions -------------------
    def stage_candidates() -> dict:
        layers = cfg.layers if cfg.layers is not None else list(range(L))
        kw = dict(sites="resid_pre", layers=layers, positions="post_instruction", batch_size=cfg.batch_size,
                  progress=False)
        h = capture(model, data.harmful["train"].instructions, **kw)
        s = capture(model, data.harmless["train"].instructions, **kw)
        P = min(h.tensor.shape[2], s.tensor.shape[2])
        X = torch.cat([h.tensor[:, :, -P:], s.tensor[:, :, -P:]])              # [n, L, P, d]
        y = torch.tensor([1] * h.n_prompts + [0] * s.n_prompts)
        n, Lc, _, d = X.shape
        flat = diff_of_means(X.reshape(n, Lc * P, d), y)
        sites = [f"blocks.{layer}.hook_resid_pre" for layer in layers]
        return {"raw": flat.raw.reshape(Lc, P, d), "layers": layers, "P": P, "sites": sites,
                "harmful_acts": h.tensor[:, :, -P:], "harmless_acts": s.tensor[:, :, -P:],
                "fitted_on": flat.fitted_on, "data_hash": flat.data_hash,
                "pos_tokens": _post_tokens(model, P)}

    say("candidates", "start")
    cand, cached = run.stage("candidates", stage_candidates)
    say("candidates", "cached" if cached else "done")
    raw = cand["raw"]                                                            # [Lc, P, d]
    Lc, P, d = raw.shape
    metrics["candidates"] = {"layers": cand["layers"], "positions": list(range(-P, 0)), "position_tokens": cand["pos_tokens"]}

    if not tok["tokens"]:
        notes.append(f"the model refused {tok['train_refusal_harmful']:.0%} of harmful training prompts: it has no "
                     f"refusals to find refusal tokens from, so no refusal direction can be selected")
        return _finish(run, model, cfg, data, metrics, None, notes, {}, say)

    # 3. score every candidate in batches -------------------------------------------------------------
    def stage_scores() -> dict:
        toks = tok["tokens"]
        eh = S.encode_prompts(model, data.harmful["val"].instructions)
        es = S.encode_prompts(model, data.harmless["val"].instructions)
        base_h = S.baseline_logits(model, eh)
        base_s = S.baseline_logits(model, es)
        units = torch.nn.functional.normalize(raw.reshape(Lc * P, d), dim=-1)
        layer_of = torch.tensor(cand["layers"]).repeat_interleave(P)
        bypass = S.refusal_score(S.score_rows(model, eh, units, "ablate", max_rows=cfg.max_rows), toks).mean(1)
        abl_s = S.score_rows(model, es, units, "ablate", max_rows=cfg.max_rows)                    # [C, N, V]
        kl = S.kl_last(base_s[None].expand_as(abl_s), abl_s).mean(1)
        induce = S.refusal_score(S.score_rows(model, es, raw.reshape(Lc * P, d), "add", layer_of,
                                              max_rows=cfg.max_rows), toks).mean(1)
        return {"bypass": bypass.view(Lc, P), "induce": induce.view(Lc, P), "kl": kl.view(Lc, P),
                "baseline_harmful": S.refusal_score(base_h, toks).mean().item(),
                "baseline_harmless": S.refusal_score(base_s, toks).mean().item()}

    say("scoring", "start")
    sc, cached = run.stage("scores", stage_scores)
    say("scoring", "cached" if cached else "done")

    # 4. selection with the paper's filters -----------------------------------------------------------
    layers_t = torch.tensor(cand["layers"])[:, None].expand(Lc, P)
    keep_layer = layers_t < math.floor(L * (1 - cfg.prune_layer_fraction))
    keep_kl = sc["kl"] < cfg.kl_threshold
    keep_induce = sc["induce"] > cfg.induce_threshold
    keep_bypass = sc["bypass"] < sc["baseline_harmful"]
    ok = keep_layer & keep_kl & keep_induce & keep_bypass
    metrics["selection"] = {
        "baseline_refusal_score": {"harmful": sc["baseline_harmful"], "harmless": sc["baseline_harmless"]},
        "filters": {"kl_threshold": cfg.kl_threshold, "prune_layer_fraction": cfg.prune_layer_fraction,
                    "induce_threshold": cfg.induce_threshold},
        "passing": {"layer": int(keep_layer.sum()), "kl": int(keep_kl.sum()), "induce": int(keep_induce.sum()),
                    "bypass": int(keep_bypass.sum()), "all": int(ok.sum()), "of": Lc * P},
    }
    if not ok.any():
        notes.append(f"no candidate passes the filters (layer < {1 - cfg.prune_layer_fraction:.0%} of depth, KL < {cfg.kl_threshold}, induce score > {cfg.induce_threshold}, bypass "
                     "below baseline): no refusal direction is reported")
        return _finish(run, model, cfg, data, metrics, None, notes, {"scores": sc, "cand": cand}, say)
    masked = torch.where(ok, sc["bypass"], torch.full_like(sc["bypass"], float("inf")))
    flat_i = int(masked.flatten().argmin())
    li, pi = divmod(flat_i, P)
    layer = cand["layers"][li]
    from probes.objects import Direction

    direction = Direction.from_vectors(raw[li, pi][None], [cand["sites"][li]], method="mean_diff",
                                       model_id=model.name, data_hash=cand["data_hash"], fitted_on=cand["fitted_on"],
                                       meta={"position": pi - P, "position_token": cand["pos_tokens"][pi],
                                             "layer": layer, "pipeline": "refusal"})
    metrics["selection"].update({"layer": layer, "position": pi - P, "position_token": cand["pos_tokens"][pi],
                                 "bypass_score": float(sc["bypass"][li, pi]), "induce_score": float(sc["induce"][li, pi]),
                                 "kl": float(sc["kl"][li, pi]), "norm": float(direction.norms[0])})

    # 5. evaluation on test prompts --------------------------------------------------------------------
    r = direction.vectors[0]
    v = direction.raw[0]

    def stage_eval() -> dict:
        rand_u = random_directions(d, 1, seed=cfg.seed)[0].vectors[0]
        orth_u = random_orthogonal(r[None], 1, seed=cfg.seed)[0].vectors[0]
        H, Hl = data.harmful["test"].instructions, data.harmless["test"].instructions
        conds = {
            "harmful/baseline": (H, ()),
            "harmful/ablation": (H, (steering.DirectionalAblation(r),)),
            "harmful/random ablation": (H, (steering.DirectionalAblation(rand_u),)),
            "harmful/orthogonal ablation": (H, (steering.DirectionalAblation(orth_u),)),
            "harmless/baseline": (Hl, ()),
            "harmless/addition": (Hl, (steering.AddVector(v, layers=layer, sites="resid_pre"),)),
            "harmless/random addition": (Hl, (steering.AddVector(rand_u * v.norm(), layers=layer, sites="resid_pre"),)),
            "harmless/orthogonal addition": (Hl, (steering.AddVector(orth_u * v.norm(), layers=layer, sites="resid_pre"),)),
        }
        gens, rates, scores = {}, {}, {}
        toks = tok["tokens"]
        for name, (prompts, ivs) in conds.items():
            gg = steering.generate(model, prompts, *ivs, **gen_kw)
            gens[name] = gg.texts
            rates[name] = sum(is_refusal(t) for t in gg.texts) / len(gg.texts)
            enc = S.encode_prompts(model, prompts)
            with (steering.apply(model, *ivs) if ivs else nullcontext()):
                scores[name] = S.refusal_score(S.baseline_logits(model, enc), toks).mean().item()
        baked = steering.bake(model, r, allow_inexact=True)
        gb = steering.generate(baked.model, H, **gen_kw)
        gens["harmful/baked weights"] = gb.texts
        rates["harmful/baked weights"] = sum(is_refusal(t) for t in gb.texts) / len(gb.texts)
        enc_h = S.encode_prompts(model, H)
        with steering.apply(model, steering.DirectionalAblation(r)):
            hook_logits = S.baseline_logits(model, enc_h)
        baked_logits = S.baseline_logits(baked.model, enc_h)
        scores["harmful/baked weights"] = S.refusal_score(baked_logits, toks).mean().item()
        equiv = {"max_abs_logit_diff": float((hook_logits - baked_logits).abs().max()),
                 "rel_logit_diff": float((hook_logits - baked_logits).abs().max() / hook_logits.abs().max()),
                 "exact_architecture": bool(baked.exact), "notes": baked.notes}
        kl_ce = _kl_ce(model, Hl, gens["harmless/baseline"], (steering.DirectionalAblation(r),), cfg)
        return {"gens": gens, "rates": rates, "scores": scores, "equivalence": equiv, "kl_ce": kl_ce}

    say("evaluation", "start")
    ev, cached = run.stage("evaluation", stage_eval)
    say("evaluation", "cached" if cached else "done")
    metrics["evaluation"] = {"refusal_rate": ev["rates"], "refusal_score": ev["scores"],
                             "hook_vs_baked": ev["equivalence"], "harmless_kl_ce": ev["kl_ce"]}

    # 6. per-category subspaces ------------------------------------------------------------------------
    def stage_subspace() -> dict:
        cats = sorted(set(data.harmful["train"].categories))
        if len(cats) < 2:
            return {"categories": cats, "ranks": [], "rates": [], "scores": []}
        kw = dict(sites=cand["sites"][li], positions=pi - P, batch_size=cfg.batch_size, progress=False)
        h = capture(model, data.harmful["train"].instructions, **kw).tensor[:, 0]
        s_mean = capture(model, data.harmless["train"].instructions, **kw).tensor[:, 0].mean(0)
        labels = data.harmful["train"].categories
        vecs = torch.stack([h[[i for i, c in enumerate(labels) if c == cat]].mean(0) - s_mean for cat in cats])
        order = vecs.norm(dim=-1).argsort(descending=True)
        basis = torch.linalg.qr(torch.cat([r[None], vecs[order]]).T).Q.T            # refusal direction first
        ranks, rates, scores = [], [], []
        H = data.harmful["test"].instructions
        enc = S.encode_prompts(model, H)
        for k in range(1, min(cfg.subspace_rank, basis.shape[0]) + 1):
            iv = steering.AblateSubspace(basis[:k], sites=("resid_pre", "attn_out", "mlp_out"))
            gg = steering.generate(model, H, iv, **gen_kw)
            rates.append(sum(is_refusal(t) for t in gg.texts) / len(gg.texts))
            with steering.apply(model, iv):
                scores.append(S.refusal_score(S.baseline_logits(model, enc), tok["tokens"]).mean().item())
            ranks.append(k)
        return {"categories": [cats[i] for i in order.tolist()], "ranks": ranks, "rates": rates, "scores": scores}

    say("subspaces", "start")
    sub, cached = run.stage("subspaces", stage_subspace)
    say("subspaces", "cached" if cached else "done")
    metrics["subspaces"] = {"basis_order": ["refusal direction"] + sub["categories"], "rank": sub["ranks"],
                            "harmful_refusal_rate": sub["rates"], "harmful_refusal_score": sub["scores"]}
    extra = {"scores": sc, "cand": cand, "eval": ev, "sub": sub, "li": li, "pi": pi}
    return _finish(run, model, cfg, data, metrics, direction, notes, extra, say)


def _post_tokens(model: Model, P: int) -> list[str]:
    from interp.chat import format_prompts

    text = format_prompts(model, ["x"])[0]
    ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
    return [model.tokenizer.decode([t]) for t in ids[-P:]]


def _kl_ce(model: Model, prompts: list[str], responses: list[str], ivs: tuple, cfg: RefusalConfig) -> dict:
    """KL at the first response position and cross-entropy of the baseline's own responses, with and without."""
    import steering
    from interp.forward import batches, prepare

    pairs = [(p, r) for p, r in zip(prompts, responses) if r.strip()]
    if not pairs:
        return {}
    texts, encs = prepare(model, [p for p, _ in pairs], responses=[r for _, r in pairs])
    out = {"baseline": [], "edited": []}
    kls = []
    for b in batches(model, encs, cfg.batch_size):
        dev = model.device
        inputs = {k: v.to(dev) for k, v in b.model_inputs.items()}
        labels = b.input_ids.clone()
        labels[~b.response_mask] = -100
        res = {}
        for name, ctx in (("baseline", None), ("edited", ivs)):
            with torch.inference_mode():
                if ctx:
                    with steering.apply(model, *ctx):
                        logits = model.hf(**inputs, use_cache=False).logits.float().cpu()
                else:
                    logits = model.hf(**inputs, use_cache=False).logits.float().cpu()
            res[name] = logits
            ce = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:], reduction="sum",
                                                   ignore_index=-100)
            out[name].append((ce.item(), int((labels[:, 1:] != -100).sum())))
        first = b.response_mask.float().argmax(1) - 1                              # last prompt position
        ar = torch.arange(b.input_ids.shape[0])
        kls.append(S.kl_last(res["baseline"][ar, first], res["edited"][ar, first]))
    ce = {k: sum(a for a, _ in v) / max(sum(n for _, n in v), 1) for k, v in out.items()}
    return {"kl_first_response_token": float(torch.cat(kls).mean()), "ce_baseline": ce["baseline"],
            "ce_edited": ce["edited"]}


def _finish(run: Run, model: Model, cfg: RefusalConfig, data: RefusalData, metrics: dict, direction: Any,
            notes: list[str], extra: dict, say: Callable) -> RefusalResult:
    from pipelines.refusal.report import refusal_report

    metrics["found_direction"] = direction is not None
    metrics["notes"] = notes
    out = run.out
    if direction is not None:
        if (out / "direction").exists():
            import shutil

            shutil.rmtree(out / "direction")
        direction.save(out / "direction")
        ev = extra["eval"]
        lines = []
        for cond, texts in ev["gens"].items():
            prompts = data.harmful["test"] if cond.startswith("harmful") else data.harmless["test"]
            for p, t, c in zip(prompts.instructions, texts, prompts.categories):
                lines.append(json.dumps({"condition": cond, "instruction": p, "category": c, "response": t,
                                         "refused": is_refusal(t)}))
        atomic_write(out / "generations.jsonl", lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))
        if cfg.save_model:
            say("save model", "start")
            import steering

            baked = steering.bake(model, direction.vectors[0], allow_inexact=True).model
            target = out / "model"
            if target.exists():
                import shutil

                shutil.rmtree(target)
            baked.hf.save_pretrained(target)
            model.tokenizer.save_pretrained(target)
            metrics["saved_model"] = str(target)
            say("save model", "done")
    write_json(out / "metrics.json", metrics)
    say("report", "start")
    html = refusal_report(metrics, extra, model_name=model.name)
    atomic_write(out / "report.html", lambda tmp: Path(tmp).write_text(html))
    say("report", "done")
    return RefusalResult(out, metrics, direction, notes)
