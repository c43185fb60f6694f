#!/usr/bin/env bash
# Create the dictionary_learning anchor environment at .dictlearn-venv/ in the repository root (idempotent).
#
#     bash scripts/dictlearn_venv.sh
#
# PyPI `dictionary-learning` (0.1.0, the only release there) pins nnsight < 0.4 (and through it older
# transformers), so it lives in its own environment; benchmarks/bench_features.py runs
# scripts/dictlearn_bench.py with this environment's python on the same batches (saved to a file).
# Exits 0 at once when the environment is there and imports dictionary_learning. torch comes from the local wheel.
# DICTLEARN_BASE_PYTHON picks the interpreter.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.dictlearn-venv"
PY="$VENV/bin/python"
# shellcheck source=scripts/venv_common.sh
. "$ROOT/scripts/venv_common.sh"
PINS=("torch==2.13.0" "dictionary-learning==0.1.0")
CHECK='
from importlib.metadata import version
import torch, dictionary_learning
from dictionary_learning.trainers.batch_top_k import BatchTopKTrainer
assert version("dictionary-learning") == "0.1.0" and version("torch").startswith("2.13.0")
'

if [ -x "$PY" ] && "$PY" -c "$CHECK" >/dev/null 2>&1; then
    exit 0
fi

BASE_PY="${DICTLEARN_BASE_PYTHON:-python3}"
if [ ! -x "$PY" ]; then
    "$BASE_PY" -m venv "$VENV"
fi
venv_pip "${PINS[@]}"
# pip pulls torchvision / torchaudio built for another torch, which break transformers' imports: not needed here
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
venv_share_files
"$PY" -c "$CHECK"
