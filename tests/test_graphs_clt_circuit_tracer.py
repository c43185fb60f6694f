"""Our attribution graph with a cross-layer transcoder against circuit-tracer's (0.5, TransformerLens backend) on the
same tiny 3-layer Llama and the same CLT weights: every edge equal within float32 rounding.

The pattern of ``tests/test_graphs_circuit_tracer.py`` (read its docstring for the mapping of conventions): the
two sides meet through files only. Here the CLT goes through our writer (``sae.clt_io.save_circuit_tracer_clt``:
``config.yaml`` with ``model_kind: cross_layer_transcoder``, ``W_enc_{i}`` / ``W_dec_{i}`` files) and circuit-tracer
reads it with its own ``load_clt`` (``scripts/circuit_tracer_oracle.py`` picks it from the config). A feature of
layer ``l`` writes into MLP ``l`` and every later MLP; circuit-tracer's attribution contracts each of those decoder
vectors with the gradient at its MLP output and sums them into the feature's column, as ours does.

Tolerance: ``|ours - theirs| <= 1e-5 * max|A|`` elementwise (float32 rounding of different op orders).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch

from interp.forward import forward
from interp.patching import GraphConfig, ReplacementModel, attribution_graph
from interp.patching.graph_targets import TopLogits
from interp.testing.tiny import tiny_model
from interp.values import Runtime
from sae.clt import CLTConfig, CrossLayerTranscoder
from sae.clt_io import save_circuit_tracer_clt

ROOT = Path(__file__).resolve().parents[1]
ORACLE_PY = ROOT / ".oracle-venv" / "bin" / "python"
ORACLE = ROOT / "scripts" / "circuit_tracer_oracle.py"
IDS = [1, 20, 31, 42, 55, 60, 77, 9, 101]
RTOL = 1e-5
N_LAYERS, D_SAE = 3, 32

pytestmark = pytest.mark.skipif(not ORACLE_PY.exists(), reason="the circuit-tracer oracle environment .oracle-venv/ "
                                "is missing: run `bash scripts/oracle_venv.sh` to create it")


def seeded_clt(model, arch: str = "jumprelu", d_sae: int = D_SAE, seed: int = 0) -> CrossLayerTranscoder:
    """A seeded random CLT with sparse activations (about a third active) and cross-layer decoders of the same size
    as the same-layer ones, so the cross-layer edges are not negligible."""
    clt = CrossLayerTranscoder(CLTConfig(n_layers=model.n_layers, d_in=model.d_model, d_sae=d_sae, arch=arch,
                                         model_id=model.name), seed=seed)
    g = torch.Generator().manual_seed(300 + seed)
    with torch.no_grad():
        for tc in clt.layers:
            tc.W_enc.mul_(3.0)
            tc.W_dec.mul_(0.05)
            tc.b_enc.copy_(0.5 * torch.randn(d_sae, generator=g) - 1.5)
            tc.b_dec.copy_(0.1 * torch.randn(model.d_model, generator=g))
            if tc.threshold is not None:
                tc.threshold.copy_(0.05 + 0.1 * torch.rand(d_sae, generator=g))
        for w in clt.W_later:
            w.copy_(0.05 * torch.randn(w.shape, generator=g) / model.d_model ** 0.5 * 8)
    return clt


def run_oracle(d: Path, model, clt: CrossLayerTranscoder, ids: list[int] = IDS, repeats: int = 1, threads: int = 1
               ) -> tuple[dict, dict]:
    """circuit-tracer's graph of ``ids`` for ``model`` with ``clt`` (files under ``d``; ``repeats``: its attribution
    timed that many times, the median in ``meta["seconds"]``): its tensors and meta."""
    (d / "in").mkdir(parents=True, exist_ok=True)
    model.hf.save_pretrained(d / "in" / "model")
    model.tokenizer.save_pretrained(d / "in" / "model")
    save_circuit_tracer_clt(clt, d / "in" / "transcoders", overwrite=True)   # ours, read by its load_clt
    (d / "in" / "prompt.json").write_text(json.dumps({"ids": ids, "batch_size": 64, "repeats": repeats}))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS=str(threads))
    t0 = time.perf_counter()
    res = subprocess.run([str(ORACLE_PY), str(ORACLE), str(d / "in"), str(d / "out")], env=env, cwd=d,
                         capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise AssertionError(f"the circuit-tracer oracle failed ({res.returncode}; if .oracle-venv is broken, "
                             f"delete it and run `bash scripts/oracle_venv.sh`):\n{res.stderr[-4000:]}")
    from safetensors.torch import load_file

    meta = json.loads((d / "out" / "meta.json").read_text())
    meta["wall_seconds"] = round(time.perf_counter() - t0, 2)
    return load_file(str(d / "out" / "graph.safetensors")), meta


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    model = tiny_model("llama", num_hidden_layers=N_LAYERS)
    clt = seeded_clt(model)
    theirs, meta = run_oracle(tmp_path_factory.mktemp("ct_clt"), model, clt)
    print(f"\ncircuit-tracer oracle (CLT): {meta}")
    return ReplacementModel(model, clt), theirs, meta


def test_the_oracle_runs_our_clt(both):
    rm, theirs, meta = both
    assert meta["transcoders"] == "CrossLayerTranscoder"
    real = forward(rm.model, rm.batch(IDS))[0, -1]
    assert (theirs["logits"] - real).abs().max() < 1e-5
    assert meta["n_selected"] == meta["n_active"]
    assert 0.05 < meta["n_active"] / (rm.n_layers * (len(IDS) - 1) * D_SAE) < 0.6


def test_every_clt_edge_equals_circuit_tracers(both):
    rm, theirs, _ = both
    A_ct = theirs["adjacency"].double()
    g = attribution_graph(rm, IDS, TopLogits(), config=GraphConfig(constant_positions=1),
                          runtime=Runtime(batch_size=16, progress=False))
    assert g.n_targets == len(theirs["logit_ids"])
    assert (g.target_vectors - theirs["logit_vectors"].double()).abs().max() < 1e-6   # same logit nodes, same order
    assert (g.target_weights - theirs["logit_probabilities"].double()).abs().max() < 1e-6
    assert torch.equal(g.features, theirs["active_features"])                         # same feature nodes
    assert (g.activations - theirs["activation_values"].double()).abs().max() < 1e-5
    assert torch.equal(g.input_ids, theirs["input_tokens"])
    assert g.adjacency.shape == A_ct.shape
    diff, scale = float((g.adjacency - A_ct).abs().max()), float(A_ct.abs().max())
    print(f"\nCLT graph {tuple(A_ct.shape)}: max |ours - circuit-tracer| = {diff:.3e}, max |edge| = {scale:.3e}")
    assert scale > 1e-2
    assert diff <= RTOL * scale
    assert g.completeness() < 1e-4


def test_cross_layer_edges_matter(both):
    """The comparison covers the cross-layer writes: feature -> later-layer feature edges change by more than the
    tolerance when the cross-layer decoders are dropped (a per-layer transcoder with the same encoders)."""
    rm, theirs, _ = both
    A_ct = theirs["adjacency"].double()
    per_layer = ReplacementModel(rm.model, rm.clt.transcoders)
    g = attribution_graph(per_layer, IDS, TopLogits(tokens=theirs["logit_ids"].tolist()),
                          config=GraphConfig(constant_positions=1))
    assert g.adjacency.shape == A_ct.shape                                              # same encoders, same nodes
    assert float((g.adjacency - A_ct).abs().max()) > 100 * RTOL * float(A_ct.abs().max())


def test_we_read_the_files_circuit_tracer_writes(tmp_path):
    """circuit-tracer loads our CLT files, writes them back with its own ``to_safetensors`` (the cache layout, with
    the config it keeps beside them); we read those exactly."""
    from sae.clt_io import load_circuit_tracer_clt

    model = tiny_model("llama", num_hidden_layers=N_LAYERS)
    clt = seeded_clt(model, seed=2)
    save_circuit_tracer_clt(clt, tmp_path / "ours")
    code = ("import sys, yaml, torch\n"
            "from circuit_tracer.transcoder.cross_layer_transcoder import load_clt\n"
            "c = load_clt(sys.argv[1], feature_input_hook='mlp.hook_in', feature_output_hook='mlp.hook_out',"
            " device=torch.device('cpu'), dtype=torch.float32, lazy_decoder=False)\n"
            "c.to_safetensors(sys.argv[2])\n"
            "open(sys.argv[2] + '/config.yaml', 'w').write(yaml.dump({'model_kind': 'cross_layer_transcoder',"
            " 'model_name': 'tiny-llama', 'feature_input_hook': c.feature_input_hook,"
            " 'feature_output_hook': c.feature_output_hook}))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    res = subprocess.run([str(ORACLE_PY), "-c", code, str(tmp_path / "ours"), str(tmp_path / "theirs")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    back = load_circuit_tracer_clt(tmp_path / "theirs", model=model)
    sa, sb = clt.state_dict(), back.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
