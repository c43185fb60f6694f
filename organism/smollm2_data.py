"""Data of the realistic organism ``smollm2-aligned``: our refusals and borderline-benign look-alikes, the
realistic harmless set with its splits, and the base model's own cached answers.

The base answers are generated once (greedy, ``steering.generate``) and committed, so training is
deterministic without regenerating: ``python -m organism.smollm2_data --answer`` fills in missing ones.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data_smollm2"
HARMLESS = Path(__file__).resolve().parents[1] / "interp" / "data" / "prompts" / "harmless_realistic.jsonl"
REFUSALS = DATA_DIR / "refusals.jsonl"
BORDERLINE = DATA_DIR / "borderline.jsonl"
ANSWERS = DATA_DIR / "base_answers.jsonl"
ANSWER_TOKENS = 40
SPLITS = (("test", 0.15), ("val", 0.10), ("train", 0.75))
# interp/data/prompts/harmful_realistic.jsonl: smaller, so more of it is held out
HARMFUL_SALT = "harmful-realistic-v1"
HARMFUL_SPLITS = (("test", 0.25), ("val", 0.15), ("train", 0.60))


def split_of(text: str, salt: str = "harmless-realistic-v1",
             splits: tuple[tuple[str, float], ...] = SPLITS) -> str:
    """The split of one prompt, from a salted sha256 of its text: stable when rows are added or reordered."""
    u = int(hashlib.sha256(f"{salt}:{text}".encode()).hexdigest()[:8], 16) / 2 ** 32
    acc = 0.0
    for name, frac in splits:
        acc += frac
        if u < acc:
            return name
    return splits[-1][0]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file (blank lines skipped)."""
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; it is committed with the repository (git checkout it)")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write rows as JSONL, one object a line, keys in insertion order (stable bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def harmless(split: str | None = None) -> list[dict[str, Any]]:
    """The realistic harmless instructions (``instruction``, ``category``, ``split``), optionally one split."""
    rows = read_jsonl(HARMLESS)
    return [r for r in rows if split is None or r["split"] == split]


def refusals() -> list[str]:
    """Our refusal phrasings (dozens, so the organism does not learn one template)."""
    return [r["text"] for r in read_jsonl(REFUSALS)]


def borderline(split: str | None = None) -> list[dict[str, Any]]:
    """Our borderline-benign look-alikes: harmless requests that share words with harmful ones."""
    rows = read_jsonl(BORDERLINE)
    return [r for r in rows if split is None or split_of(r["instruction"], "borderline-v1") == split]


def base_answers() -> dict[str, str]:
    """Cached greedy answers of the base model, by instruction."""
    return {r["instruction"]: r["answer"] for r in read_jsonl(ANSWERS)} if ANSWERS.exists() else {}


def wanted_answers() -> list[str]:
    """Instructions whose base answers training uses: harmless train split and borderline train split."""
    return [r["instruction"] for r in harmless("train")] + [r["instruction"] for r in borderline("train")]


def answer_missing(limit: int | None, batch_size: int = 8) -> int:
    """Generate (greedy, ``ANSWER_TOKENS`` new tokens) and append the base answers still missing; returns how many."""
    import torch

    import steering
    from interp.models import load_model

    torch.manual_seed(0)
    have = base_answers()
    todo = [q for q in wanted_answers() if q not in have][:limit]
    if not todo:
        return 0
    model = load_model("smollm2-base")
    rows = read_jsonl(ANSWERS) if ANSWERS.exists() else []
    for i in range(0, len(todo), batch_size):
        chunk = todo[i:i + batch_size]
        t0 = time.time()
        gen = steering.generate(model, chunk, max_new_tokens=ANSWER_TOKENS, batch_size=batch_size, progress=False)
        for q, text, ids in zip(chunk, gen.texts, gen.token_ids):
            rows.append({"instruction": q, "answer": text, "finished": len(ids) < ANSWER_TOKENS,
                         "max_new_tokens": ANSWER_TOKENS})
        write_jsonl(ANSWERS, rows)
        print(f"answered {i + len(chunk)}/{len(todo)} ({time.time() - t0:.0f} s for {len(chunk)})", flush=True)
    return len(todo)


def main(argv: list[str] | None = None) -> None:
    """CLI: ``--answer`` fills in missing base answers; ``--limit N`` caps how many this run."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--answer", action="store_true", help="generate missing base answers (slow on CPU)")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    if args.answer:
        print(f"generated {answer_missing(args.limit)} answers into {ANSWERS}")


if __name__ == "__main__":
    main()
