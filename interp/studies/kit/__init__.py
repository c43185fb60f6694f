"""The study kit: what several studies share, so that no study imports another.

``prompt_sets`` (the refusal prompt sets, split and sized), ``config`` (the refusal configuration sections and the
stage-cache key), ``scoring`` and ``stages`` (the refusal direction: refusal tokens, difference-of-means candidates,
their exact scores and the paper's selection; ``direction``: the selected direction alone, for a study that needs
only it), ``writer_sites`` (the residual writers grouped by kind), ``runs`` (fresh fine-tunes from one model in
memory, greedy base answers, refusal rates by generation). A study imports these and the floors below; the architecture test refuses an import of one study by another.
"""
