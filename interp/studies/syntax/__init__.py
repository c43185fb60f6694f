"""Syntactic refusal by causal mediation: the same harmful request as an imperative, in the past tense, as a
statement and as a question about others (our set, ``data``); refusal of each form, activation patching between
the imperative and each form by layer x position, heads and neurons at the found layers against random ones, the
refusal direction's projection by form, and steering the least-refused form back (``study``, ``mediation``).

Recipe::

    import interp
    from interp.studies.syntax import SyntaxConfig, syntactic_refusal
    model = interp.load_model("smollm2-aligned")
    res = syntactic_refusal(model, config=SyntaxConfig(n_pairs=45), runtime=interp.Runtime(batch_size=32))
    res.summary()["rates"]            # refusal by form, Wilson 95%
    res.plot()                        # imperative -> least-refused form, layer x position
    res.summary()["components"]       # found heads / neurons vs random ones (restored share)
    res.steering                      # the form steered with the found difference vs random of the same norms
    res.save("syntax_run")
"""

from interp.studies.syntax.data import FORMS, SyntaxForms, load_syntax_forms
from interp.studies.syntax.study import SyntaxConfig, SyntaxRefusal, syntactic_refusal

__all__ = ["FORMS", "SyntaxConfig", "SyntaxForms", "SyntaxRefusal", "load_syntax_forms", "syntactic_refusal"]
