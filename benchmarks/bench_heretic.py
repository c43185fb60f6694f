"""heretic-llm 1.4 side by side with our refusal measures (issue 36, part 3).

    python benchmarks/bench_heretic.py prepare                 # merged model folders + heretic's text datasets
    python benchmarks/bench_heretic.py run --model smollm2-aligned --trials 40
    python benchmarks/bench_heretic.py evaluate --model smollm2-aligned

``prepare`` saves each organism (base + our LoRA, merged) once under ``runs/heretic/models/<name>/`` and writes our
prompt files as heretic's plain-text datasets (``runs/heretic/prompts/``): the train split for its directions,
the val split for its own scoring (refusal count and first-token KL), so the test split stays held out for ours.
``run`` runs heretic in its own environment (``scripts/heretic_venv.sh``, ``scripts/heretic_run.py``) under
``nice -n 10``, timed, and keeps its trials (``runs/heretic/<model>/trials.json``) and its Pareto-best trials'
merged models. ``evaluate`` loads each saved trial model and measures it our way on the held-out test split:
judged harmful refusal [Wilson 95%], over-refusal on the borderline set, harmless first-token KL and the CE of the
unedited model's own answers; then writes the heretic section of ``benchmarks/RESULTS_frontier.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import machine, write_text  # noqa: E402

RUNS = ROOT / "runs" / "heretic"
OUT_MD = ROOT / "benchmarks" / "RESULTS_frontier.md"
MODELS = ("smollm2-aligned", "gemma3-aligned")
STAMP = "interp-source.json"
# heretic's datasets: ours by split (train: its directions; val: its own scoring; test: held out for ours)
HERETIC_SETS = {"bad_prompts": ("harmful", "train"), "good_prompts": ("harmless", "train"),
                "bad_evaluation_prompts": ("harmful", "val"), "good_evaluation_prompts": ("harmless", "val")}


def model_folder(name: str) -> Path:
    """``runs/heretic/models/<name>/``: ``name`` merged, saved once (HF folder + tokenizer + a source stamp); a
    folder holding another model is refused, never overwritten."""
    import interp

    folder = RUNS / "models" / name
    if (folder / STAMP).exists():
        stamp = json.loads((folder / STAMP).read_text())
        if stamp.get("name") != name:
            raise FileExistsError(f"{folder} holds {stamp.get('name')!r}, not {name!r}; remove it or pick another RUNS")
        return folder
    if folder.exists():
        raise FileExistsError(f"{folder} exists without {STAMP} (not written by this script); remove it first")
    model = interp.load_model(name)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=folder.parent))
    try:
        model.hf.save_pretrained(tmp)
        model.tokenizer.save_pretrained(tmp)
        (tmp / STAMP).write_text(json.dumps({"name": name, "n_layers": model.n_layers, "d_model": model.d_model,
                                             "dtype": str(model.hf.dtype)}))
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def test_data():
    """The realistic sets' splits (the refusal job's own, :func:`load_refusal_data` for a non-toy model), with the
    job's test sizes and borderline set."""
    from interp.studies.kit.config import DataConfig
    from interp.studies.kit.prompt_sets import load_refusal_data

    return load_refusal_data("smollm2-aligned", DataConfig(n_train=10**6, n_val=10**6))


def prompt_files() -> dict[str, Path]:
    """Our realistic prompt sets as heretic's text-file datasets, one prompt a line (written atomically)."""
    data, out = test_data(), {}
    for key, (what, part) in HERETIC_SETS.items():
        split = (data.harmful if what == "harmful" else data.harmless)[part]
        path = RUNS / "prompts" / f"{what}_{part}.txt"
        write_text(path, "".join(" ".join(p.split()) + "\n" for p in split.instructions))
        out[key] = path
    return out


HERETIC_PY = ROOT / ".heretic-venv" / "bin" / "python"


def run_heretic(name: str, trials: int, startup: int, seed: int, batch_size: int, max_tokens: int,
                stop_after: float | None = None, extra: tuple[str, ...] = (), nice: int = 10) -> Path:
    """heretic on ``name``'s local folder with our text datasets, ``trials`` Optuna trials (``startup`` random),
    its default scorers (refusal markers on ``max_tokens`` new tokens, first-token KL), on CPU under
    ``nice -n 10`` (``nice``); ``stop_after`` seconds stops the trials as Ctrl+C does (the completed ones are kept);
    ``extra``: more heretic flags. Returns the run folder."""
    subprocess.run(["bash", str(ROOT / "scripts" / "heretic_venv.sh")], check=True)
    folder, files = model_folder(name), prompt_files()
    out = RUNS / name
    flags = ["--model", str(folder), "--n-trials", str(trials), "--n-startup-trials", str(startup),
             "--seed", str(seed), "--batch-size", str(batch_size), "--max-response-length", str(max_tokens),
             "--device-map", "cpu", "--dtypes", '["float32"]']
    for key, path in files.items():
        flags += [f"--{key.replace('_', '-')}.dataset", str(path)]
    flags += list(extra)
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("HERETIC_STOP_AFTER", None)
    if stop_after is not None:
        env["HERETIC_STOP_AFTER"] = str(stop_after)
    cmd = ["nice", "-n", str(nice), str(HERETIC_PY), str(ROOT / "scripts" / "heretic_run.py"), str(out), "--", *flags]
    print(" ".join(cmd), flush=True)
    t0, c0 = time.perf_counter(), cpu_seconds(resource.RUSAGE_CHILDREN)
    with open(RUNS / f"{name}.log", "w") as log:
        subprocess.run(cmd, check=True, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    took = {"wall_seconds": time.perf_counter() - t0, "cpu_seconds": cpu_seconds(resource.RUSAGE_CHILDREN) - c0}
    write_text(out / "time.json", json.dumps(took))     # on a shared machine the CPU seconds compare fairer
    print(f"heretic on {name}: {took['wall_seconds']:.0f} s wall, {took['cpu_seconds']:.0f} s CPU", flush=True)
    return out


def cpu_seconds(who: int) -> float:
    """User + system CPU seconds of this process (``RUSAGE_SELF``) or its finished children (``RUSAGE_CHILDREN``)."""
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime



MAX_NEW_TOKENS, JUDGE = 24, "phrases"   # the refusal job's defaults (RefusalConfig: 24 new tokens, phrase judge)


def pareto(trials: list[dict]) -> list[dict]:
    """heretic's own Pareto rule: fewest refusals first, each kept only if its KL is below every kept one's."""
    done = sorted((t for t in trials if t["state"] == "COMPLETE"), key=lambda t: (t["refusals"], t["kl_divergence"]))
    best, low = [], float("inf")
    for t in done:
        if t["kl_divergence"] < low:
            low = t["kl_divergence"]
            best.append(t)
    return best


def kl_ce(base, edited, prompts: list[str], responses: list[str], batch_size: int) -> dict[str, float]:
    """Harmless first-response-token KL(base || edited) (mean over prompts) and the CE (nats / token) of the
    base model's own answers under each, teacher-forced: the refusal job's definitions, between two models."""
    from interp.evals.logits import cross_entropy, kl_div
    from interp.forward import batches, forward, prepare

    pairs = [(p, r) for p, r in zip(prompts, responses) if r.strip()]
    _, encs = prepare(base, [p for p, _ in pairs], responses=[r for _, r in pairs])
    kls, ce = [], {"base": [0.0, 0], "edited": [0.0, 0]}
    for b in batches(base, encs, batch_size):
        first = b.response_mask.float().argmax(1) - 1                    # each row's last prompt position
        rows = torch.arange(len(first))
        got = {}
        for key, m in (("base", base), ("edited", edited)):
            logits = forward(m, b)
            s, n = cross_entropy(logits, b.input_ids, b.response_mask)
            ce[key][0] += s
            ce[key][1] += n
            got[key] = logits[rows, first]
        kls.append(kl_div(got["base"], got["edited"]).cpu())
    return {"kl_first_token": float(torch.cat(kls).mean()), "ce_base": ce["base"][0] / ce["base"][1],
            "ce_edited": ce["edited"][0] / ce["edited"][1]}


def measure(model, data, batch_size: int) -> dict:
    """Judged harmful refusal and over-refusal (borderline) on the held-out test split, with Wilson intervals."""
    import steering
    from interp import Runtime

    run = Runtime(batch_size=batch_size, progress=False)
    out = {}
    for key, prompts in (("harmful", data.harmful["test"].instructions), ("borderline", data.borderline.instructions)):
        r = steering.generate_and_judge(model, prompts, judge=None, max_new_tokens=MAX_NEW_TOKENS, runtime=run)
        out[key] = dict(r)
    return out


def _cached(path: Path, key: dict, compute) -> dict:
    """``compute()``'s row, kept at ``path`` with ``key`` (model, data, settings): reused only for the same key."""
    if path.exists():
        got = json.loads(path.read_text())
        if got.get("key") == key:
            return got["row"]
    row = compute()
    write_text(path, json.dumps({"key": key, "row": row}, indent=2))
    return row


def evaluate(name: str, batch_size: int, max_trials: int) -> dict | None:
    """The unedited model, then heretic's Pareto-best trials (fewest refusals first, at most ``max_trials``),
    measured our way against the unedited folder; each row cached as it is done; ``evaluation.json``. Without
    heretic's trials yet, only the unedited row (returns ``None``)."""
    import interp
    import steering
    from interp import Runtime

    folder, out, data = model_folder(name), RUNS / name, test_data()
    key = {"model": name, "data": data.digest("test"), "max_new_tokens": MAX_NEW_TOKENS, "judge": JUDGE}
    base = interp.load_model(str(folder))
    harmless = data.harmless["test"].instructions

    def unedited() -> dict:
        answers = steering.generate(base, harmless, max_new_tokens=MAX_NEW_TOKENS,
                                    runtime=Runtime(batch_size=batch_size, progress=False)).texts
        return {"trial": "unedited", **measure(base, data, batch_size), "kl_first_token": 0.0, "answers": answers}

    first = _cached(RUNS / "baseline" / f"{name}.json", key, unedited)
    if not (out / "trials.json").exists():
        print(f"unedited {name} measured; heretic's trials are not there yet ({out / 'trials.json'})")
        return None
    info = json.loads((out / "trials.json").read_text())
    best = pareto(info["trials"])
    rows = [{k: v for k, v in first.items() if k != "answers"}]
    for t in best[:max_trials]:
        path = out / "trials" / str(t["index"])
        if not path.exists():
            raise FileNotFoundError(f"heretic saved no model for trial {t['index']} at {path}; rerun `run`")

        def trial(t: dict = t, path: Path = path) -> dict:
            edited = interp.load_model(str(path))
            return {"trial": t["index"], "heretic_refusals": t["refusals"], "heretic_n": t["n_bad_prompts"],
                    "heretic_kl": t["kl_divergence"], "direction_index": t["direction_index"],
                    **measure(edited, data, batch_size),
                    **kl_ce(base, edited, harmless, first["answers"], batch_size)}

        rows.append(_cached(out / "eval" / f"{t['index']}.json", key, trial))
    done = sum(t["state"] == "COMPLETE" for t in info["trials"])     # a trial the time budget stopped is pruned
    result = {"model": name, "rows": rows, "heretic_seconds": info["seconds_total"], "trials": done,
              "stopped_trials": len(info["trials"]) - done, "stop_after": info.get("stop_after"),
              "search_seconds": search_seconds(info["trials"]), "settings": info["settings"], "flags": info["flags"],
              "machine": machine(), "sizes": data.sizes(), "pareto": [t["index"] for t in best],
              "not_evaluated": [t["index"] for t in best[max_trials:]]}
    if (out / "time.json").exists():
        result["cpu_seconds"] = json.loads((out / "time.json").read_text())["cpu_seconds"]
    write_text(out / "evaluation.json", json.dumps(result, indent=2))
    return result


def search_seconds(trials: list[dict]) -> float:
    """Seconds from the first trial's start to the last one's end (heretic's search, without load and setup)."""
    from datetime import datetime

    starts = [datetime.fromisoformat(t["start"]) for t in trials if t.get("start")]
    ends = [datetime.fromisoformat(t["complete"]) for t in trials if t.get("complete")]
    return (max(ends) - min(starts)).total_seconds() if starts and ends else float("nan")



HEADER = """# The refusal-vs-damage frontier (issue 36)

Edits that remove refusal, measured one way: judged harmful refusal on the held-out test split of
`interp/data/prompts/harmful_realistic.jsonl` with its Wilson 95% interval, over-refusal on the borderline set
(`borderline_realistic.jsonl`, test split), both by greedy generation of 24 new tokens judged by the refusal job's
phrase judge (`steering.generate_and_judge`); harmless KL(unedited || edited) at the first response token and the
cross-entropy (nats / token) of the unedited model's own 24-token answers, on the harmless test split
(`interp.evals.logits`). heretic's own scores (its refusal markers on 100 new tokens, its first-token KL) are on
the val split, which it optimised on; ours are on the test split, which it never saw.
"""
OURS = "### Our frontier"
OURS_TEXT = OURS + """

(Left for the frontier search's rows, measured by the same definitions on the same prompts: point, harmful
refusal [95% CI], over-refusal [95% CI], harmless KL, CE, search seconds on the same machine.)
"""


def _pct(r: dict) -> str:
    return f"{100 * r['rate']:.0f}% [{100 * r['ci95'][0]:.0f}, {100 * r['ci95'][1]:.0f}] ({r['k']}/{r['n']})"


def write_results(res: dict) -> None:
    """The heretic section of ``RESULTS_frontier.md`` for ``res["model"]`` (others kept; the file started with its
    header and the empty section for our frontier when new)."""
    from benchmarks._common import replace_section

    if not OUT_MD.exists():
        write_text(OUT_MD, HEADER + "\n" + OURS_TEXT)
    s = res["settings"]
    lines = [f"### heretic-llm 1.4 on {res['model']}", "",
             f"{res['trials']} completed of {s['n_trials']} trials ({s['n_startup_trials']} random, then multivariate "
             f"TPE)" + (f", stopped by the {res['stop_after']:.0f} s budget ({res['stopped_trials']} trial pruned)"
                        if res.get("stop_after") else "") + ", "
             f"seed {s['seed']}, "
             f"batch {s['batch_size']}, float32 on CPU: **{res['heretic_seconds']:.0f} s** in all "
             + (f"({res['cpu_seconds']:.0f} CPU s) " if "cpu_seconds" in res else "") +
             f"(the trials alone {res['search_seconds']:.0f} s; the rest: loading, the response-prefix check, the "
             f"base evaluation and saving the Pareto models). Machine: {res['machine']}. heretic settings: "
             f"row normalisation `{s['row_normalization']}`, orthogonalised direction {s['orthogonalize_direction']}, "
             f"system prompt {s['system_prompt']!r}, {s['max_response_length']} new tokens. Test sizes: "
             f"{res['sizes']}.", "",
             "| trial | heretic refusals (val) | heretic KL (val) | harmful refusal, test [95% CI] | "
             "over-refusal, borderline [95% CI] | harmless KL (test) | harmless CE unedited -> edited |",
             "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        her = (f"{r['heretic_refusals']}/{r['heretic_n']}", f"{r['heretic_kl']:.4f}") if "heretic_kl" in r else ("", "")
        ce = f"{r['ce_base']:.3f} -> {r['ce_edited']:.3f}" if "ce_edited" in r else ""
        lines.append(f"| {r['trial']} | {her[0]} | {her[1]} | {_pct(r['harmful'])} | {_pct(r['borderline'])} | "
                     f"{r['kl_first_token']:.4f} | {ce} |")
    cli = (f"--trials {s['n_trials']} --startup {s['n_startup_trials']} --seed {s['seed']} --batch-size "
           f"{s['batch_size']} --max-response-length {s['max_response_length']}"
           + (f" --stop-after {res['stop_after']:.0f}" if res.get("stop_after") else "")
           + "".join(f" --heretic-flag={f}" for f in res["flags"] if f.startswith("--response-prefix")))
    flags = " ".join(res["flags"]).replace(f"{ROOT}/", "")     # paths relative to the repository
    lines += ["", f"heretic's Pareto set (its rule: fewest refusals, then lower KL): trials {res.get('pareto')}; "
              f"not measured our way (time): {res.get('not_evaluated') or 'none'}."]
    lines += ["", "Commands: `bash scripts/heretic_venv.sh`; `python benchmarks/bench_heretic.py run --model "
              f"{res['model']} {cli}`; `python benchmarks/bench_heretic.py evaluate --model "
              f"{res['model']} --max-trials {len(res['rows']) - 1}`. heretic's flags: `{flags}`.", ""]
    replace_section(OUT_MD, lines[0], "\n".join(lines))
    _ours_last()


def _ours_last() -> None:
    """Move the section for our frontier (with whatever rows it holds) to the end of the file."""
    lines = OUT_MD.read_text().split("\n")
    if OURS not in lines:
        return
    i = lines.index(OURS)
    j = next((k for k in range(i + 1, len(lines)) if lines[k].startswith("### ")), len(lines))
    if j < len(lines):
        rest, ours = lines[:i] + lines[j:], lines[i:j]
        write_text(OUT_MD, "\n".join(rest).rstrip("\n") + "\n\n" + "\n".join(ours).rstrip("\n") + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=("prepare", "run", "evaluate"))
    ap.add_argument("--model", choices=MODELS, default=MODELS[0])
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--startup", type=int, default=15, help="heretic's random (exploration) trials before TPE")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-response-length", type=int, default=32,
                    help="heretic's new tokens per answer when it counts refusals (its default 100 is 3x slower on CPU)")
    ap.add_argument("--stop-after", type=float, default=None,
                    help="seconds after which heretic's trials stop as with Ctrl+C (the completed ones are kept)")
    ap.add_argument("--nice", type=int, default=10, help="the niceness heretic runs at")
    ap.add_argument("--heretic-flag", action="append", default=[],
                    help="one more heretic flag (repeatable), e.g. --heretic-flag=--response-prefix=")
    ap.add_argument("--max-trials", type=int, default=4, help="Pareto trials measured our way, fewest refusals first")
    ap.add_argument("--eval-batch-size", type=int, default=32)
    a = ap.parse_args()
    if a.stage == "prepare":
        print(model_folder(a.model), prompt_files())
    elif a.stage == "run":
        run_heretic(a.model, a.trials, a.startup, a.seed, a.batch_size, a.max_response_length, a.stop_after,
                    tuple(a.heretic_flag), a.nice)
    else:
        for k in range(1, a.max_trials + 1):   # the table after each trial (rows cached): a stop keeps what is done
            res = evaluate(a.model, a.eval_batch_size, k)
            if res is None:
                break
            write_results(res)


if __name__ == "__main__":
    main()
