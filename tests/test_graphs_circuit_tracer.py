"""Our attribution graph against circuit-tracer's (0.5, TransformerLens backend) on the same tiny Llama and the
same transcoders: every edge equal within float32 rounding.

circuit-tracer pins transformers <= 4.57.3, so it runs in its own environment (``bash scripts/oracle_venv.sh``
makes ``.oracle-venv/``) through ``scripts/circuit_tracer_oracle.py``; the two sides meet through files: the HF
folder (``save_pretrained``), the transcoders in circuit-tracer's file layout, the prompt's ids, and its graph as
tensors. It builds its model from a hand-written ``HookedTransformerConfig`` with TransformerLens's own weight
conversion, so the forward is TransformerLens's arithmetic, not HF's: the two agree to float32 rounding.

The mapping of conventions (both sides, no post-hoc change of values):
- sites: its ``feature_input_hook="mlp.hook_in"`` / ``feature_output_hook="mlp.hook_out"`` are our transcoders'
  ``blocks.L.mlp.hook_in`` / ``hook_out`` (the MLP module's input after the norm's gain, and its output);
  ``W_enc`` and ``W_skip`` are stored transposed in its layout (``W_enc [d_sae, d]``, ``x @ W_skip.T``).
- edges: both take ``A[t, s] = activation_s * W_dec[s] . d(t) / d(mlp_out)`` for features, ``error . grad`` for
  error nodes, ``embedding . grad`` at the embedding for tokens; feature rows read the encoder pre-activation
  (``W_enc[f]`` injected at the MLP input); attention patterns and norm scales frozen, the skip carries gradient.
- targets: its default, the top logits by cumulative probability (``max_n_logits=10``, ``desired_logit_prob=0.95``)
  read after the final norm, each as its unembedding row minus the mean row, weighted by its probability: our
  :class:`~patching.graph_targets.TopLogits`. We check our default picks its tokens, then pass them explicitly
  (``TopLogits(tokens=...)``) so the rows line up in its order.
- the first position: circuit-tracer holds position 0 (the BOS attention sink) out of the graph: no feature
  nodes there and its error vectors zeroed. Our ``attribution_graph(..., config=GraphConfig(constant_positions=1))`` does the same
  (those MLP outputs become constants, so our bookkeeping identity still holds), so the adjacencies have the
  same shape and node order: features (layer, position, feature) sorted, errors layer-major, tokens, logits.

Tolerance: ``|ours - theirs| <= 1e-5 * max|A|`` elementwise (float32 rounding of different op orders through a
2-layer model; measured 3.1e-5 absolute on edges up to 120, 2.5e-7 relative: about two float32 ulps).
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
from sae.circuit_tracer_io import save_circuit_tracer
from sae.transcoder import Transcoder, TranscoderConfig

ROOT = Path(__file__).resolve().parents[1]
ORACLE_PY = ROOT / ".oracle-venv" / "bin" / "python"
ORACLE = ROOT / "scripts" / "circuit_tracer_oracle.py"
IDS = [1, 20, 31, 42, 55, 60, 77, 9, 101]
RTOL = 1e-5

pytestmark = pytest.mark.skipif(not ORACLE_PY.exists(), reason="the circuit-tracer oracle environment .oracle-venv/ "
                                "is missing: run `bash scripts/oracle_venv.sh` to create it")


def _transcoders(model, d_sae: int = 32) -> list[Transcoder]:
    """Seeded random JumpReLU transcoders with sparse activations (about a quarter active), every layer with a skip
    connection: circuit-tracer's transcoder set shares one activation and one skip setting over its layers (its
    ``TranscoderSet.skip_connection`` is layer 0's; with a skip on some layers only, its linearised model drops the
    others' skip gradient), and ``sae.circuit_tracer_io.save_circuit_tracer`` refuses a mixed set."""
    out = []
    for layer in range(model.n_layers):
        arch = "jumprelu"
        tc = Transcoder(TranscoderConfig(d_in=model.d_model, d_sae=d_sae, arch=arch, layer=layer, skip=True),
                        seed=layer)
        g = torch.Generator().manual_seed(200 + layer)
        with torch.no_grad():
            tc.W_enc.mul_(3.0)
            tc.W_dec.mul_(0.05)
            tc.b_enc.copy_(0.5 * torch.randn(d_sae, generator=g) - 1.5)
            tc.b_dec.copy_(0.1 * torch.randn(model.d_model, generator=g))
            if tc.threshold is not None:
                tc.threshold.copy_(0.05 + 0.1 * torch.rand(d_sae, generator=g))
            if tc.W_skip is not None:
                tc.W_skip.copy_(0.05 * torch.randn(model.d_model, model.d_model, generator=g))
        out.append(tc)
    return out


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """Our replacement model and circuit-tracer's graph of the same prompt (run once, in the oracle venv)."""
    model = tiny_model("llama")
    rm = ReplacementModel(model, _transcoders(model))
    d = tmp_path_factory.mktemp("ct")
    (d / "in").mkdir(parents=True)
    model.hf.save_pretrained(d / "in" / "model")
    model.tokenizer.save_pretrained(d / "in" / "model")
    save_circuit_tracer(rm.transcoders, d / "in" / "transcoders")   # our writer, read by circuit-tracer's loader
    (d / "in" / "prompt.json").write_text(json.dumps({"ids": IDS, "batch_size": 64}))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    t0 = time.perf_counter()
    res = subprocess.run([str(ORACLE_PY), str(ORACLE), str(d / "in"), str(d / "out")], env=env, cwd=d,
                         capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise AssertionError(f"the circuit-tracer oracle failed ({res.returncode}; if .oracle-venv is broken, "
                             f"delete it and run `bash scripts/oracle_venv.sh`):\n{res.stderr[-4000:]}")
    from safetensors.torch import load_file

    theirs = load_file(str(d / "out" / "graph.safetensors"))
    meta = json.loads((d / "out" / "meta.json").read_text())
    meta["wall_seconds"] = round(time.perf_counter() - t0, 2)
    print(f"\ncircuit-tracer oracle: {meta}")
    return rm, theirs, meta


def test_the_oracle_runs_the_same_model(both):
    rm, theirs, meta = both
    real = forward(rm.model, rm.batch(IDS))[0, -1]
    assert (theirs["logits"] - real).abs().max() < 1e-5                      # TransformerLens view == HF
    assert meta["n_selected"] == meta["n_active"] > 20                       # every feature a node, sparse enough
    assert 0.05 < meta["n_active"] / (rm.n_layers * (len(IDS) - 1) * 32) < 0.6


def test_our_top_logits_pick_its_targets(both):
    rm, theirs, _ = both
    g = attribution_graph(rm, IDS, TopLogits(), config=GraphConfig(constant_positions=1))
    want = theirs["logit_vectors"].double()
    assert g.n_targets == len(theirs["logit_ids"])
    assert (g.target_vectors - want).abs().max() < 1e-6                      # same tokens, same order, demeaned
    assert (g.target_weights - theirs["logit_probabilities"].double()).abs().max() < 1e-6


def test_every_edge_equals_circuit_tracers(both):
    rm, theirs, _ = both
    A_ct = theirs["adjacency"].double()
    g = attribution_graph(rm, IDS, TopLogits(tokens=theirs["logit_ids"].tolist()),
                          config=GraphConfig(constant_positions=1), runtime=Runtime(batch_size=16, progress=False))
    assert torch.equal(g.features, theirs["active_features"])                 # same nodes, same order
    assert (g.activations - theirs["activation_values"].double()).abs().max() < 1e-5
    assert torch.equal(g.input_ids, theirs["input_tokens"])
    assert g.adjacency.shape == A_ct.shape
    diff, scale = float((g.adjacency - A_ct).abs().max()), float(A_ct.abs().max())
    print(f"\nmax |ours - circuit-tracer| = {diff:.3e}, max |edge| = {scale:.3e}, relative {diff / scale:.3e}")
    assert scale > 1e-2
    assert diff <= RTOL * scale
    # each block is non-trivial, so the comparison covers feature->feature, error->feature, token->feature, ->logit
    nf, to, lo = g.n_features, g.token_offset, g.target_offset
    blocks = {"feature->feature": A_ct[:nf, :nf], "error->feature": A_ct[:nf, nf:to],
              "token->feature": A_ct[:nf, to:lo], "all->logit": A_ct[lo:, :lo]}
    for name, blk in blocks.items():
        assert float(blk.abs().max()) > 1e-3 * scale, name
    ours = {"feature->feature": g.adjacency[:nf, :nf], "error->feature": g.adjacency[:nf, nf:to],
            "token->feature": g.adjacency[:nf, to:lo], "all->logit": g.adjacency[lo:, :lo]}
    print({k: f"{float((ours[k] - b).abs().max()):.2e} of {float(b.abs().max()):.2e}" for k, b in blocks.items()})
    assert g.completeness() < 1e-4                                           # our identity holds with the option
