"""SAE architectures, the sparse decoder (torch and Triton-interpreted) and bad input."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from sae.model import SAE, SAEConfig
from sae.sparse_decoder import Active, gather_dot, gather_sum, scatter_outer, sparse_decode, sparse_encode


def _perturbed(arch: str, d_in: int = 24, d_sae: int = 96, k: int = 5, dtype: str = "float32", seed: int = 0) -> SAE:
    sae = SAE(SAEConfig(d_in, d_sae, arch=arch, k=k if arch in ("topk", "batchtopk") else None, dtype=dtype), seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in (sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec):
            p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        if sae.threshold is not None:
            sae.threshold.copy_(0.3 * torch.rand(d_sae, generator=g, dtype=sae.threshold.dtype))
    return sae


def test_config_rejects_bad_k_and_arch():
    with pytest.raises(ValueError, match="k=200 must be between 1 and the latent count"):
        SAEConfig(16, 100, arch="topk", k=200)
    with pytest.raises(ValueError, match="needs k"):
        SAEConfig(16, 100, arch="batchtopk")
    with pytest.raises(ValueError, match="unknown SAE kind 'nope'.*register_kind"):
        SAEConfig(16, 100, arch="nope")


def test_width_mismatch_is_a_clear_error():
    sae = SAE(SAEConfig(16, 64, arch="topk", k=4, site="resid_post.1"))
    with pytest.raises(ValueError, match="d_in=16 .*got width 12"):
        sae.encode(torch.randn(3, 12))


@pytest.mark.parametrize("arch", ["relu", "topk", "batchtopk", "jumprelu"])
def test_encode_decode_semantics(arch):
    sae = _perturbed(arch)
    x = torch.randn(40, 24)
    z = sae.encode(x)
    pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
    if arch == "topk":
        assert ((z > 0).sum(-1) <= 5).all()
        kth = pre.topk(5, dim=-1).values[:, -1:]
        assert torch.equal(z > 0, (pre >= kth) & (pre > 0))
    elif arch == "relu":
        torch.testing.assert_close(z, torch.relu(pre))
    else:
        torch.testing.assert_close(z, torch.relu(pre) * (pre > sae.threshold))
    torch.testing.assert_close(sae(x), z @ sae.W_dec + sae.b_dec)


@pytest.mark.parametrize("arch", ["relu", "topk", "batchtopk", "jumprelu"])
def test_fold_input_scale_reads_raw_activations(arch):
    sae = _perturbed(arch, dtype="float64")
    x = torch.randn(30, 24, dtype=torch.float64) * 7
    s = 0.37
    z_norm, out_norm = sae.encode(x * s), sae(x * s)
    dec = sae.W_dec.detach().clone()
    sae.fold_input_scale_(s)
    torch.testing.assert_close(sae.encode(x), z_norm / s)
    torch.testing.assert_close(sae(x), out_norm / s)
    assert torch.equal(sae.W_dec, dec)  # decoder untouched: unit rows stay unit


@pytest.mark.parametrize("arch", ["relu", "jumprelu"])
def test_normalize_decoder_keeps_outputs(arch):
    sae = _perturbed(arch, dtype="float64")
    x = torch.randn(30, 24, dtype=torch.float64)
    before = sae(x)
    sae.normalize_decoder_()
    torch.testing.assert_close(sae(x), before)
    torch.testing.assert_close(sae.W_dec.norm(dim=1), torch.ones(96, dtype=torch.float64))


def test_own_format_round_trip_refuses_overwrite(tmp_path):
    sae = _perturbed("batchtopk")
    sae.cfg.site = "blocks.1.hook_resid_post"
    sae.save(tmp_path / "s")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        sae.save(tmp_path / "s")
    back = SAE.load(tmp_path / "s")
    x = torch.randn(9, 24)
    assert back.arch == "batchtopk" and back.site == "blocks.1.hook_resid_post"
    torch.testing.assert_close(back(x), sae(x), atol=0, rtol=0)


# --- sparse decoder -----------------------------------------------------------------------------
def _dense_grads(sae: SAE, x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor):
    pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
    v = torch.relu(pre[rows, cols])
    z = torch.zeros_like(pre).index_put((rows, cols), v)
    out = z @ sae.W_dec + sae.b_dec
    loss = (out - x).pow(2).sum(-1).mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in sae.named_parameters() if p.grad is not None}
    sae.zero_grad()
    return out.detach(), grads


def _sparse_grads(sae: SAE, x: torch.Tensor, act: Active, backend: str):
    with torch.no_grad():
        pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
    pv = sparse_encode(x, sae.b_dec, sae.W_enc, sae.b_enc, pre[act.rows, act.cols], act, backend=backend)
    out = sparse_decode(torch.relu(pv), sae.W_dec, act, backend=backend) + sae.b_dec
    loss = (out - x).pow(2).sum(-1).mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in sae.named_parameters() if p.grad is not None}
    sae.zero_grad()
    return out.detach(), grads


def _active(kind: str, sae: SAE, x: torch.Tensor) -> Active:
    with torch.no_grad():
        pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
    if kind == "topk":
        return Active.from_topk(pre.topk(sae.cfg.k, dim=-1).indices)
    flat = torch.relu(pre).reshape(-1)  # batch top-k: rows get different counts, some none
    keep = flat.topk(x.shape[0] * sae.cfg.k).indices
    return Active.from_flat(keep, x.shape[0], sae.d_sae)


@pytest.mark.parametrize("kind", ["topk", "batchtopk"])
def test_sparse_decoder_gradients_match_dense_autograd(kind):
    sae = _perturbed("topk", d_in=32, d_sae=128, k=6)
    x = torch.randn(50, 32)
    act = _active(kind, sae, x)
    if kind == "batchtopk":
        counts = act.row_ptr.diff()
        assert counts.min() != counts.max()  # really variable-length rows
    out_d, g_d = _dense_grads(sae, x, act.rows, act.cols)
    out_s, g_s = _sparse_grads(sae, x, act, "torch")
    torch.testing.assert_close(out_s, out_d, atol=1e-5, rtol=0)
    assert set(g_s) == set(g_d) == {"W_enc", "b_enc", "W_dec", "b_dec"}
    for n in g_d:
        torch.testing.assert_close(g_s[n], g_d[n], atol=1e-5, rtol=0, msg=n)
        assert g_d[n].abs().max() > 1e-3  # gradients are not trivially zero


def test_sparse_primitives_float64_exact():
    g = torch.Generator().manual_seed(3)
    table = torch.randn(40, 16, generator=g, dtype=torch.float64)
    src = torch.randn(10, 16, generator=g, dtype=torch.float64)
    flat = torch.randperm(10 * 40, generator=g)[:37]
    act = Active.from_flat(flat, 10, 40)
    w = torch.randn(37, generator=g, dtype=torch.float64)
    dense = torch.zeros(10, 40, dtype=torch.float64).index_put((act.rows, act.cols), w)
    torch.testing.assert_close(gather_sum(table, w, act, backend="torch"), dense @ table, atol=1e-12, rtol=0)
    torch.testing.assert_close(gather_dot(table, src, act, backend="torch"), (src @ table.T)[act.rows, act.cols],
                               atol=1e-12, rtol=0)
    torch.testing.assert_close(scatter_outer(40, w, src, act, backend="torch"), dense.T @ src, atol=1e-12, rtol=0)
    torch.testing.assert_close(scatter_outer(40, w, src, act, backend="torch", transpose=True), src.T @ dense,
                               atol=1e-12, rtol=0)


_TRITON_CHECK = """
import json, sys
import torch
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
from test_sae_core import _active, _dense_grads, _perturbed, _sparse_grads
out = {{}}
for kind in ("topk", "batchtopk"):
    sae = _perturbed("topk", d_in=72, d_sae=96, k=5)  # d_in spans two 64-wide blocks; k is no block multiple
    x = torch.randn(21, 72, generator=torch.Generator().manual_seed(5))
    act = _active(kind, sae, x)
    out_d, g_d = _dense_grads(sae, x, act.rows, act.cols)
    out_t, g_t = _sparse_grads(sae, x, act, "triton")
    out[kind] = {{"out": float((out_t - out_d).abs().max()), **{{n: float((g_t[n] - g_d[n]).abs().max()) for n in g_d}},
                 "scale": float(min(g.abs().max() for g in g_d.values()))}}
print(json.dumps(out))
"""


def test_triton_kernels_interpreted_match_dense():
    """The Triton kernels, run by Triton's interpreter on the CPU, give dense autograd's outputs and gradients.

    TRITON_INTERPRET must be set before triton is first imported, hence a fresh process."""
    if sys.platform != "linux":
        pytest.skip("triton is installed on Linux only (pyproject's dev extra)")
    import json
    from pathlib import Path

    import triton  # noqa: F401  on Linux a [dev] install has it: a missing one fails, it is not skipped

    tests = Path(__file__).resolve().parent
    code = _TRITON_CHECK.format(root=str(tests.parent), tests=str(tests))
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for kind, errs in res.items():
        assert errs["scale"] > 1e-3, kind
        for name, err in errs.items():
            if name != "scale":
                assert err < 1e-5, (kind, name, err)


def test_import_sae_without_triton_or_saelens():
    code = ("import sys; sys.modules['triton'] = None; sys.modules['sae_lens'] = None\n"
            "import torch, sae\n"
            "from sae.model import SAE, SAEConfig\n"
            "from sae.sparse_decoder import Active, sparse_decode\n"
            "s = SAE(SAEConfig(8, 16, arch='topk', k=2)); x = torch.randn(3, 8)\n"
            "idx = s.pre_acts(x).topk(2, dim=-1).indices\n"
            "out = sparse_decode(torch.ones(6), s.W_dec, Active.from_topk(idx), backend='auto')\n"
            "assert out.shape == (3, 8); print('ok')\n")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=os.getcwd())
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
