"""``python -m tune train|attribute``: fine-tune a model on (prompt, response) pairs, or attribute an adapter's
gain to response tokens. Pairs come as a JSONL file of ``{"prompt": ..., "response": ...}`` rows.

``python -m tune train --model organism-base --pairs pairs.jsonl --out adapter/ [--steps 100 --lr 1e-3 ...]``
``python -m tune attribute --model smollm2-base --adapter interp/embedded/smollm2-aligned --pairs pairs.jsonl``
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

from interp.tune.config import TuneConfig


def read_pairs(path: Path) -> tuple[list[str], list[str]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    bad = [i for i, r in enumerate(rows) if not {"prompt", "response"} <= set(r)]
    if bad:
        raise ValueError(f"{path} row {bad[0]} lacks 'prompt' or 'response'; each line is one JSON object with both")
    return [r["prompt"] for r in rows], [r["response"] for r in rows]


def _config_args(ap: argparse.ArgumentParser) -> None:
    for f in fields(TuneConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.name in ("targets", "layers", "checkpoint_steps"):
            ap.add_argument(flag, nargs="+", default=None, type=str if f.name == "targets" else int)
        elif f.name == "max_grad_norm":
            ap.add_argument(flag, type=float, default=None)
        else:
            ap.add_argument(flag, type=type(f.default), default=f.default)


def main(argv: list[str] | None = None) -> None:
    from interp.models import load_model

    ap = argparse.ArgumentParser(prog="python -m tune", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    tr = sub.add_parser("train", help="fine-tune and save the adapter (or model)")
    at = sub.add_parser("attribute", help="per-token gain of an adapter over its base")
    for p in (tr, at):
        p.add_argument("--model", required=True, help="a name or folder load_model knows")
        p.add_argument("--pairs", required=True, type=Path)
    tr.add_argument("--out", required=True, type=Path)
    tr.add_argument("--resume", type=Path, default=None)
    _config_args(tr)
    at.add_argument("--adapter", required=True, type=Path)
    args = ap.parse_args(argv)
    prompts, responses = read_pairs(args.pairs)
    model = load_model(args.model)
    if args.cmd == "attribute":
        from interp.tune.attribution import token_attribution

        print(json.dumps(token_attribution(model, args.adapter, prompts, responses).concentration(), indent=1))
        return
    from interp.tune.loop import fine_tune

    kw = {f.name: getattr(args, f.name) for f in fields(TuneConfig) if getattr(args, f.name) is not None}
    cfg = TuneConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()})
    res = fine_tune(model, prompts, responses, cfg, out=args.out / "checkpoints", resume=args.resume)
    print(f"saved {res.save(args.out / 'final')} (final loss {res.losses[-1]:.4f})")


if __name__ == "__main__":
    main()
