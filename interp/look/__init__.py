"""Looking inside a model: the first hour of an exploratory session.

Logit lens and tuned lens (what each layer would predict), direct logit attribution (which embedding, head, MLP or
neuron writes a logit), and head characterisation (induction, previous-token, duplicate-token scores, entropy,
attention to BOS). Reads the core's sites; fits nothing but the tuned lens's translators. A floor of its own beside
``probes`` / ``sae`` / ``interp.tune`` (the core and ground floors below it), so ``interp.patching`` and ``steering``
can use it.
"""

from __future__ import annotations

from interp.look.lens import logit_lens
from interp.look.lens_result import LogitLens
from interp.look.tuned_lens import TunedLens, train_tuned_lens

__all__: list[str] = ["LogitLens", "TunedLens", "logit_lens", "train_tuned_lens"]
