"""Ground floor: metrics and judges on tensors and text (AUROC, Cohen's d, KL, CE, logit difference,
refusal score, the refusal judge). Pure functions; any floor may call them, and they import no floor above."""

from evals.judge import REFUSAL_PHRASES, is_refusal, refusal_openings, refusal_rate
from evals.logits import cross_entropy, kl_div, logit_diff, refusal_score, token_logprob
from evals.metrics import accuracy, auroc, average_ranks, cohens_d, cohens_d_groups

__all__ = ["REFUSAL_PHRASES", "accuracy", "auroc", "average_ranks", "cohens_d", "cohens_d_groups", "cross_entropy",
           "is_refusal", "kl_div", "logit_diff", "refusal_openings", "refusal_rate", "refusal_score", "token_logprob"]
