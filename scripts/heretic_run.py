"""Run heretic-llm 1.4 non-interactively (inside .heretic-venv; built by scripts/heretic_venv.sh).

    .heretic-venv/bin/python scripts/heretic_run.py OUT -- HERETIC_FLAGS...

heretic's ``run()`` does the whole job (directions, Optuna TPE trials, its Pareto menu); its menus are
answered by a script: after the trials, every Pareto-best trial is chosen in turn and saved as a merged model
("Save the model to a local folder") under ``OUT/trials/<index>/``, then the program exits. The study journal
(``OUT/checkpoints``) is then read back and every trial written to ``OUT/trials.json`` (its parameters, refusal
count, KL, Optuna values) with the run's seconds and heretic's settings. Imports heretic only, not our packages.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def _answers(out: Path, saved: list[int]):
    """heretic's ``prompt_select`` / ``prompt_path`` replaced: save each Pareto trial once, then exit."""
    state: dict = {"pending": None}

    def select(message: str, choices: list):
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
    hm.prompt_select, hm.prompt_path = _answers(out, saved)
    sys.argv = ["heretic", *flags, "--study-checkpoint-dir", str(out / "checkpoints"), "--export-strategy", "merge"]
    t0 = time.perf_counter()
    hm.run()
    seconds = time.perf_counter() - t0
    rows, settings = _trials(out / "checkpoints")
    tmp = out / "trials.json.tmp"
    tmp.write_text(json.dumps({"seconds_total": seconds, "saved_trials": saved, "settings": settings,
                               "flags": flags, "trials": rows}, indent=2))
    os.replace(tmp, out / "trials.json")


if __name__ == "__main__":
    main(sys.argv[1:])
