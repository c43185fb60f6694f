"""Linear probes, directions, erasure and subspaces on captured activations, vectorised over layers.

Every public function takes :class:`~interp.activations.Activations` (labels from ``acts.labels``) or a plain
tensor ``X [n, n_layers, d]`` with labels ``y [n]``. Fitted objects record which samples they were fitted on.
``probes`` never imports ``steering``. Metrics (``auroc``, ``accuracy``, ``cohens_d``) live in ``evals``.

    acts = interp.capture(model, prompts, sites="resid_post", labels=is_harmful)
    scores = probes.cross_validate(acts, groups=template_ids)        # held-out acc / AUROC / d per layer
    scores.summary(); scores.plot()
    scores.layer_choice()                                           # best layer, the tied layers, the tie rule
    refusal = probes.diff_of_means(acts, positive=True)             # Direction: .at(layer), .vectors, .norms
    refusal.save("refusal_dir")
    erased = probes.erasure_cv(acts, eraser="leace")                # does it survive erasure (fitted in folds)?
"""

from probes._choice import LayerChoice
from probes.compare import Signature, compare_directions, cosine_by_layer, cosine_matrix, project, signature
from probes.directions import (
    diff_of_means,
    fit_direction,
    lda,
    pca_centered,
    pca_diff,
    random_directions,
    random_orthogonal,
)
from probes.erasure import INLPEraser, LeaceEraser, fit_inlp, fit_leace
from probes.folds import Fold, make_folds
from probes.graded import GradedDirection, graded_direction
from probes.logistic import LogisticProbe, fit_logistic, l2_from_C, sklearn_C
from probes.objects import Direction, Subspace
from probes.subspace import category_subspace, mean_diff_subspace, pca_subspace
from probes.transfer import (
    AblationScores,
    ErasureScores,
    TransferScores,
    erasure_cv,
    rank_ablation,
    transfer_matrix,
)
from probes.validation import DirectionScores, ProbeScores, cross_validate, evaluate_direction

__all__ = [
    "AblationScores", "Direction", "DirectionScores", "ErasureScores", "Fold", "GradedDirection", "INLPEraser",
    "LayerChoice", "LeaceEraser", "LogisticProbe", "ProbeScores", "Signature", "Subspace", "TransferScores",
    "category_subspace", "compare_directions", "cosine_by_layer", "cosine_matrix", "cross_validate",
    "diff_of_means", "erasure_cv", "evaluate_direction", "fit_direction", "fit_inlp", "fit_leace", "fit_logistic",
    "graded_direction", "l2_from_C", "lda", "make_folds", "mean_diff_subspace", "pca_centered", "pca_diff",
    "pca_subspace", "project", "random_directions", "random_orthogonal", "rank_ablation", "signature", "sklearn_C",
    "transfer_matrix",
]
