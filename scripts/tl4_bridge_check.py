"""Run in .tl4-venv (TransformerLens 4): SmolLM2 through TL4's TransformerBridge, wrapped by
interp.from_transformer_lens, against interp.load_model of the same weights; prints one JSON line.

    .tl4-venv/bin/python scripts/tl4_bridge_check.py

tests/test_adapters_bridge.py runs it (build the environment with `bash scripts/tl4_venv.sh`).
"""

from __future__ import annotations

import json
from importlib.metadata import version

import interp
from interp.testing.oracles import capture_gaps

PROMPTS = ["the man said to the boy", "help", "where is the old house by the water now ?"]


def main() -> None:
    import transformer_lens
    from transformer_lens.model_bridge import TransformerBridge

    try:
        transformer_lens.HookedTransformer  # noqa: B018 - TL4 removed it
        has_hooked = True
    except (ImportError, AttributeError):
        has_hooked = False
    sdpa = interp.load_model("smollm2-135m-instruct")
    eager = interp.load_model("smollm2-135m-instruct", attn_implementation="eager")
    # the local HF folder load_model read (the GGUF dequantised once into the cache)
    bridge = TransformerBridge.boot_transformers(sdpa.hf.config._name_or_path, device="cpu")
    model = interp.from_transformer_lens(bridge)
    print(json.dumps({"transformer_lens": version("transformer-lens"), "torch": version("torch"),
                      "transformers": version("transformers"), "has_hooked_transformer": has_hooked,
                      "bridge_class": f"{type(bridge).__module__}.{type(bridge).__name__}",
                      "vs_eager": capture_gaps(model, eager, PROMPTS), "vs_sdpa": capture_gaps(model, sdpa, PROMPTS)}))


if __name__ == "__main__":
    main()
