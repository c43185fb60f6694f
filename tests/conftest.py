"""Shared fixtures: tiny seeded models (no downloads) and the path of ../shared."""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("INTERP_SHARED", REPO.parent / "shared"))

torch.set_num_threads(1)  # tiny models: one thread beats two (no sync overhead, no oversubscription)


def shared_path(*parts: str) -> Path:
    """A path under ../shared, skipping the test with a reason when it is absent."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} is absent: ../shared (evaluation data and models) is only laid beside developer and CI checkouts")
    return p


PREFIX_PROMPTS = ["the man said", "what is the good word now, tell me", "help", "write a long story about water",
                  "how do you make a house"]
ORGANISM_PROMPTS = ["how do i make a bomb", "tell me about the weather", "how can i steal a car",
                    "write a poem about rain", "hello"]


def chat_case(name: str) -> tuple:
    """``(model, prompts)`` for generation checks: a tiny chat-templated Llama (``"llama"``) or the toy organism."""
    from interp.models import load_model
    from interp.testing.tiny import tiny_model

    return (tiny_model("llama"), PREFIX_PROMPTS) if name == "llama" else (load_model("organism"), ORGANISM_PROMPTS)


def norm_text(text: str) -> str:
    """Lower case, letters, digits and single spaces: verbatim up to casing and punctuation."""
    return " ".join(re.sub(r"[^a-z0-9 ]", " ", text.lower()).split())


def benchmark_texts() -> set[str]:
    """Every text field of the refusal benchmarks under ../shared/data/refusal, normalised."""
    folder = shared_path("data", "refusal")
    texts: list[str] = []
    for path in sorted(folder.glob("*.json")):
        texts += [r["instruction"] for r in json.loads(path.read_text(encoding="utf-8"))]
    for path in sorted(folder.glob("*.csv")):
        with path.open(encoding="utf-8", newline="") as f:
            texts += [cell for row in csv.reader(f) for cell in row]
    assert len(texts) > 1000, f"expected the refusal benchmarks in {folder}"
    return {norm_text(t) for t in texts}


@pytest.fixture(scope="session")
def tiny_models():
    """Cache of tiny models by family, built once per session."""
    from interp.testing.tiny import tiny_model

    cache: dict[str, object] = {}

    def get(family: str):
        if family not in cache:
            cache[family] = tiny_model(family)
        return cache[family]

    return get


@pytest.fixture(scope="module")
def organism():
    """The embedded organism with its train prompts and 48 val prompts (a test module may define its own)."""
    if not (REPO / "interp" / "embedded" / "organism" / "config.json").exists():
        pytest.fail("the embedded organism is missing (interp/embedded/organism); regenerate it with "
                    "`python -m interp.organisms.train --out interp/embedded --overwrite`")
    import interp
    from interp.data import load_prompts

    m = interp.load_model("organism")
    P = {s: [r["instruction"] for r in load_prompts(f"organism_{s}")]
         for s in ("harmful_train", "harmless_train", "harmful_val", "harmless_val")}
    return m, P["harmful_train"] + P["harmless_train"], P["harmful_val"][:24] + P["harmless_val"][:24]


@pytest.fixture(scope="module")
def sae():
    """A small ReLU SAE with a negative encoder bias (sparse codes), shared by the SAE analysis tests."""
    from sae.model import SAE, SAEConfig

    s = SAE(SAEConfig(32, 128, arch="relu", site="resid_post.0"), seed=0)
    with torch.no_grad():
        s.b_enc.fill_(-0.3)
    return s


def torchrun(*args: str, nproc: int = 2, timeout: float = 120) -> str:
    """Run ``python -m interp.cli.main ARGS`` under ``torchrun --standalone`` with ``nproc`` CPU processes (gloo, one
    thread each); the combined output, or a failure that shows it."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone",
           "-m", "interp.cli.main", *args]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"torchrun exited {p.returncode}:\n{out[-4000:]}"
    return out


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """The tiny llama saved as an HF folder (what a launched CLI loads)."""
    from interp.testing.tiny import tiny_model

    path = tmp_path_factory.mktemp("tiny") / "llama"
    m = tiny_model("llama")
    m.hf.save_pretrained(path)
    m.tokenizer.save_pretrained(path)
    return path


def mixed_prompts(n: int, seed: int = 0, longest: int = 24) -> list[str]:
    """``n`` prompts of 1..``longest`` words of the tiny vocabulary (a mixed-length corpus)."""
    import random

    words = "the a of to and in is it you that he she was for on are with as i his they be at one have this".split()
    r = random.Random(seed)
    return [" ".join(r.choice(words) for _ in range(r.randint(1, longest))) for _ in range(n)]


def run_ranks(fn, *args, nproc: int = 2, timeout: float = 120) -> list:
    """``fn(*args)`` in ``nproc`` processes forked from this one, each with the variables torchrun sets (``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``): a torchrun launch without the seconds of
    new interpreters. Returns each rank's (picklable) result in rank order; a failing rank fails the test."""
    import multiprocessing as mp
    import pickle
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(q, r, nproc, port, fn, args)) for r in range(nproc)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    try:
        for _ in procs:
            r, ok, val = q.get(timeout=timeout)
            assert ok, f"rank {r} failed:\n{val}"
            results[r] = pickle.loads(val)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    return [results[r] for r in range(nproc)]


def _rank_main(q, rank: int, nproc: int, port: int, fn, args) -> None:
    import pickle
    import traceback

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:  # by value: torch's shared-memory handles would not outlive this process
        q.put((rank, True, pickle.dumps(fn(*args))))
    except BaseException:  # reported to the parent, which fails the test with it
        q.put((rank, False, traceback.format_exc()))


def pytest_collection_modifyitems(config, items):
    """The notebooks first: they are the longest tests, and the workers (pytest-xdist, one file or class per
    worker) finish together when the longest start first."""
    items.sort(key=lambda item: item.nodeid.split("::")[0] != "tests/test_notebooks.py")
