"""Run heretic-llm 1.4 non-interactively (inside .heretic-venv; built by scripts/heretic_venv.sh).

    .heretic-venv/bin/python scripts/heretic_run.py OUT -- HERETIC_FLAGS...

heretic's ``run()`` does the whole job (directions, Optuna TPE trials, its Pareto menu); its menus are
answered by a script: after the trials, every Pareto-best trial is chosen in turn and saved as a merged model
("Save the model to a local folder") under ``OUT/trials/<index>/``, then the program exits. The study journal
(``OUT/checkpoints``) is then read back and every trial written to ``OUT/trials.json`` (its parameters, refusal
count, KL, Optuna values) with the run's seconds and heretic's settings. Imports heretic only, not our packages.

A time budget: ``HERETIC_STOP_AFTER=SECONDS`` (or ``kill -INT``) stops the trials as heretic's own Ctrl+C does (the
running trial is dropped, the completed ones kept and their Pareto-best saved); the budget stops nothing once the
trials are over.
"""

from __future__ import annotations

import _thread
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path


def deadline(seconds: float | None) -> threading.Timer | None:
    """After ``seconds``, a KeyboardInterrupt in the main thread (heretic's Ctrl+C: stop the trials); SIGINT gets
    Python's handler even where the shell that started us ignored it (a background job). Cancel it when done."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if seconds is None:
        return None
    timer = threading.Timer(seconds, _thread.interrupt_main)
    timer.daemon = True
    timer.start()
    return timer


def _answers(out: Path, saved: list[int], timer: threading.Timer | None = None):
    """heretic's ``prompt_select`` / ``prompt_path`` replaced: save each Pareto trial once, then exit (the first
    question comes after the trials: the time budget is cancelled there)."""
    state: dict = {"pending": None}

    def select(message: str, choices: list):
        if timer is not None:
            timer.cancel()
        values = [getattr(c, "value", c) for c in choices]
        if message.startswith("Which trial"):
            todo = [v for v in values if hasattr(v, "user_attrs") and v.user_attrs["index"] not in saved]
            if not todo:
                return ""
            state["pending"] = todo[0].user_attrs["index"]
            return todo[0]
        if message.startswith("What do you want"):
            if state["pending"] is not None and state["pending"] not in saved:
                return "Save the model to a local folder"
            return ""
        raise RuntimeError(f"heretic_run.py has no scripted answer for heretic's question {message!r}")

    def path(message: str) -> str:
        index = state["pending"]
        saved.append(index)
        return str(out / "trials" / str(index))

    return select, path


def _trials(checkpoints: Path) -> tuple[list[dict], dict]:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    (journal,) = sorted(checkpoints.glob("*.jsonl"))
    storage = JournalStorage(JournalFileBackend(str(journal), lock_obj=JournalFileOpenLock(str(journal))))
    study = storage.get_all_studies()[0]
    rows = []
    for t in storage.get_all_trials(study._study_id):
        rows.append({"index": t.user_attrs.get("index"), "state": t.state.name, "values": t.values,
                     "params": t.params, "direction_index": t.user_attrs.get("direction_index"),
                     "parameters": t.user_attrs.get("parameters"), "refusals": t.user_attrs.get("refusals"),
                     "base_refusals": t.user_attrs.get("base_refusals"),
                     "n_bad_prompts": t.user_attrs.get("n_bad_prompts"),
                     "kl_divergence": t.user_attrs.get("kl_divergence"),
                     "start": t.datetime_start.isoformat() if t.datetime_start else None,
                     "complete": t.datetime_complete.isoformat() if t.datetime_complete else None})
    return rows, json.loads(study.user_attrs["settings"])


def main(argv: list[str]) -> None:
    if "--" not in argv or argv.index("--") != 1:
        raise SystemExit("usage: heretic_run.py OUT -- HERETIC_FLAGS... (OUT: a new folder for the run)")
    out, flags = Path(argv[0]).resolve(), argv[2:]
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty: heretic's study journal there would be resumed or mixed with this "
                         f"run's; choose a new folder or remove that one")
    out.mkdir(parents=True, exist_ok=True)
    import heretic.main as hm

    saved: list[int] = []
    stop = os.environ.get("HERETIC_STOP_AFTER")
    timer = deadline(float(stop) if stop else None)
    hm.prompt_select, hm.prompt_path = _answers(out, saved, timer)
    sys.argv = ["heretic", *flags, "--study-checkpoint-dir", str(out / "checkpoints"), "--export-strategy", "merge"]
    t0 = time.perf_counter()
    hm.run()
    seconds = time.perf_counter() - t0
    rows, settings = _trials(out / "checkpoints")
    tmp = out / "trials.json.tmp"
    tmp.write_text(json.dumps({"seconds_total": seconds, "saved_trials": saved, "settings": settings,
                               "flags": flags, "stop_after": float(stop) if stop else None, "trials": rows}, indent=2))
    os.replace(tmp, out / "trials.json")


if __name__ == "__main__":
    main(sys.argv[1:])
