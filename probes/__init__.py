"""Linear probes, directions, erasure and subspaces on captured activations, vectorised over layers.

Every public function takes :class:`~interp.activations.Activations` (labels from ``acts.labels``) or a plain
tensor ``X [n, n_layers, d]`` with labels ``y [n]``. Fitted objects record which samples they were fitted on.
``probes`` never imports ``steering``. Metrics (``auroc``, ``accuracy``, ``cohens_d``) live in ``evals``.

    acts = interp.capture(model, interp.Prompts(prompts, labels=is_harmful), sites="resid_post")
    scores = probes.cross_validate(acts, groups=template_ids)        # held-out acc / AUROC / d per layer
    scores.summary(); scores.by_site(); scores.plot()
    scores.layer_choice()                                           # best layer, the tied layers, the tie rule
    refusal = probes.diff_of_means(acts, positive=True)             # Direction: .at(layer), .vectors, .norms
    refusal.save("refusal_dir")
    erased = probes.erasure_cv(acts, eraser="leace")                # does it survive erasure (fitted in folds)?
"""

from probes import compare, folds, subspace  # noqa: F401  (the rest of the API, as probes.<module>.<name>)
from probes.config import CVConfig, LogisticConfig
from probes.directions import diff_of_means, fit_direction, random_directions
from probes.erasure import fit_inlp, fit_leace
from probes.graded import graded_direction
from probes.logistic import fit_logistic
from probes.objects import Direction, Subspace
from probes.transfer import erasure_cv, transfer_matrix
from probes.validation import cross_validate, evaluate_direction

__all__ = ["cross_validate", "CVConfig", "LogisticConfig", "diff_of_means", "Direction", "erasure_cv", "evaluate_direction",
           "fit_direction", "fit_inlp", "fit_leace", "fit_logistic", "graded_direction", "random_directions",
           "Subspace", "transfer_matrix"]
