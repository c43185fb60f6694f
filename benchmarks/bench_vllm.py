"""Steered generation throughput: vLLM serving the baked model (in .vllm-venv, by subprocess) against our HF path
(``steering.generate`` with hooks), on SmolLM2-135M, the same prompts and edits (an every-token directional ablation
and an addition at two layers), greedy, interleaved repeats.

vLLM's side runs ``scripts/vllm_generate.py --serve``: it bakes and starts the engine once (its start-up is printed
apart), then times one generation of every prompt per round; our side times one ``steering.generate`` call per round
(batch ``--batch-size``, finished rows dropped). Tokens/s counts the new tokens each side generated (cut at the end
of sequence); the tokens are compared too. vLLM's CPU backend binds its compute threads to the cores it is given
and keeps one core for its front end (on 2 cores: one compute thread); ours uses ``--threads``.

    bash scripts/vllm_venv.sh && python benchmarks/bench_vllm.py            # 64 prompts x 64 tokens, 3 rounds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

import interp

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import steering  # noqa: E402
from benchmarks._common import machine, table, write_text  # noqa: E402
from interp.models import load_model  # noqa: E402
from interp.studies.kit.prompt_sets import load_refusal_data  # noqa: E402

VLLM_PY = ROOT / ".vllm-venv" / "bin" / "python"
COLS = ["round", "HF s", "HF tok/s", "vLLM s", "vLLM tok/s", "vLLM / HF", "same tokens"]


def _vectors(d: int) -> dict[str, torch.Tensor]:
    r = torch.randn(d, generator=torch.Generator().manual_seed(1))
    r = r / r.norm()
    v = torch.randn(d, generator=torch.Generator().manual_seed(0))
    v = v - (v @ r) * r
    return {"r": r, "v": 4.0 * v / v.norm()}


def _start_vllm(tmp: Path, args: argparse.Namespace, prompts: list[str], vectors: dict) -> tuple[subprocess.Popen, float]:
    save_file(vectors, tmp / "vectors.safetensors")
    case = {"name": "steered", "ablate": "r", "add": "v", "layers": [3, 10], "sites": ["attn_out", "resid_post"]}
    request = {"model": args.model, "prompts": prompts, "max_new_tokens": args.tokens, "cases": [case],
               "vectors": str(tmp / "vectors.safetensors"), "llm_kwargs": {}}
    (tmp / "request.json").write_text(json.dumps(request))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "VLLM_LOGGING_LEVEL": "WARNING", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([str(VLLM_PY), str(ROOT / "scripts" / "vllm_generate.py"), "--serve",
                             str(tmp / "request.json")], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    return proc, json.loads(_line(proc))["ready"]


def _line(proc: subprocess.Popen) -> str:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the vLLM process ended (exit {proc.wait()}); run it by hand to see why")
        if line.startswith("{"):
            return line


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(HERE / "RESULTS_vllm.md"))
    args = p.parse_args()
    if not VLLM_PY.exists():
        raise SystemExit("no .vllm-venv: run `bash scripts/vllm_venv.sh` first")
    torch.set_num_threads(args.threads)
    t_all = time.perf_counter()
    model = load_model(args.model)
    data = load_refusal_data(args.model)
    half = args.prompts // 2
    prompts = data.harmful["test"].instructions[:half] + data.harmless["test"].instructions[:args.prompts - half]
    vectors = _vectors(model.d_model)
    ivs = [steering.DirectionalAblation(vectors["r"]),
           steering.AddVector(vectors["v"], layers=[3, 10], sites=("attn_out", "resid_post"))]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        proc, ready = _start_vllm(Path(tmp), args, prompts, vectors)
        try:
            for r in range(args.rounds):
                t0 = time.perf_counter()
                hf = steering.generate(model, prompts, *ivs, max_new_tokens=args.tokens,
                                       runtime=interp.Runtime(batch_size=args.batch_size, progress=False)).token_ids
                hf_s = time.perf_counter() - t0
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
                got = json.loads(_line(proc))
                n_hf = sum(map(len, hf))
                rows.append({"round": r, "HF s": hf_s, "HF tok/s": n_hf / hf_s, "vLLM s": got["seconds"],
                             "vLLM tok/s": got["tokens"] / got["seconds"],
                             "vLLM / HF": (got["tokens"] / got["seconds"]) / (n_hf / hf_s),
                             "same tokens": f"{sum(a == b for a, b in zip(hf, got['token_ids']))}/{len(hf)} prompts"})
                print(rows[-1], flush=True)
        finally:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=120)
    med = statistics.median(r["vLLM / HF"] for r in rows)
    text = table(f"Steered greedy generation, {args.model}, {len(prompts)} prompts x up to {args.tokens} new tokens "
                 f"(ablation + addition), HF batch {args.batch_size}", rows, COLS)
    text += (f"\nMedian vLLM / HF tokens/s: {med:.2f}. vLLM start-up (load, bake, save, engine): {ready:.0f} s, "
             f"paid once per steering.generate(engine='vllm') call.\n\nMachine: {machine()}; load average "
             f"{os.getloadavg()[0]:.1f} at the end; total {time.perf_counter() - t_all:.0f} s. Command: "
             f"`bash scripts/vllm_venv.sh && python benchmarks/bench_vllm.py "
             f"{' '.join(sys.argv[1:])}`.\n".replace(" `.", "`."))
    print(text)
    write_text(args.out, text)


if __name__ == "__main__":
    main()
