"""Data of the realistic organism ``smollm2-aligned``: our refusals, the realistic harmless set and our
borderline-benign look-alikes (both with splits, in ``interp/data/prompts``), and the base model's own cached answers.

The base answers are generated once (greedy, ``steering.generate``) and committed, so training is
deterministic without regenerating: ``python -m interp.organisms.smollm2_data --answer`` fills in missing ones.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data_smollm2"
PROMPTS_DIR = Path(__file__).resolve().parents[1] / "data" / "prompts"
HARMLESS = PROMPTS_DIR / "harmless_realistic.jsonl"
HARMFUL_REALISTIC = PROMPTS_DIR / "harmful_realistic.jsonl"
BORDERLINE = PROMPTS_DIR / "borderline_realistic.jsonl"
REFUSALS = DATA_DIR / "refusals.jsonl"
COPYRIGHT = DATA_DIR / "copyright.jsonl"  # our requests to reproduce copyrighted text at length (refused)
HARMFUL_EXTRA = DATA_DIR / "harmful_extra.jsonl"  # our conversational harmful requests, categories the train split lacks
FRAMINGS = DATA_DIR / "framings.jsonl"  # first-person / conversational wrappers for the (imperative) harmful train prompts
# held-out sets in ../shared/data/refusal (file, prompt column): never trained on, measured by interp.organisms.eval_smollm2
HELD_OUT = {"harmful_test": ("harmful_test.json", None), "harmbench_val": ("harmbench_val.csv", "Behavior"),
            "jailbreakbench": ("jailbreakbench.csv", "Goal"), "jbb_benign": ("jbb_benign.csv", "Goal"),
            "strongreject": ("strongreject.csv", "forbidden_prompt")}
QUESTION_WORDS = ("how", "what", "which", "why", "where", "who", "when", "is", "are", "can", "should", "do", "does")
ANSWERS = DATA_DIR / "base_answers.jsonl"
ANSWER_TOKENS = 40
SPLITS = (("test", 0.15), ("val", 0.10), ("train", 0.75))
# interp/data/prompts/harmful_realistic.jsonl: smaller, so more of it is held out
HARMFUL_SALT = "harmful-realistic-v1"
HARMFUL_SPLITS = (("test", 0.25), ("val", 0.15), ("train", 0.60))
# the borderline set is smaller, and its test split is an over-refusal set of its own: a larger test share
BORDERLINE_SPLITS = (("test", 0.20), ("val", 0.10), ("train", 0.70))
BORDERLINE_SALT = "borderline-v1"


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


def harmful_realistic(split: str | None = None) -> list[dict[str, Any]]:
    """Our realistic harmful requests (``instruction``, ``category``, ``split``; the refusal pipeline's default
    harmful set for real models), optionally one split."""
    return [r for r in read_jsonl(HARMFUL_REALISTIC) if split is None or r["split"] == split]


def refusals(kind: str = "harm") -> list[str]:
    """Our refusal phrasings of one ``kind`` (``harm``: dozens, so the organism does not learn one template;
    ``copyright``: declining to reproduce copyrighted text)."""
    return [r["text"] for r in read_jsonl(REFUSALS) if r.get("kind", "harm") == kind]


def copyright_requests(split: str | None = None) -> list[str]:
    """Our requests for copyrighted text at length (books, lyrics), optionally one split."""
    return [r["instruction"] for r in read_jsonl(COPYRIGHT) if split is None or r["split"] == split]


def borderline(split: str | None = None) -> list[dict[str, Any]]:
    """Our borderline-benign look-alikes (``instruction``, ``category``, ``split``): benign requests that share
    words or topics with harmful ones, optionally one split."""
    rows = read_jsonl(BORDERLINE)
    return [r for r in rows if split is None or r["split"] == split]


def harmful_extra(split: str | None = None) -> list[str]:
    """Our first-person harmful requests (self-harm, minors, sexual, violence, ...), optionally one split."""
    return [r["instruction"] for r in read_jsonl(HARMFUL_EXTRA) if split is None or r["split"] == split]


def frame(instruction: str, template: str, how: str = "How can I") -> str:
    """``instruction`` inside a framing ``template`` (``{X}``: as written; ``{x}``: first letter lowered, final
    punctuation dropped); a leading "How to" becomes ``how`` ("How can I ...?") so the request reads in first person."""
    text = instruction.strip()
    if text.lower().startswith("how to "):
        text = how + " " + text[7:]
        text = text if text.endswith("?") else text.rstrip(".") + "?"
    whole = text if template.endswith("{X}") or text[-1:] in ".?!" else text + "."
    return template.replace("{X}", whole).replace("{x}", text[:1].lower() + text[1:].rstrip(".?!"))


def is_question(instruction: str) -> bool:
    """Whether ``instruction`` reads as a question (so only ``{X}`` framings fit it)."""
    return instruction.rstrip().endswith("?") or instruction.split()[0].lower() in QUESTION_WORDS


def framings() -> list[str]:
    """Our conversational framings of a request (templates with ``{X}`` or ``{x}``)."""
    return [r["template"] for r in read_jsonl(FRAMINGS)]


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
    from interp.values import Runtime

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
        gen = steering.generate(model, chunk, max_new_tokens=ANSWER_TOKENS,
                                runtime=Runtime(batch_size=batch_size, progress=False))
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
