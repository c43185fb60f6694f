"""Looking inside a model: the first hour of an exploratory session.

Logit lens and tuned lens (what each layer would predict), direct logit attribution (which embedding, head, MLP or
neuron writes a logit), and head characterisation (induction, previous-token, duplicate-token scores, entropy,
attention to BOS). Reads the core's sites; fits nothing but the tuned lens's translators. A floor of its own beside
``probes`` / ``sae`` / ``interp.tune`` (the core and ground floors below it), so ``interp.patching`` and ``steering``
can use it.
"""

from __future__ import annotations

from interp.look.dla import direct_logit_attribution
from interp.look.heads import head_scores, pattern_figure
from interp.look.lens import logit_lens
from interp.look.tuned_lens import TunedLens, train_tuned_lens

# the results (DLA, HeadScores, LogitLens) are what these return; import them from their modules to annotate
__all__: list[str] = ["TunedLens", "direct_logit_attribution", "head_scores", "logit_lens", "pattern_figure",
                      "train_tuned_lens"]
