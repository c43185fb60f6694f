"""The fused residual edit: Triton kernel (under TRITON_INTERPRET=1 on CPU) and torch fallback against a
float64 reference, on fresh random inputs, including widths that are not a multiple of the block size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from steering.fused import LowRankEdit, apply_edit, edit_torch, pick_backend

ROOT = Path(__file__).resolve().parents[1]
EPS = {torch.float32: 1e-5, torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}


def reference(x, U, W, b, mask, cond, thr, above):
    """Float64 reference written out directly (not via the package)."""
    x64 = x.double()
    y = x64 - (x64 @ W.double().T) @ U.double()
    if b is not None:
        y = y + b.double()
    g = torch.ones(x.shape[:-1], dtype=torch.bool)
    if mask is not None:
        g &= mask
    if cond is not None:
        p = x64 @ cond.double()
        g &= (p > thr) if above else (p < thr)
    return torch.where(g[..., None], y, x64)


def random_case(seed, shape, k, dtype, with_b=True, with_mask=True, with_cond=True):
    g = torch.Generator().manual_seed(seed)
    d = shape[-1]
    x = (3 * torch.randn(*shape, generator=g)).to(dtype)
    Q = torch.linalg.qr(torch.randn(d, max(k, 1), generator=g, dtype=torch.float64))[0].T[:k].float()
    U = Q if seed % 2 else torch.randn(k, d, generator=g) / d ** 0.5  # general low-rank maps too
    W = Q.clone()
    b = torch.randn(d, generator=g) if with_b else None
    mask = torch.rand(shape[:-1], generator=g) > 0.3 if with_mask else None
    cond = torch.randn(d, generator=g) if with_cond else None
    return x, U, W, b, mask, cond, 0.2, bool(seed % 3)


def check_close(y, ref, x, dtype):
    scale = ref.abs().max().item()
    tol = EPS[dtype] * ref.abs() + 1e-5 * scale
    err = (y.double() - ref).abs()
    return bool((err <= tol).all()), err.max().item()


# the subprocess sets TRITON_INTERPRET before anything imports triton
KERNEL_SCRIPT = textwrap.dedent("""
    import json, os, sys, torch
    assert os.environ["TRITON_INTERPRET"] == "1"
    sys.path.insert(0, sys.argv[1])
    from tests.test_steering_kernels import random_case, reference, check_close
    from steering.kernels import edit_triton, block_sizes
    from steering.fused import edit_torch
    cases = json.loads(sys.argv[2])
    out = []
    for c in cases:
        dt = getattr(torch, c["dtype"])
        x, U, W, b, m, cond, thr, above = random_case(c["seed"], tuple(c["shape"]), c["k"], dt,
                                                       c["b"], c["mask"], c["cond"])
        y = edit_triton(x, U, W, b, m, cond, thr, above, block_d=c.get("block_d"))
        ref = reference(x, U, W, b, m, cond, thr, above)
        ok, err = check_close(y, ref, x, dt)
        fb = edit_torch(x, U, W, b, m, cond, thr, above)
        agree = (y.double() - fb.double()).abs().max().item()
        g = torch.ones(x.shape[:-1], dtype=torch.bool) if m is None else m.clone()
        if cond is not None:
            p = x.double() @ cond.double()
            g &= (p > thr) if above else (p < thr)
        untouched = bool(torch.equal(y[~g], x[~g]))
        out.append(dict(c, ok=ok, err=err, agree=agree, untouched=untouched, scale=ref.abs().max().item(),
                        blocks=block_sizes(c["k"], x.shape[-1])))
    print("RESULT" + json.dumps(out))
""")

CASES = [
    dict(seed=1, shape=[37, 100], k=3, dtype="float32", b=True, mask=True, cond=True),
    dict(seed=2, shape=[5, 64], k=0, dtype="float32", b=True, mask=False, cond=False),
    dict(seed=3, shape=[2, 9, 257], k=16, dtype="float32", b=True, mask=True, cond=False),
    dict(seed=4, shape=[1, 33], k=1, dtype="float32", b=False, mask=False, cond=True),
    dict(seed=5, shape=[40, 100], k=5, dtype="bfloat16", b=True, mask=True, cond=True, block_d=32),
    dict(seed=6, shape=[3, 7, 200], k=16, dtype="bfloat16", b=False, mask=False, cond=False),
    dict(seed=7, shape=[19, 130], k=2, dtype="bfloat16", b=True, mask=True, cond=False),
    dict(seed=8, shape=[40, 100], k=7, dtype="float16", b=True, mask=True, cond=True),
    dict(seed=9, shape=[11, 513], k=16, dtype="float16", b=True, mask=False, cond=True),
    dict(seed=10, shape=[6, 48], k=0, dtype="float16", b=True, mask=True, cond=False, block_d=32),
]


@pytest.fixture(scope="module")
def kernel_results():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", KERNEL_SCRIPT, str(ROOT), json.dumps(CASES)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


@pytest.mark.parametrize("i", range(len(CASES)))
def test_triton_kernel_matches_float64_reference(kernel_results, i):
    r = kernel_results[i]
    print(r)
    assert r["ok"], f"kernel off the float64 reference beyond the {r['dtype']} tolerance: {r}"
    assert r["untouched"], f"gated-off rows were changed: {r}"
    assert r["agree"] <= EPS[getattr(torch, r["dtype"])] * r["scale"], f"kernel and torch fallback disagree: {r}"


def test_cases_cover_ragged_widths():
    from steering.kernels import block_sizes

    ragged = [c for c in CASES if c["shape"][-1] % (c.get("block_d") or block_sizes(c["k"], c["shape"][-1])[1])]
    assert len(ragged) >= 5 and {c["dtype"] for c in ragged} == {"float32", "bfloat16", "float16"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", range(6))
def test_torch_fallback_matches_float64_reference(dtype, seed):
    g = torch.Generator().manual_seed(100 + seed)
    n = int(torch.randint(1, 60, (1,), generator=g))
    d = int(torch.randint(8, 300, (1,), generator=g))
    k = int(torch.randint(0, 17, (1,), generator=g))
    case = random_case(1000 + seed, (n, d), min(k, d), dtype, seed % 2 == 0, seed % 3 != 0, seed % 2 == 1)
    y = edit_torch(*case)
    ok, err = check_close(y, reference(*case), case[0], dtype)
    assert ok, (dtype, n, d, k, err)


def test_cpu_dispatch_is_torch_and_triton_stays_unimported():
    x = torch.randn(4, 8)
    assert pick_backend(x, 3) == "torch"
    code = ("import sys, torch, steering\nfrom interp.testing.tiny import tiny_model\nm = tiny_model('llama')\n"
            "with steering.apply(m, steering.DirectionalAblation(torch.randn(m.d_model))):\n"
            "    m.hf(torch.tensor([[5, 6, 7]]))\n"
            "print('kernels' if 'steering.kernels' in sys.modules else 'lazy')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("lazy")


def test_composed_edit_equals_sequential():
    g = torch.Generator().manual_seed(0)
    d = 40
    Q = torch.linalg.qr(torch.randn(d, 3, generator=g, dtype=torch.float64))[0].T
    r = torch.randn(d, generator=g, dtype=torch.float64)
    r = r / r.norm()
    v = torch.randn(d, generator=g, dtype=torch.float64)
    edits = [LowRankEdit.add(v), LowRankEdit.project_out(Q), LowRankEdit.clamp(r, 2.5), LowRankEdit.add(-v / 3)]
    x = torch.randn(10, d, generator=g, dtype=torch.float64)
    seq = x
    for e in edits:
        seq = edit_torch(seq, e.U, e.W, e.b, None, None, 0.0, True)
    comp = edits[0]
    for e in edits[1:]:
        comp = comp.then(e)
    assert comp.k == 4
    torch.testing.assert_close(edit_torch(x, comp.U, comp.W, comp.b, None, None, 0.0, True), seq)
    assert torch.allclose((seq - (-v / 3)) @ r, torch.full((10,), 2.5, dtype=torch.float64))


def test_apply_edit_bad_input(monkeypatch):
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"\[k, 8\]"):
        apply_edit(x, torch.zeros(1, 7), torch.zeros(1, 7))
    with pytest.raises(ValueError, match="row_mask"):
        apply_edit(x, None, None, torch.zeros(8), row_mask=torch.ones(5, dtype=torch.bool))
    with pytest.raises(ValueError, match="backend"):
        apply_edit(x, None, None, torch.zeros(8), backend="cuda")
    from steering.kernels import edit_triton

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="CUDA"):
        edit_triton(x, torch.zeros(1, 8), torch.zeros(1, 8), None, None, None, 0.0, True)
    with pytest.raises(ValueError, match="k <= 16"):
        edit_triton(x, torch.zeros(17, 8), torch.zeros(17, 8), None, None, None, 0.0, True)
    with pytest.raises(TypeError, match="float64"):
        edit_triton(x.double(), torch.zeros(1, 8), torch.zeros(1, 8), None, None, None, 0.0, True)
