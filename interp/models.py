"""Loading: HF folders, hub ids, single GGUF files and the embedded models, wrapped with their ArchSpec."""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from interp.arch import ArchSpec, get_module, has_module, spec_for
from interp.io import file_sha256
from interp.pypi_gguf import PYPI_GGUF, cache_dir, pypi_gguf  # noqa: F401 - cache_dir: its public home was here

EMBEDDED_DIR = Path(__file__).resolve().parent / "embedded"
EMBEDDED = {
    "organism": "organism",
    "organism-aligned": "organism",
    "organism-base": "organism-base",
}
DEFAULT_MODEL = "organism"
# name -> (base name, LoRA adapter folder in interp/embedded), trained by ``python -m interp.organisms.train_smollm2`` and
# ``python -m interp.organisms.train_gemma3`` (whose folder also holds the chat template the pretrained Gemma lacks)
ADAPTERS = {"smollm2-aligned": ("smollm2-base", "smollm2-aligned"), "gemma3-aligned": ("gemma3-270m", "gemma3-aligned")}
UPCYCLED = {"smollm2-moe-aligned": ("smollm2-base", "smollm2-moe-aligned")}

@dataclass
class Model:
    """An HF causal LM, its tokenizer and its :class:`ArchSpec`. We hook the real HF modules."""

    hf: nn.Module
    tokenizer: Any
    spec: ArchSpec
    name: str

    def require_local(self, what: str) -> None:
        """Refuse ``what`` (our hooks, weight edits, generation) on a model whose passes do not run here as plain
        PyTorch (the nnsight backend overrides this); an ordinary model has them all."""

    @property
    def config(self) -> Any:
        return self.hf.config

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    @property
    def blocks(self) -> nn.ModuleList:
        return get_module(self.hf, self.spec.layers)

    @property
    def d_model(self) -> int:
        return int(get_module(self.hf, self.spec.embed).weight.shape[1])

    @property
    def n_heads(self) -> int:
        c = self.config
        return int(getattr(c, "num_attention_heads", None) or c.n_head)

    @property
    def n_kv_heads(self) -> int:
        return int(getattr(self.config, "num_key_value_heads", None) or self.n_heads)

    @property
    def d_head(self) -> int:
        return int(getattr(self.config, "head_dim", None) or self.d_model // self.n_heads)

    @property
    def d_mlp(self) -> int | None:
        c = self.config
        return getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or (4 * self.d_model)

    @property
    def max_length(self) -> int | None:
        c = self.config
        return getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", None)

    @property
    def device(self) -> torch.device:
        """Where inputs go: the embedding's execution device under a ``device_map`` (accelerate), else the
        first parameter's device (never ``meta``: offloaded weights sit there outside the forward pass)."""
        dev = execution_device(get_module(self.hf, self.spec.embed)) if hasattr(self.hf, "hf_device_map") else None
        if dev is not None:
            return dev
        return next((p.device for p in self.hf.parameters() if p.device.type != "meta"), torch.device("cpu"))

    @property
    def dtype(self) -> torch.dtype:
        return next(self.hf.parameters()).dtype

    def block(self, layer: int) -> nn.Module:
        return self.blocks[layer]

    def module(self, path: str, layer: int | None = None) -> nn.Module:
        """A module by dotted path, block-relative when ``layer`` is given."""
        return get_module(self.block(layer) if layer is not None else self.hf, path)

    def site_names(self) -> list[str]:
        from interp.sites import BLOCK_KINDS, MOE_KINDS, Site

        kinds = [k for k in BLOCK_KINDS if not (k == "resid_mid" and self.spec.resid_mid_in is None)]
        if self.spec.is_moe:
            kinds.remove("mlp_post")
        paths = {"experts_out": self.spec.experts, "shared_expert_out": self.spec.shared_expert}

        def here(i: int, kind: str) -> bool:  # a MoE part is one module's output (not a list of expert modules)
            block, path = self.block(i), paths.get(kind)
            return kind not in MOE_KINDS or (has_module(block, path) and
                                             not isinstance(get_module(block, path), nn.ModuleList))

        return [Site(k, i).name for i in range(self.n_layers) for k in kinds if here(i, k)] + [
            "ln_final.hook_normalized", "ln_final.hook_out"]

    def __repr__(self) -> str:
        return (f"Model({self.name!r}, family={self.spec.family}, layers={self.n_layers}, d_model={self.d_model}, "
                f"dtype={self.dtype}, device={self.device})")


def execution_device(module: nn.Module) -> torch.device | None:
    """The device accelerate runs ``module`` on (its ``device_map`` hook), or ``None`` for a module without one."""
    hook = getattr(module, "_hf_hook", None)
    for h in getattr(hook, "hooks", None) or [hook]:
        dev = getattr(h, "execution_device", None)
        if dev is not None:
            return torch.device("cuda", dev) if isinstance(dev, int) else torch.device(dev)
    return None


def offloaded(model: Model) -> list[str]:
    """Names of the parameters accelerate offloaded (to the CPU or disk): they sit on the ``meta`` device outside
    the forward pass and are loaded module by module as it runs."""
    return [n for n, p in model.hf.named_parameters() if p.device.type == "meta"]


@contextmanager
def onloaded(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` with its offloaded weights loaded onto its execution device for the block (read-only use: an
    edit made here is dropped when they are offloaded again); a module without offloaded weights passes through."""
    from accelerate.utils import align_module_device, has_offloaded_params

    with ExitStack() as stack:
        for m in module.modules():
            if has_offloaded_params(m):
                stack.enter_context(align_module_device(m))
        yield module


def materialize(model: Model, device: str | torch.device = "cpu") -> Model:
    """A plain copy of a model split by ``device_map`` (offloaded weights read back from the CPU or disk): one
    device, no accelerate hooks, every weight in memory, so it can be edited, baked or saved. Needs the
    whole model to fit on ``device``."""
    from accelerate.utils.modeling import get_state_dict_offloaded_model

    hf = model.hf
    state = get_state_dict_offloaded_model(hf) if offloaded(model) else hf.state_dict()
    plain = type(hf)(copy.deepcopy(hf.config)).to(model.dtype)
    plain.load_state_dict({k: v.to("cpu") for k, v in state.items()}, strict=True)
    plain.generation_config = copy.deepcopy(hf.generation_config)
    return Model(hf=plain.to(device).eval(), tokenizer=model.tokenizer, spec=model.spec, name=model.name)


def from_hf(hf_model: nn.Module, tokenizer: Any = None, name: str | None = None) -> Model:
    """Wrap an in-memory HF causal LM (e.g. a tiny model built from a config)."""
    name = name or getattr(hf_model.config, "_name_or_path", "") or type(hf_model).__name__
    return Model(hf=hf_model.eval(), tokenizer=tokenizer, spec=spec_for(hf_model), name=name)


def _dtype(dtype: str | torch.dtype | None) -> torch.dtype | str:
    if dtype is None or isinstance(dtype, torch.dtype) or dtype == "auto":
        return torch.float32 if dtype is None else dtype
    table = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
             "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float64": torch.float64}
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(table)} or 'auto'")
    return table[dtype]


def resolve_name(name_or_path: str) -> tuple[str, dict[str, Any]]:
    """Map a user's model name to (path or hub id, extra from_pretrained kwargs)."""
    if name_or_path in EMBEDDED:
        folder = EMBEDDED_DIR / EMBEDDED[name_or_path]
        if not (folder / "config.json").exists():
            raise FileNotFoundError(f"embedded model {name_or_path!r} is missing at {folder}; regenerate it with "
                                    f"`python -m interp.organisms.train --out {EMBEDDED_DIR}`")
        return str(folder), {}
    if name_or_path.lower() in PYPI_GGUF:
        return str(pypi_gguf(name_or_path)), {}
    if not Path(name_or_path).exists():
        _check_hub_id(name_or_path)
    return name_or_path, {}


def accepted_forms() -> str:
    """What ``load_model`` accepts, for error messages."""
    names = ", ".join(sorted({*EMBEDDED, *PYPI_GGUF, *ADAPTERS, *UPCYCLED}))
    return (f"built-in names ({names}), an HF model folder, a .gguf file, or a Hugging Face hub id "
            f"(owner/name) that is cached locally or reachable online")


def _hub_offline() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    from huggingface_hub import constants  # transformers depends on huggingface_hub

    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def _check_hub_id(name: str) -> None:
    """Fail at once, listing what is accepted, for a name that cannot load: a near miss of a built-in name,
    a path-like name that does not exist, or a hub id that is not cached while the Hub is offline."""
    import difflib

    builtins = sorted({*EMBEDDED, *PYPI_GGUF, *ADAPTERS, *UPCYCLED})
    close = difflib.get_close_matches(name.lower(), builtins, n=1, cutoff=0.75)
    if close and "/" not in name:
        raise ValueError(f"unknown model {name!r}; did you mean {close[0]!r}? load_model accepts {accepted_forms()}")
    if name.startswith((".", "~")) or name.endswith((".gguf", "/")) or os.sep + os.sep in name:
        raise FileNotFoundError(f"model path {name!r} does not exist; load_model accepts {accepted_forms()}")
    try:
        from huggingface_hub import try_to_load_from_cache
        cached = isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # an id the Hub would reject (bad characters): let the check below say so
        cached = False
    if not cached and _hub_offline():
        raise FileNotFoundError(f"model {name!r} is not a built-in name, a local folder or a cached hub id, and the "
                                f"Hugging Face Hub is offline (HF_HUB_OFFLINE); load_model accepts {accepted_forms()}")


def load_model(name_or_path: str = DEFAULT_MODEL, dtype: str | torch.dtype | None = None,
               device: str | torch.device | None = None, device_map: Any = None,
               trust_remote_code: bool = False, **kwargs: Any) -> Model:
    """Load an HF causal LM with its tokenizer and spec.

    ``name_or_path``: an embedded name (``organism``, ``organism-base``), ``smollm2-135m-instruct`` (alias
    ``smollm2-base``), ``smollm2-aligned`` (the base plus its committed LoRA adapter, merged into the weights
    unless ``merge=False``, which keeps the peft-wrapped model), ``gemma3-270m`` (the pretrained Gemma 3 270M),
    ``qwen2.5-coder-1.5b-instruct`` (Qwen2.5-Coder-1.5B-Instruct Q4_K_M from 22 PyPI part packages, ``interp.pypi_gguf``),
    ``gemma3-aligned`` (it plus its English-only safety LoRA and the chat template that LoRA was trained in),
    ``smollm2-moe-aligned`` (SmolLM2 upcycled to qwen2_moe, ``interp.upcycle``, a benign and a safety LoRA trained
    on the MoE model merged: refuses 91% of held-out harmful requests, benchmarks/RESULTS_organism_moe.md), an HF
    folder, a ``.gguf`` file (dequantised once, cached) or a hub id (needs network unless cached). ``dtype``
    defaults to float32; ``device_map`` (``"auto"`` or ``{module: device}``, devices including ``"cpu"`` and
    ``"disk"``, with ``offload_folder=``) splits the model across devices through accelerate: capture, steering
    and patching run on it unchanged; weight edits need :func:`materialize` first where weights are offloaded.
    """
    from transformers import AutoModelForCausalLM

    if name_or_path in UPCYCLED:  # (dense base, folder): upcycled from a seed, then its adapters (interp.upcycle)
        from interp.upcycle import load_upcycled
        base = load_model(UPCYCLED[name_or_path][0], dtype=dtype, device=device, **kwargs)
        return load_upcycled(EMBEDDED_DIR / UPCYCLED[name_or_path][1], base, with_adapter, name_or_path)
    if name_or_path in ADAPTERS:
        merge = bool(kwargs.pop("merge", True))
        base = load_model(ADAPTERS[name_or_path][0], dtype=dtype, device=device, device_map=device_map, **kwargs)
        return with_adapter(base, EMBEDDED_DIR / ADAPTERS[name_or_path][1], merge=merge, name=name_or_path)
    path, extra = resolve_name(name_or_path)
    if path.endswith(".gguf"):
        path = str(_gguf_folder(Path(path)))
    load_kw: dict[str, Any] = dict(dtype=_dtype(dtype), trust_remote_code=trust_remote_code, **extra, **kwargs)
    if device_map is not None:
        load_kw["device_map"] = device_map
    if Path(path).exists() and not (Path(path) / "config.json").exists():
        raise FileNotFoundError(f"{path} is not an HF model folder (no config.json)")
    try:
        hf = AutoModelForCausalLM.from_pretrained(path, **load_kw)
    except OSError as e:
        if Path(path).exists():
            raise
        raise OSError(f"could not load {name_or_path!r} from the Hugging Face Hub ({e}); load_model accepts "
                      f"{accepted_forms()}") from e
    if device is not None and device_map is None:
        hf = hf.to(device)
    tok = load_tokenizer(path, trust_remote_code=trust_remote_code)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    return Model(hf=hf.eval(), tokenizer=tok, spec=spec_for(hf), name=name_or_path)


def with_adapter(base: Model, folder: str | Path, merge: bool = True, name: str | None = None) -> Model:
    """``base`` with the peft (LoRA) adapter saved in ``folder``: merged into the weights (a plain HF model,
    so hooks see nothing new) or kept as a ``PeftModel`` whose spec paths are prefixed to reach the same blocks."""
    folder = Path(folder)
    if not (folder / "adapter_config.json").exists():
        script = "train_gemma3" if "gemma3" in folder.name else "train_smollm2"
        raise FileNotFoundError(f"no peft adapter at {folder}; train it with "
                                f"`python -m organism.{script} --out {folder}`")
    try:
        from peft import PeftModel
    except ImportError as e:
        raise ImportError("loading a LoRA adapter needs peft: `pip install --no-deps peft`") from e
    template = folder / "chat_template.jinja"
    if template.exists():  # the adapter's own turn format (a fine-tune that taught a pretrained model to answer)
        base = with_chat_template(base, template.read_text(encoding="utf-8"))
    wrapped = PeftModel.from_pretrained(base.hf, str(folder))
    name = name or f"{base.name}+{folder.name}"
    if merge:
        hf = wrapped.merge_and_unload()
        return Model(hf=hf.eval(), tokenizer=base.tokenizer, spec=spec_for(hf), name=name)
    return peft_wrapped(base, wrapped.eval(), name)


def with_chat_template(model: Model, template: str) -> Model:
    """``model`` (the same weights) with a copy of its tokenizer that formats chats with ``template``."""
    tok = copy.deepcopy(model.tokenizer)
    tok.chat_template = template
    return Model(hf=model.hf, tokenizer=tok, spec=model.spec, name=model.name)


def peft_wrapped(base: Model, wrapped: nn.Module, name: str) -> Model:
    """A ``PeftModel`` built on ``base.hf`` as a :class:`Model`: the spec paths are prefixed to reach the same
    blocks, so sites and hooks find the (adapted) modules inside the wrapper."""
    from dataclasses import replace

    pre = "base_model.model."
    top = {k: pre + getattr(base.spec, k) for k in ("layers", "embed", "final_norm", "unembed", "pos_embed")
           if getattr(base.spec, k)}
    return Model(hf=wrapped, tokenizer=base.tokenizer, spec=replace(base.spec, **top), name=name)


def load_tokenizer(path: str, trust_remote_code: bool = False) -> Any:
    """The tokenizer saved in ``path``, exactly as saved.

    A folder whose ``tokenizer_config.json`` names the generic fast tokenizer is loaded as such:
    ``AutoTokenizer`` would otherwise pick the model family's class and rebuild the vocabulary as BPE.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cfg = Path(path) / "tokenizer_config.json"
    if cfg.exists() and (Path(path) / "tokenizer.json").exists():
        import json

        if json.loads(cfg.read_text()).get("tokenizer_class") in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)


def _gguf_folder(gguf: Path) -> Path:
    """Dequantise a GGUF file into a cached HF folder (once; later loads read the folder).

    The folder is named by the file's content (sha256), not its path: the same model installed in several
    environments or copied elsewhere is dequantised once, and another file never reuses a folder."""
    if not gguf.exists():
        raise FileNotFoundError(f"GGUF file {gguf} does not exist")
    key = file_sha256(gguf)[:16]
    out = cache_dir() / "gguf" / f"{gguf.stem}-{key}"
    if (out / "config.json").exists() and (out / ".complete").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    q = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    cfg = q.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    plain = type(q)(cfg)
    plain.load_state_dict(q.state_dict())
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / ".complete").write_text("ok\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():  # a concurrent writer finished first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        return out
    os.replace(tmp, out)
    return out
