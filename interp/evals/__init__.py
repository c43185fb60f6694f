"""Ground floor: metrics and judges on tensors and text (AUROC, Cohen's d, KL, CE, logit difference,
refusal score, the refusal judge). Pure functions; any floor may call them, and they import no floor above."""

from interp.evals.judge import is_refusal, load_judge, refusal_rate
from interp.evals.logits import cross_entropy, kl_div, logit_diff, refusal_score, token_logprob
from interp.evals.metrics import accuracy, auroc, cohens_d, spearman

__all__ = ["accuracy", "auroc", "cohens_d", "cross_entropy", "is_refusal", "kl_div", "load_judge",
           "logit_diff", "refusal_rate", "refusal_score", "spearman", "token_logprob"]
