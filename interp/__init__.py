"""interp-toolkit core: load models, name sites, hook, capture and store activations.

The core needs only torch at import time (transformers loads on first use); the optional integrations
(TransformerLens, nnsight, plotting, patching) load lazily, so one broken dependency cannot break
``import interp``. ``capture`` and ``hooks`` are bound eagerly because their modules share their names; ``logits`` and
``token_logprobs`` live in ``interp.readout``.
"""

from __future__ import annotations

from interp.activations import Activations
from interp.adapters import from_nnsight, from_transformer_lens
from interp.capturing import capture
from interp.chat import format_prompts
from interp.hooking import hooks
from interp.models import Model, from_hf, load_model
from interp.positions import Positions
from interp.readout import logits, token_logprobs
from interp.store import ActivationStore
from interp.values import Prompts, Runtime

__version__ = "0.1.0"

__all__ = ["Activations", "ActivationStore", "capture", "format_prompts", "from_hf", "from_nnsight",
           "from_transformer_lens", "hooks", "load_model", "logits", "Model", "Positions", "Prompts", "Runtime",
           "token_logprobs"]
