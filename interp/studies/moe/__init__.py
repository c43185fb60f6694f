"""Directional ablation on a mixture of experts: the model's own refusal direction ablated from attention, from
dense MLPs + shared experts, and from routed experts, alone and jointly (the share of the effect that exists only
jointly), against random directions orthogonal to it; category subspaces of rank 1..k; the joint edit baked into the
weights (routed experts included) and checked equal to the hooks.

Recipe::

    import interp
    from interp.studies.moe import MoeConfig, moe_refusal
    model = interp.load_model("smollm2-moe-aligned")
    res = moe_refusal(model, config=MoeConfig(), runtime=interp.Runtime(batch_size=16))
    res.summary()["writers"]       # fraction of refusal removed per condition, 95% bootstrap intervals
    res.summary()["joint_only"]    # 1 - sum(alone) / joint, with its interval
    res.plot("writers"); res.plot("ranks")
    res.bake                       # baked weights vs hooks: max relative logit difference
    res.save("moe_run")
"""

from interp.studies.moe.conditions import bake_check, writer_conditions
from interp.studies.moe.config import CATEGORIES, MoeConfig
from interp.studies.moe.result import MoeRefusal
from interp.studies.moe.study import moe_refusal

__all__ = ["CATEGORIES", "MoeConfig", "MoeRefusal", "bake_check", "moe_refusal", "writer_conditions"]
