"""TransformerLens and sae-lens are extras: without them the four packages import, a capture runs, and
what needs one raises an ImportError naming the pip extra (checked in a subprocess that cannot import them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r'''
import importlib.abc, json, sys

class Block(importlib.abc.MetaPathFinder):
    """Make transformer_lens and sae_lens unimportable, as on an install without the extras."""
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("transformer_lens", "sae_lens"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None

sys.meta_path.insert(0, Block())
import interp, probes, sae, steering
from interp.testing.tiny import tiny_model
from interp.values import Runtime

out = {}
m = tiny_model("llama")
acts = interp.capture(m, ["hello there", "the old house"], sites="resid_post", runtime=Runtime(progress=False))
out["capture_shape"] = list(acts.tensor.shape)

def error_of(fn):
    try:
        fn()
    except ImportError as e:
        return f"ImportError: {e}"
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"

from interp.testing.oracles import transformer_lens_model
out["from_transformer_lens"] = error_of(lambda: interp.from_transformer_lens(object()))
out["transformer_lens_model"] = error_of(lambda: transformer_lens_model(m))
out["sae.from_pretrained"] = error_of(lambda: sae.from_pretrained("gpt2-small-res-jb", "blocks.0.hook_resid_pre"))
out["leaked"] = sorted(k for k in sys.modules if k.split(".")[0] in ("transformer_lens", "sae_lens"))
print("RESULT" + json.dumps(out))
'''


def _run() -> dict:
    res = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):])


def test_without_transformer_lens_and_sae_lens():
    out = _run()
    assert out["capture_shape"][0] == 2 and out["leaked"] == []
    for key in ("from_transformer_lens", "transformer_lens_model"):
        assert out[key].startswith("ImportError") and "interp-toolkit[transformer-lens]" in out[key], out[key]
    key = "sae.from_pretrained"
    assert out[key].startswith("ImportError") and "interp-toolkit[sae-lens]" in out[key], out[key]
