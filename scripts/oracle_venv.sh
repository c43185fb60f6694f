#!/usr/bin/env bash
# Create the circuit-tracer oracle environment at .oracle-venv/ in the repository root (idempotent).
#
#     bash scripts/oracle_venv.sh
#
# circuit-tracer 0.5 pins transformers <= 4.57.3 and huggingface-hub < 1, so it cannot import beside our
# stack (transformers 5.x); tests/test_graphs_circuit_tracer.py runs scripts/circuit_tracer_oracle.py with
# this environment's python and compares the graphs through saved files. Exits 0 at once when the
# environment is already there and imports circuit_tracer at the pinned versions. About 1.6 GB, a few
# minutes on first run (torch comes from the local wheel). ORACLE_BASE_PYTHON picks the interpreter.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.oracle-venv"
PY="$VENV/bin/python"
# shellcheck source=scripts/venv_common.sh
. "$ROOT/scripts/venv_common.sh"
PINS=("torch==2.13.0" "transformers==4.57.3" "huggingface-hub<1" "transformer-lens==3.2.1" "circuit-tracer==0.5.0")
CHECK='
from importlib.metadata import version
import circuit_tracer, transformer_lens, torch
want = {"circuit-tracer": "0.5.0", "transformers": "4.57.3", "transformer-lens": "3.2.1"}
bad = {k: version(k) for k, v in want.items() if version(k) != v}
assert not bad and version("torch").startswith("2.13.0") and int(version("huggingface-hub").split(".")[0]) < 1, bad
'

if [ -x "$PY" ] && "$PY" -c "$CHECK" >/dev/null 2>&1; then
    exit 0
fi

BASE_PY="${ORACLE_BASE_PYTHON:-python3}"
if [ ! -x "$PY" ]; then
    "$BASE_PY" -m venv "$VENV"
fi
venv_pip "${PINS[@]}"
venv_share_files
"$PY" -c "$CHECK"
