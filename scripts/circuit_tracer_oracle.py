"""circuit-tracer's attribution graph of a tiny model, as a test oracle (runs ONLY in .oracle-venv).

    .oracle-venv/bin/python scripts/circuit_tracer_oracle.py IN_DIR OUT_DIR

IN_DIR (written by tests/test_graphs_circuit_tracer.py):
  model/                        an HF Llama folder (``save_pretrained``: config, safetensors weights, tokenizer)
  transcoders/layer_{i}.safetensors   one per layer, in circuit-tracer's own file layout (``W_enc [d_sae, d]``,
                                ``W_dec [d_sae, d]``, ``b_enc``, ``b_dec``, optional ``W_skip [d_out, d_in]`` and
                                ``activation_function.threshold``), read by ``circuit_tracer.transcoder.load_transcoder_set``;
                                or, when ``transcoders/config.yaml`` says ``model_kind: cross_layer_transcoder``, a
                                cross-layer transcoder (``W_enc_{i}`` / ``W_dec_{i}`` files) read by its ``load_clt``
  prompt.json                   ``{"ids": [...], "batch_size": int, "max_n_logits": int, "desired_logit_prob": float,
                                "repeats": int}`` (``repeats``: time the attribution this many times, report the median)

OUT_DIR: ``graph.safetensors`` (the dense ``adjacency``, ``active_features [n, 3]``, ``selected_features``,
``activation_values``, ``input_tokens``, ``logit_ids``, ``logit_probabilities``, ``logit_vectors`` (the demeaned
unembedding rows it attributes), ``logits`` (its model's last-position logits)) and ``meta.json`` (versions, the
hooks, the node counts, seconds). It builds TransformerLens's ``HookedTransformerConfig`` from the HF config by
hand, converts the HF weights with TransformerLens's own converter and builds circuit-tracer's ReplacementModel
with ``ReplacementModel.from_config`` (TransformerLens backend). Imports nothing of interp-toolkit.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

FEATURE_INPUT_HOOK = "mlp.hook_in"
FEATURE_OUTPUT_HOOK = "mlp.hook_out"


def tl_config(hf_cfg):
    """TransformerLens's config of a Llama, written from the HF config (no hub look-up)."""
    from transformer_lens import HookedTransformerConfig

    d_head = getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // hf_cfg.num_attention_heads
    n_kv = getattr(hf_cfg, "num_key_value_heads", None) or hf_cfg.num_attention_heads
    rope = getattr(hf_cfg, "rope_theta", None) or (getattr(hf_cfg, "rope_parameters", None) or {}).get(
        "rope_theta", 10000.0)
    return HookedTransformerConfig(
        d_model=hf_cfg.hidden_size, n_layers=hf_cfg.num_hidden_layers, n_heads=hf_cfg.num_attention_heads,
        d_head=d_head, d_mlp=hf_cfg.intermediate_size, d_vocab=hf_cfg.vocab_size,
        n_ctx=hf_cfg.max_position_embeddings, act_fn="silu", normalization_type="RMS", eps=hf_cfg.rms_norm_eps,
        positional_embedding_type="rotary", rotary_dim=d_head, rotary_base=float(rope), gated_mlp=True,
        final_rms=True, n_key_value_heads=n_kv if n_kv != hf_cfg.num_attention_heads else None,
        original_architecture="LlamaForCausalLM", model_name="tiny-llama", dtype=torch.float32, device="cpu",
        default_prepend_bos=False)


def tokenizer(folder: Path, out: Path):
    """The saved fast tokenizer. transformers 5 writes ``tokenizer_class: TokenizersBackend``, which 4.57 does not
    know, so read ``tokenizer.json`` and the special tokens from ``tokenizer_config.json`` directly, and save a
    copy 4.57 reads to ``out`` (TransformerLens reloads the tokenizer from its folder to add a BOS)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    special = {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if isinstance(cfg.get(k), str)}
    extra = cfg.get("extra_special_tokens") or cfg.get("additional_special_tokens") or []
    tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), **special,
                                  additional_special_tokens=list(extra))
    tok.save_pretrained(out)
    return AutoTokenizer.from_pretrained(out)


def model_kind(folder: Path) -> str:
    """``model_kind`` of the folder's ``config.yaml`` (``transcoder_set`` when there is none)."""
    import yaml

    cfg = folder / "config.yaml"
    return (yaml.safe_load(cfg.read_text()) or {}).get("model_kind", "transcoder_set") if cfg.exists() else \
        "transcoder_set"


def build(in_dir: Path, out_dir: Path):
    """circuit-tracer's ReplacementModel on the saved Llama and transcoders."""
    from circuit_tracer import ReplacementModel
    from circuit_tracer.transcoder import load_transcoder_set
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(in_dir / "model", torch_dtype=torch.float32).eval()
    tok = tokenizer(in_dir / "model", out_dir / "tokenizer")
    cfg = tl_config(hf.config)
    n = cfg.n_layers
    if model_kind(in_dir / "transcoders") == "cross_layer_transcoder":
        from circuit_tracer.transcoder.cross_layer_transcoder import load_clt

        tcs = load_clt(str(in_dir / "transcoders"), feature_input_hook=FEATURE_INPUT_HOOK,
                       feature_output_hook=FEATURE_OUTPUT_HOOK, scan="tiny-llama-test", device=torch.device("cpu"),
                       dtype=torch.float32, lazy_decoder=False, lazy_encoder=False)
    else:
        paths = {i: str(in_dir / "transcoders" / f"layer_{i}.safetensors") for i in range(n)}
        tcs = load_transcoder_set(paths, scan="tiny-llama-test", feature_input_hook=FEATURE_INPUT_HOOK,
                                  feature_output_hook=FEATURE_OUTPUT_HOOK, device=torch.device("cpu"),
                                  dtype=torch.float32, lazy_encoder=False, lazy_decoder=False)
    rm = ReplacementModel.from_config(cfg, tcs, backend="transformerlens", tokenizer=tok)
    sd = convert_llama_weights(hf, cfg)
    # circuit-tracer wraps each MLP and the unembedding in a module with extra hooks
    sd = {k.replace(".mlp.", ".mlp.old_mlp.").replace("unembed.", "unembed.old_unembed."): v for k, v in sd.items()}
    missing, unexpected = rm.load_state_dict(sd, strict=False)
    bad = [k for k in missing if not k.startswith("transcoders.")
           and not k.endswith(("IGNORE", "mask", "rotary_sin", "rotary_cos", "b_U"))]
    if bad or unexpected:
        raise RuntimeError(f"weight conversion mismatch: missing={bad[:8]} unexpected={unexpected[:8]}")
    return hf, rm


def main(in_dir: Path, out_dir: Path) -> None:
    from importlib.metadata import version

    from circuit_tracer import attribute
    from safetensors.torch import save_file

    spec = json.loads((in_dir / "prompt.json").read_text())
    ids = torch.tensor(spec["ids"], dtype=torch.long)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf, rm = build(in_dir, out_dir)
    with torch.no_grad():
        hf_logits = hf(ids[None]).logits[0, -1]
        tl_logits = rm(ids[None])[0, -1]
    times = []
    for _ in range(int(spec.get("repeats", 1))):   # a benchmark asks for repeats; the median is reported
        t0 = time.perf_counter()
        g = attribute(ids, rm, max_n_logits=spec.get("max_n_logits", 10),
                      desired_logit_prob=spec.get("desired_logit_prob", 0.95), batch_size=spec.get("batch_size", 64))
        times.append(time.perf_counter() - t0)
    seconds = sorted(times)[len(times) // 2]
    logit_ids = torch.tensor([t.vocab_idx for t in g.logit_targets], dtype=torch.long)
    W_U = rm.unembed.W_U.detach()
    tensors = {
        "adjacency": g.adjacency_matrix.float().contiguous(),
        "active_features": g.active_features.long().contiguous(),
        "selected_features": g.selected_features.long().contiguous(),
        "activation_values": g.activation_values.float().contiguous(),
        "input_tokens": g.input_tokens.long().contiguous(),
        "logit_ids": logit_ids,
        "logit_probabilities": g.logit_probabilities.float().contiguous(),
        "logit_vectors": (W_U[:, logit_ids] - W_U.mean(-1, keepdim=True)).T.contiguous(),
        "logits": tl_logits.float().contiguous(),
    }
    tmp = out_dir / "graph.safetensors.tmp"
    save_file(tensors, str(tmp))
    os.replace(tmp, out_dir / "graph.safetensors")
    meta = {
        "versions": {name: version(name) for name in ("circuit-tracer", "transformer-lens", "transformers", "torch")},
        "backend": "transformerlens", "feature_input_hook": FEATURE_INPUT_HOOK,
        "feature_output_hook": FEATURE_OUTPUT_HOOK, "n_layers": rm.cfg.n_layers, "n_positions": int(ids.numel()),
        "n_active": int(g.active_features.shape[0]), "n_selected": int(g.selected_features.shape[0]),
        "n_logits": len(g.logit_targets), "seconds": round(seconds, 4),
        "transcoders": type(rm.transcoders).__name__,
        "tl_vs_hf_logits_max_abs": float((tl_logits - hf_logits).abs().max()),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    tmp = out_dir / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, out_dir / "meta.json")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: circuit_tracer_oracle.py IN_DIR OUT_DIR")
    main(Path(sys.argv[1]), Path(sys.argv[2]))
