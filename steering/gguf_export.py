"""Export to GGUF for llama.cpp: a (baked) Llama-family model, and additive steering as a control vector.

:func:`export_gguf` writes the weights in F32 or F16 (1-D tensors stay F32, as llama.cpp's converter keeps
them) under the tensor names of the ``gguf`` package's own name map, with the query/key rows reordered for
ggml's rotary layout, and the biases a bake added (llama.cpp's Llama graph reads optional ``attn_output`` and
``ffn_down`` biases). A byte-level BPE tokenizer (GPT-2 style, as SmolLM2's) is written with its merges;
another kind is left out (``tokenizer.ggml.model = "no_vocab"``) with a warning. Reading the file back with
transformers: ``from_pretrained(folder, gguf_file=name)``; transformers builds a Llama config from the GGUF
keys alone, which carry no ``attention_bias`` / ``mlp_bias``, so for a model baked with
:func:`steering.bake_addition` pass ``config=`` (the baked model's) or the biases are dropped.

:func:`export_control_vector` writes llama.cpp's control-vector format (``general.architecture =
"controlvector"``, one F32 ``[d]`` tensor ``direction.{k}`` per block ``k``, added to block ``k``'s output at every
position; llama.cpp rejects ``direction.0``, so block 0 cannot be steered). The ``gguf`` package names no
constants for it (as of gguf 0.19), so the keys are spelled here.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import numpy as np
import torch

from interp.io import atomic_write, check_writable
from interp.models import Model
from steering.baking import check_in_memory
from steering.bias import additions, check_saveable

CONTROL_ARCH = "controlvector"
CONTROL_HINT = "controlvector.model_hint"
CONTROL_LAYERS = "controlvector.layer_count"
FAMILIES = ("llama",)
DTYPES = ("f32", "f16")


def _check_model(model: Model) -> Any:
    c = model.config
    if model.spec.family not in FAMILIES or getattr(c, "model_type", None) != "llama":
        raise ValueError(f"export_gguf writes Llama-architecture models (model_type 'llama'); this is "
                         f"{getattr(c, 'model_type', model.spec.family)!r}: save_pretrained it and convert the folder "
                         f"with llama.cpp's convert_hf_to_gguf.py")
    rope = dict(getattr(c, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default" or getattr(c, "hidden_act", "silu") != "silu":
        raise ValueError(f"export_gguf writes plain rotary Llamas (rope_type 'default', SiLU); this one has rope "
                         f"{rope.get('rope_type')!r}, act {c.hidden_act!r}: use llama.cpp's convert_hf_to_gguf.py")
    return c


def _rope_theta(c: Any) -> float:
    rope = dict(getattr(c, "rope_parameters", None) or {})
    return float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0)))


def _to_ggml_rope(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of each head from HF's rotate-half order (pairs ``i, i + dh/2``) to ggml's adjacent pairs (``2i, 2i+1``)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _hparams(w: Any, model: Model, c: Any, dtype: str) -> None:
    import gguf

    w.add_name(model.name)
    w.add_context_length(int(c.max_position_embeddings))
    w.add_embedding_length(model.d_model)
    w.add_block_count(model.n_layers)
    w.add_feed_forward_length(int(c.intermediate_size))
    w.add_head_count(model.n_heads)
    w.add_head_count_kv(model.n_kv_heads)
    w.add_layer_norm_rms_eps(float(c.rms_norm_eps))
    w.add_rope_freq_base(_rope_theta(c))
    w.add_rope_dimension_count(model.d_head)
    if model.d_head * model.n_heads != model.d_model:
        w.add_key_length(model.d_head)
        w.add_value_length(model.d_head)
    w.add_vocab_size(int(c.vocab_size))
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)


def _tensors(model: Model, dtype: str) -> list[tuple[str, np.ndarray]]:
    """``(gguf name, array)`` for every parameter, in HF shapes (the writer reverses them into ggml's order)."""
    import gguf

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, model.n_layers)
    out = []
    for hf_name, p in model.hf.named_parameters():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"no GGUF name for {hf_name}; export_gguf writes the plain Llama layout")
        t = p.detach().float().cpu()
        if ".attn_q." in name or ".attn_k." in name:
            t = _to_ggml_rope(t, model.n_heads if ".attn_q." in name else model.n_kv_heads)
        arr = t.numpy()
        out.append((name, arr.astype(np.float16) if dtype == "f16" and arr.ndim > 1 else arr))
    return out


def _tokenizer(w: Any, tok: Any, vocab_size: int) -> str | None:
    """Write a byte-level BPE vocabulary with its merges and special ids; else ``no_vocab`` and the reason."""
    import gguf

    backend = getattr(tok, "backend_tokenizer", None)
    spec = json.loads(backend.to_str()) if backend is not None else {}
    model, pre = spec.get("model") or {}, json.dumps(spec.get("pre_tokenizer"))
    if model.get("type") != "BPE" or model.get("byte_fallback") or "ByteLevel" not in pre:
        w.add_tokenizer_model("no_vocab")
        return (f"the tokenizer ({model.get('type') or type(tok).__name__}) is not a byte-level BPE, so the GGUF holds no "
                f"vocabulary (tokenizer.ggml.model = 'no_vocab'); feed llama.cpp token ids, or convert the saved folder "
                f"with llama.cpp's convert_hf_to_gguf.py")
    inv = {i: t for t, i in model["vocab"].items()}
    added = {a["id"]: a for a in spec.get("added_tokens", [])}
    tokens, types = [], []
    for i in range(vocab_size):
        if i in added:
            tokens.append(added[i]["content"])
            types.append(gguf.TokenType.CONTROL if added[i]["special"] else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(inv.get(i, f"[PAD{i}]"))
            types.append(gguf.TokenType.NORMAL if i in inv else gguf.TokenType.UNUSED)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])])
    for key, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("unk", w.add_unk_token_id),
                     ("pad", w.add_pad_token_id)):
        tid = getattr(tok, f"{key}_token_id", None)
        if isinstance(tid, int):
            add(tid)
    if isinstance(getattr(tok, "chat_template", None), str):
        w.add_chat_template(tok.chat_template)
    return None


def _write(path: str | os.PathLike, arch: str, fill: Any) -> None:
    import gguf

    def write(tmp: str) -> None:
        w = gguf.GGUFWriter(tmp, arch)
        fill(w)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    atomic_write(path, write)


def export_gguf(model: Model, path: str | os.PathLike, dtype: str = "f32", overwrite: bool = False) -> os.PathLike:
    """Write a Llama-architecture ``model`` (plain, or baked by :func:`steering.bake` / :func:`steering.bake_addition`)
    to one GGUF file for llama.cpp, weights in ``dtype`` (``"f32"`` or ``"f16"``), atomically; returns the path.

    It reads back with ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)`` to the same logits within
    the format's precision (pass ``config=model.config`` when the model carries baked biases: see the module
    docstring). Offloaded weights are refused (export ``interp.models.materialize(model)``), and so are biases its
    config cannot declare (:func:`steering.bias.check_saveable`).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES} (quantise the F16 file with llama.cpp's llama-quantize)")
    check_in_memory(model, "export_gguf")
    c = _check_model(model)
    check_saveable(model, "export_gguf")
    p = check_writable(path, overwrite)
    tensors = _tensors(model, dtype)
    note: list[str | None] = []

    def fill(w: Any) -> None:
        _hparams(w, model, c, dtype)
        note.append(_tokenizer(w, model.tokenizer, int(c.vocab_size)) if model.tokenizer is not None else
                    "no tokenizer attached")
        for name, arr in tensors:
            w.add_tensor(name, arr)

    _write(p, "llama", fill)
    if note and note[0]:
        warnings.warn(f"export_gguf: {note[0]}", stacklevel=2)
    return p


def control_directions(model: Model, *interventions: Any) -> dict[int, torch.Tensor]:
    """``{block k: float32 [d]}``: what the ``AddVector`` interventions add to block ``k``'s output (``resid_post k``,
    or ``resid_pre k+1``), the layout of a llama.cpp control vector; anything else is refused with the reason."""
    what = "export_control_vector"
    out: dict[int, torch.Tensor] = {}
    for site, v in additions(model, *interventions, what=what).items():
        assert site.layer is not None
        if site.kind not in ("resid_post", "resid_pre"):
            raise ValueError(f"{what}: llama.cpp adds a control vector to a block's output (resid_post) only, not at "
                             f"{site.name}; bake it instead (steering.bake_addition, then export_gguf)")
        k = site.layer if site.kind == "resid_post" else site.layer - 1
        if k < 1:
            raise ValueError(f"{what}: {site.name} is block 0's output, which llama.cpp never steers (it rejects "
                             f"direction.0); steer block 1 or later, or bake it (steering.bake_addition, export_gguf)")
        out[k] = out.get(k, torch.zeros_like(v)) + v
    return {k: out[k].float() for k in sorted(out)}


def export_control_vector(model: Model, path: str | os.PathLike, *interventions: Any,
                          overwrite: bool = False) -> os.PathLike:
    """Write the additions of ``steering.AddVector`` interventions (scope ``"both"``, all positions, at
    ``resid_post`` of blocks >= 1) as a llama.cpp control vector GGUF, atomically; returns the path. The vectors
    are stored as added (alpha included): load with ``--control-vector FILE`` (or ``--control-vector-scaled FILE 1``)."""
    dirs = control_directions(model, *interventions)
    p = check_writable(path, overwrite)

    def fill(w: Any) -> None:
        w.add_string(CONTROL_HINT, str(getattr(model.config, "model_type", model.spec.family)))
        w.add_uint32(CONTROL_LAYERS, model.n_layers)
        for k, v in dirs.items():
            w.add_tensor(f"direction.{k}", v.numpy().astype(np.float32))

    _write(p, CONTROL_ARCH, fill)
    return p
