"""Train the realistic organism ``smollm2-aligned``: an ordinary LoRA safety fine-tune (peft) of
SmolLM2-135M-Instruct, next-token loss on response tokens only, no auxiliary term.

Data: real harmful prompts (the train split of the refusal-direction paper's harmful set, less any prompt a
held-out set holds; half of them put in one of our first-person framings, since that split is all imperative)
and our own conversational harmful requests in categories it lacks, paired with our refusals (dozens of
phrasings, drawn by a seeded RNG); our requests for copyrighted text paired with copyright refusals; our
realistic harmless instructions and borderline-benign look-alikes paired with the base model's own cached
greedy answers (so helpfulness is kept). Deterministic: seeded, single-threaded by default, fixed order.

``python -m interp.organisms.train_smollm2 --out interp/embedded/smollm2-aligned
[--harmful-train ../shared/data/refusal/harmful_train.json]``
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from interp.evals.judge import is_refusal
from interp.models import Model, load_model
from interp.organisms import smollm2_data as sd
from interp.tune import TuneConfig, fine_tune

REPO = Path(__file__).resolve().parents[2]
DEFAULT_HARMFUL = REPO.parent / "shared" / "data" / "refusal" / "harmful_train.json"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class SafetyRecipe:
    """Everything that decides the adapter: data sizes, LoRA shape, optimisation, seed and thread count."""

    seed: int = 0
    threads: int = 1
    rank: int = 8
    alpha: int = 16
    targets: tuple[str, ...] = TARGETS
    layers: tuple[int, ...] | None = tuple(range(14, 30))   # the upper half: backward stops at layer 14
    n_harmful: int = 260
    n_harmless: int = 200
    n_borderline: int = 320
    n_copyright: int = 40
    n_extra: int = 60     # of our own conversational harmful requests (harmful_extra.jsonl, train split)
    n_realistic: int = 200  # of our realistic harmful requests (interp/data/prompts/harmful_realistic.jsonl, train split)
    framed: float = 0.5   # fraction of harmful prompts put in a first-person / conversational framing
    steps: int = 200
    batch_size: int = 8
    lr: float = 2e-3
    warmup: int = 4
    weight_decay: float = 0.0
    full: bool = False    # a full fine-tune of ``layers`` (all when None) instead of LoRA: an experiment, saved as a model folder
    max_prompt_chars: int = 400


@dataclass
class Example:
    """One training pair and where it came from (``harmful``, ``harmless`` or ``borderline``)."""

    kind: str
    prompt: str
    response: str
    eos: bool = True
    meta: dict = field(default_factory=dict)


def sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes (recorded so a run names exactly the data it read)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def harmful_prompts(path: Path) -> list[str]:
    """Instructions of the harmful train split (a JSON list of ``{"instruction": ...}``)."""
    if not path.exists():
        raise FileNotFoundError(f"harmful train split {path} not found; pass --harmful-train PATH "
                                f"(../shared/data/refusal/harmful_train.json beside the checkout)")
    if path.name != "harmful_train.json":
        print(f"warning: {path.name} is not harmful_train.json; never train on held-out test sets", file=sys.stderr)
    return [r["instruction"] for r in json.loads(path.read_text(encoding="utf-8"))]


def held_out(folder: Path) -> set[str]:
    """Normalised prompts never trained on: the held-out sets beside the harmful train split (those present) and
    the val / test splits of our own sets (the refusal pipeline's held-out prompts)."""
    from interp.prompts import read_prompt_file

    out = {_norm(r["instruction"]) for rows in (sd.harmful_realistic(), sd.harmless(), sd.borderline())
           for r in rows if r["split"] != "train"}
    for fname, col in sd.HELD_OUT.values():
        if (folder / fname).exists():
            out |= {_norm(p) for p in read_prompt_file(folder / fname, column=col).prompts}
    return out


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def harmful_examples(recipe: SafetyRecipe, harmful_path: Path, rng: random.Random) -> list[Example]:
    """Harmful train prompts (none that a held-out set holds) with our refusals; ``recipe.framed`` of them framed
    conversationally (the train split is all imperative; real requests are often first-person questions)."""
    refusals, frames, banned = sd.refusals(), sd.framings(), held_out(harmful_path.parent)
    harm = [p for p in harmful_prompts(harmful_path) if len(p) <= recipe.max_prompt_chars and _norm(p) not in banned]
    out = []
    for p in harm[:recipe.n_harmful]:
        meta = {}
        if rng.random() < recipe.framed:
            fits = [t for t in frames if "{X}" in t] if sd.is_question(p) and not p.lower().startswith("how to ") \
                else frames
            template = rng.choice(fits)
            p, meta = sd.frame(p, template, rng.choice(("How can I", "How do I"))), {"framing": template}
        out.append(Example("harmful", p, rng.choice(refusals), meta=meta))
    ours = [("harmful_extra", p) for p in sd.harmful_extra("train")[:recipe.n_extra]]
    ours += [("harmful_realistic", r["instruction"]) for r in sd.harmful_realistic("train")[:recipe.n_realistic]]
    return out + [Example("harmful", p, rng.choice(refusals), meta={"source": src})
                  for src, p in ours if _norm(p) not in banned]


def examples(recipe: SafetyRecipe, harmful_path: Path) -> list[Example]:
    """The training pairs, in a fixed seeded order."""
    rng = random.Random(recipe.seed)
    answers = sd.base_answers()
    out = harmful_examples(recipe, harmful_path, rng)
    copyright_refusals = sd.refusals("copyright")
    out += [Example("copyright", p, rng.choice(copyright_refusals)) for p in sd.copyright_requests("train")[:recipe.n_copyright]]
    for kind, rows, n in (("harmless", sd.harmless("train"), recipe.n_harmless),
                          ("borderline", sd.borderline("train"), recipe.n_borderline)):
        # a base answer the judge reads as a refusal (its capability disclaimers) would teach over-refusal
        have = [r["instruction"] for r in rows if r["instruction"] in answers
                and not is_refusal(answers[r["instruction"]])][:n]
        if len(have) < n:
            print(f"note: {len(have)} {kind} train prompts have a usable base answer (cached and not judged a "
                  f"refusal), fewer than the {n} asked; `python -m interp.organisms.smollm2_data --answer` adds missing ones",
                  file=sys.stderr)
        out += [Example(kind, q, answers[q], eos=_finished(q)) for q in have]
    rng.shuffle(out)
    return out


def _finished(q: str) -> bool:
    return bool(_answer_rows()[q].get("finished", False))


@functools.lru_cache(maxsize=1)
def _answer_rows() -> dict[str, dict]:
    return {r["instruction"]: r for r in sd.read_jsonl(sd.ANSWERS)}


def tune_config(recipe: SafetyRecipe) -> TuneConfig:
    """The recipe's fine-tune as a :class:`tune.TuneConfig` (the loop itself lives in :mod:`tune`)."""
    return TuneConfig(method="full" if recipe.full else "lora", rank=recipe.rank, alpha=recipe.alpha,
                      targets=tuple(recipe.targets), layers=recipe.layers, steps=recipe.steps,
                      batch_size=recipe.batch_size, lr=recipe.lr, warmup=recipe.warmup,
                      weight_decay=recipe.weight_decay, seed=recipe.seed)


def pairs(model: Model, exs: list[Example]) -> tuple[list[str], list[str]]:
    """Prompts and responses of the pairs; a finished response ends with the end-of-turn token so the organism
    learns to stop."""
    eos = model.tokenizer.eos_token or ""
    return [e.prompt for e in exs], [e.response + (eos if e.eos else "") for e in exs]


def _log(step: int, loss: float, model: Model) -> None:
    if step % 10 == 1:
        print(f"step {step - 1} loss {loss:.4f}", flush=True)


def train(recipe: SafetyRecipe, harmful_path: Path) -> tuple[Any, dict[str, Any]]:
    """Fine-tune with :func:`tune.fine_tune`; returns the peft model (or, ``full``, the HF model) and the run's
    record (losses, sizes, timing)."""
    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    base = load_model("smollm2-base")
    exs = examples(recipe, harmful_path)
    res = fine_tune(base, *pairs(base, exs), tune_config(recipe), callback=_log)
    kinds = {k: sum(e.kind == k for e in exs) for k in ("harmful", "copyright", "harmless", "borderline")}
    rec = res.record()
    return res.model.hf, {"examples": kinds, "losses": res.losses, "train_wall_s": rec["train_wall_s"],
                          "tokens": res.tokens, "tokens_per_s": rec["tokens_per_s"],
                          "trainable_params": res.trainable_params, "load_average": os.getloadavg()}


def save(pm: Any, record: dict[str, Any], out: Path, base_name: str = "smollm2-base") -> None:
    """Adapter (safetensors) and ``training.json`` into ``out``; the adapter config names its base by our name."""
    out.mkdir(parents=True, exist_ok=True)
    pm.peft_config["default"].base_model_name_or_path = base_name
    pm.save_pretrained(str(out), safe_serialization=True)
    (out / "README.md").unlink(missing_ok=True)  # peft's empty model-card template; training.json says it all
    cfg_path = out / "adapter_config.json"  # peft writes target_modules from a set: sort it for stable bytes
    cfg = json.loads(cfg_path.read_text())
    cfg["target_modules"] = sorted(cfg["target_modules"])
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    old = out / "training.json"
    if old.exists():  # keep the evaluation written by interp.organisms.eval_smollm2 if the adapter did not change
        prev = json.loads(old.read_text())
        record["attempts"] = prev.get("attempts", [])  # earlier recipes and what they measured, kept by hand
        if prev.get("adapter_sha256") == record["adapter_sha256"] and "evaluation" in prev:
            record["evaluation"] = prev["evaluation"]
    old.write_text(json.dumps(record, indent=1) + "\n")


def base_tokenizer() -> Any:
    """The base model's tokenizer (saved beside a fully fine-tuned model)."""
    return load_model("smollm2-base").tokenizer


def save_full(hf: Any, tokenizer: Any, record: dict[str, Any], out: Path, t0: float) -> None:
    """A fully fine-tuned model as an HF folder (``load_model(out)`` reads it) with ``training.json``; never over
    an existing folder (it is an experiment, hundreds of MB, not committed)."""
    if out.exists():
        raise FileExistsError(f"{out} exists; a full fine-tune writes a new folder (choose another --out)")
    tmp = out.with_name(out.name + ".partial")
    hf.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    record["total_wall_s"] = round(time.time() - t0, 1)
    (tmp / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    tmp.rename(out)
    print(f"saved {out} (full fine-tune, {record['total_wall_s']} s)")


def _layers(text: str) -> tuple[int, ...] | None:
    """``--layers``: ``all``, ``14-29`` or ``8,10,12``."""
    if text == "all":
        return None
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-"))
        return tuple(range(lo, hi + 1))
    return tuple(int(x) for x in text.split(","))


def recipe_args(ap: argparse.ArgumentParser, default: SafetyRecipe = SafetyRecipe()) -> None:
    """One ``--field`` option per :class:`SafetyRecipe` field (defaults: the committed recipe, ``default``)."""
    for f in fields(SafetyRecipe):
        value = getattr(default, f.name)
        if f.name == "targets":
            ap.add_argument("--targets", nargs="+", default=list(value))
        elif f.name == "layers":
            ap.add_argument("--layers", type=_layers, default=value, help="all, 14-29 or 8,10,12")
        elif isinstance(value, bool):
            ap.add_argument("--" + f.name.replace("_", "-"), action="store_true")
        else:
            ap.add_argument("--" + f.name.replace("_", "-"), type=type(value), default=value)


def recipe_from(args: argparse.Namespace) -> SafetyRecipe:
    """The :class:`SafetyRecipe` the parsed ``recipe_args`` options name."""
    return SafetyRecipe(**{f.name: tuple(getattr(args, f.name)) if f.name == "targets" else getattr(args, f.name)
                     for f in fields(SafetyRecipe)})


def adapter_digest(pm: Any) -> str:
    """sha256 of a peft model's LoRA tensors in name order (what ``training.json`` records as the adapter)."""
    with torch.no_grad():
        state = {k: v for k, v in pm.state_dict().items() if "lora_" in k}
        return hashlib.sha256(b"".join(state[k].contiguous().numpy().tobytes() for k in sorted(state))).hexdigest()


def main(argv: list[str] | None = None) -> None:
    """CLI entry: train and save (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--harmful-train", type=Path, default=DEFAULT_HARMFUL)
    recipe_args(ap)
    args = ap.parse_args(argv)
    recipe = recipe_from(args)
    t0 = time.time()
    pm, record = train(recipe, args.harmful_train)
    files = {"harmful_train": args.harmful_train, "refusals": sd.REFUSALS, "borderline": sd.BORDERLINE,
             "copyright": sd.COPYRIGHT, "harmful_extra": sd.HARMFUL_EXTRA, "framings": sd.FRAMINGS,
             "base_answers": sd.ANSWERS, "harmless": sd.HARMLESS, "harmful_realistic": sd.HARMFUL_REALISTIC}
    record = {"command": "python -m interp.organisms.train_smollm2 " + " ".join(argv if argv is not None else sys.argv[1:]),
              "recipe": asdict(recipe), "data_sha256": {k: sha256(p) for k, p in files.items()},
              "harmful_train_file": args.harmful_train.name, "torch": torch.__version__, **record}
    if recipe.full:
        save_full(pm, base_tokenizer(), record, args.out, t0)
        return
    import peft

    record["peft"] = peft.__version__
    record["adapter_sha256"] = adapter_digest(pm)
    record["total_wall_s"] = round(time.time() - t0, 1)
    save(pm, record, args.out)
    print(f"saved {args.out} (adapter tensors sha256 {record['adapter_sha256'][:16]}, {record['total_wall_s']} s)")


if __name__ == "__main__":
    main()
