"""``interp steer``: generate with a saved direction added (per strength) or ablated, and judge refusals.

Every run includes the no-intervention baseline on the same prompts, so each strength's refusal rate is read
against it; all generations go to ``generations.jsonl`` for reading by hand.
"""

from __future__ import annotations

import argparse
import html
from typing import Any

from interp.cli.jobs import JobFolder, add_out_args, floats, load, option, prompts_of, run_job
from interp.values import Prompts, Runtime

BASELINE = "baseline"


def add_steer_parser(sub: Any, model_args: Any) -> None:
    p = sub.add_parser("steer", help="generate with a saved direction added at each strength (or ablated) and "
                                     "measure the refusal rate against the unsteered baseline")
    model_args(p)
    p.add_argument("--prompts", required=True, help="CSV/JSON/JSONL/text file of prompts to generate for")
    option(p, "--column", None, "column/key of the prompt; none: the first of instruction, prompt, goal, text, ...")
    p.add_argument("--direction", required=True, help="folder of a saved probes.Direction (e.g. the direction/ "
                                                      "folder written by `interp probe`)")
    option(p, "--layer", None, "layer to steer at (add) or whose vector to ablate at every layer (ablate); "
                               "none: the direction's middle layer (add) or each layer's own vector (ablate)", type=int)
    option(p, "--alpha", "0.5,1,2", "comma-separated strengths for --mode add (negative values subtract: "
                                    "write --alpha=-1,1); ignored by --mode ablate")
    option(p, "--scale", "raw", "unit of --alpha: raw (alpha 1 adds the saved difference of means) or unit "
                                "(alpha is in residual-stream units along the unit vector)", choices=("raw", "unit"))
    option(p, "--mode", "add", "add the direction, or ablate it (project it out of every layer's writers)",
           choices=("add", "ablate"))
    option(p, "--max-new-tokens", 32, "tokens generated per prompt (greedy)", type=int)
    option(p, "--batch-size", 16, "prompts per generate call", type=int)
    p.add_argument("--raw", action="store_true", help="do not wrap prompts in the chat template (default: wrap)")
    add_out_args(p, "runs/steer")
    p.set_defaults(func=cmd_steer)


def cmd_steer(args: argparse.Namespace) -> int:
    return run_job(args, "steer", ("generations.jsonl",), lambda folder: steer_job(args, folder))


def load_direction(path: str, model: Any) -> Any:
    """The saved Direction, checked against the model's width."""
    from pathlib import Path

    from probes import Direction

    if not (Path(path) / "meta.json").exists():
        raise FileNotFoundError(f"--direction {path} holds no saved Direction (meta.json missing); give the "
                                f"direction/ folder written by `interp probe` or by Direction.save")
    d = Direction.load(path)
    if d.d_model != model.d_model:
        raise ValueError(f"--direction {path} has width {d.d_model} but {model.name} has d_model {model.d_model}; "
                         f"use a direction fitted on this model")
    return d


def steer_layer(args: argparse.Namespace, d: Any, n_layers: int) -> int | None:
    """``--layer``, or by default the direction's middle layer (add) / none, each layer's own vector (ablate)."""
    layers = [x for x in d.layers if x is not None]
    if args.layer is None and args.mode == "ablate":
        return None
    layer = args.layer if args.layer is not None else layers[len(layers) // 2]
    if not 0 <= layer < n_layers or layer not in layers:
        raise ValueError(f"--layer {layer} is not among the direction's layers {layers} (model has {n_layers} "
                         f"layers); pick one of those")
    return layer


def conditions(args: argparse.Namespace, d: Any, layer: int | None) -> list[tuple[str, float | None, tuple]]:
    """``(name, alpha, interventions)`` per condition, the baseline first."""
    import steering

    out: list[tuple[str, float | None, tuple]] = [(BASELINE, None, ())]
    if args.mode == "ablate":
        target = d if layer is None else d.at(layer)
        return out + [("ablate", None, (steering.DirectionalAblation(target),))]
    idx = d.layers.index(layer)
    vec = d.raw[idx] if args.scale == "raw" else d.vectors[idx]
    for a in floats(args.alpha, "--alpha"):
        out.append((f"alpha={a:g}", a, (steering.AddVector(vec, layers=[layer], alpha=a),)))
    return out


def steer_job(args: argparse.Namespace, folder: JobFolder) -> dict[str, Any]:
    """Generate per condition, judge refusals, write generations, result, figure and page."""
    import steering
    from interp.viz.refusal import refusal_rates

    prompts = prompts_of(args.prompts, args.column, "--prompts")
    model = load(args)
    d = load_direction(args.direction, model)
    layer = steer_layer(args, d, model.n_layers)
    conds = conditions(args, d, layer)
    rows, rates, texts = [], {}, {}
    for name, alpha, ivs in conds:
        judged = steering.generate_and_judge(model, Prompts(prompts, chat=not args.raw), *ivs,
                                             max_new_tokens=args.max_new_tokens,
                                             runtime=Runtime(batch_size=args.batch_size))
        texts[name] = judged.texts
        rates[name] = judged.rate
        rows += [{"condition": name, "alpha": alpha, "prompt_index": i, "prompt": p, "text": t, "refusal": f}
                 for i, (p, t, f) in enumerate(zip(prompts, judged.texts, judged.flags, strict=True))]
    folder.write_text("generations.jsonl", "".join(_jsonl(r) for r in rows))
    result = {"mode": args.mode, "layer": layer, "scale": args.scale if args.mode == "add" else None,
              "direction": args.direction, "direction_method": d.method, "direction_model": d.model_id,
              "n_prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "conditions": [{"name": n, "alpha": a, "refusal_rate": rates[n]} for n, a, _ in conds],
              "refusal_rate": rates}
    folder.write_json("result.json", result)
    fig = refusal_rates(rates)
    fig.update_layout(title=f"Refusal rate by condition ({args.mode} at layer {layer if layer is not None else 'all'}; "
                            f"anchored phrase judge over {len(prompts)} generations each)")
    facts = [("model", model.name), ("direction", f"{args.direction} ({d.method}, fitted on {d.model_id})"),
             ("mode", args.mode), ("layer", "each layer's own vector" if layer is None else layer),
             ("prompts", len(prompts))] + [(f"refusal rate: {n}", f"{100 * r:.0f}%") for n, r in rates.items()]
    if d.model_id and d.model_id != model.name:
        facts.append(("note", f"the direction was fitted on {d.model_id}, not {model.name}"))
    folder.write_report(f"interp steer: {model.name}", facts, {"refusal_rate": fig},
                        extra=[("Examples", examples_table(prompts, texts))])
    return {f"refusal rate {n}": f"{100 * r:.0f}%" for n, r in rates.items()}


def _jsonl(row: dict) -> str:
    import json

    return json.dumps(row, ensure_ascii=False) + "\n"


def examples_table(prompts: list[str], texts: dict[str, list[str]], n: int = 8) -> str:
    """The first ``n`` prompts with each condition's generation side by side."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["prompt", *texts])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(x)}</td>" for x in [p, *(t[i] for t in texts.values())])
                   + "</tr>" for i, p in enumerate(prompts[:n]))
    return f"<table><tr>{head}</tr>{body}</table>"


__all__ = ["add_steer_parser", "cmd_steer", "conditions", "examples_table", "load_direction", "steer_job",
           "steer_layer"]
