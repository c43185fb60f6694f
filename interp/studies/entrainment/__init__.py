"""Contextual entrainment ("Llama See, Llama Do", Niu et al. 2025): a token seen earlier in the prompt, even a
random or irrelevant one, gains logit at the answer position; heads found by learned masks carry it.

``data`` (our prompt set: questions with one-token answers, four distracting context kinds), ``effect`` (logit and
probability gain present vs absent, with bootstrap intervals), ``heads`` (mask sweep, ablation vs layer-matched
random heads, attention to the context token), ``study`` (all stages in one call).

Recipe::

    import interp
    from interp.studies.entrainment import EntrainmentConfig, entrainment_study, load_entrainment
    model = interp.load_model("smollm2-135m-instruct")            # or "gemma3-270m" (plain prompts either way)
    st = entrainment_study(model, load_entrainment(), EntrainmentConfig(sparsities=(0.003, 0.01, 0.03)))
    st.summary()["effect"]["gains"]              # logit / prob gain per context kind, 95% CI, p
    st.effect.counterfactual_vs_factual()        # does counterfactual context entrain more?
    st.ablation.summary()                        # found heads vs layer-matched random heads (interval, p)
    st.plot("effect"); st.plot("attention"); st.pattern_figure(model)
"""

from interp.studies.entrainment.config import SPARSITY_RANGE, EntrainmentConfig
from interp.studies.entrainment.data import (
    KINDS,
    ContextPairs,
    EntrainmentSet,
    from_rows,
    load_entrainment,
    make_pairs,
)
from interp.studies.entrainment.effect import EntrainmentEffect, KindScores, entrainment_effect
from interp.studies.entrainment.heads import (
    ContextAttention,
    HeadAblationCheck,
    HeadSweep,
    ablation_check,
    context_attention,
    find_heads,
)
from interp.studies.entrainment.study import EntrainmentStudy, entrainment_study

__all__ = ["KINDS", "SPARSITY_RANGE", "ContextAttention", "EntrainmentConfig", "EntrainmentEffect", "EntrainmentSet",
           "EntrainmentStudy", "HeadAblationCheck", "HeadSweep", "KindScores", "ContextPairs", "ablation_check",
           "context_attention", "entrainment_effect", "entrainment_study", "find_heads", "from_rows",
           "load_entrainment", "make_pairs"]
