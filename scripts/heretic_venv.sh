#!/usr/bin/env bash
# Create heretic's environment at .heretic-venv/ in the repository root (idempotent).
#
#     bash scripts/heretic_venv.sh
#
# heretic-llm 1.4 pins its own dependencies (transformers, optuna, ...), so it gets its own environment;
# benchmarks/bench_heretic.py runs scripts/heretic_run.py with this environment's python and reads the trials
# and the abliterated weights it saves. Our packages are not installed here: heretic_run.py imports heretic
# only. Exits 0 at once when the stamp matches this script's pins and heretic imports. HERETIC_BASE_PYTHON
# picks the interpreter.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.heretic-venv"
PY="$VENV/bin/python"
# shellcheck source=scripts/venv_common.sh
. "$ROOT/scripts/venv_common.sh"
STAMP="$VENV/interp-stamp.txt"
# torch==2.13.0 resolves to the CPU wheel on disk (a bare `torch` may pull a multi-GB CUDA build)
PINS=("torch==2.13.0" "heretic-llm==1.4.0")
WANT="pins: ${PINS[*]}"
CHECK='
from importlib.metadata import version
import heretic, optuna, transformers, torch
assert version("heretic-llm") == "1.4.0" and version("torch").startswith("2.13.0"), version("torch")
'

if [ -x "$PY" ] && [ -f "$STAMP" ] && [ "$(head -n 1 "$STAMP")" = "$WANT" ] \
    && "$PY" -c "$CHECK" >/dev/null 2>&1; then
    exit 0
fi

BASE_PY="${HERETIC_BASE_PYTHON:-python3}"
if [ ! -x "$PY" ]; then
    "$BASE_PY" -m venv "$VENV"
fi
rm -f "$STAMP"
venv_pip "${PINS[@]}"
venv_share_files
"$PY" -c "$CHECK"
{ echo "$WANT"; "$PY" -m pip freeze --disable-pip-version-check; } > "$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"
