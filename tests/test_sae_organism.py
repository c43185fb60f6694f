"""Base vs aligned organism through one SAE: the latents fine-tuning turned on separate harmful from harmless
prompts in the aligned model, and ablating them (SAE error term kept) lowers its refusal rate."""

from __future__ import annotations

import pytest
import torch

import interp
from interp.values import Runtime

from .conftest import REPO

SITE = "blocks.1.hook_resid_post"  # the input of layer 2, where the organism's refusal direction is read


def _need_organism():
    for name in ("organism", "organism-base"):
        if not (REPO / "interp" / "embedded" / name / "config.json").exists():
            pytest.fail(f"the embedded {name} checkpoint is missing (interp/embedded/{name}); "
                        f"regenerate it with `python -m interp.organisms.train --out interp/embedded --overwrite`")
    from interp.data import available_prompt_sets

    if "organism_harmful_train" not in available_prompt_sets():
        pytest.fail("the organism prompt sets (interp/data/prompts/organism_*.jsonl) are missing; regenerate them "
                    "with `python -m interp.organisms.data --out interp/data/prompts --overwrite`")


@pytest.fixture(scope="module")
def setup():
    _need_organism()
    import interp
    from interp.capturing import capture
    from interp.data import load_prompts
    from sae.trainer import train_sae

    n = torch.get_num_threads()
    torch.set_num_threads(1)  # a 64-wide SAE: one thread is fastest
    try:
        aligned, base = interp.load_model("organism"), interp.load_model("organism-base")
        P = {s: [r["instruction"] for r in load_prompts(f"organism_{s}")]
             for s in ("harmful_train", "harmless_train", "harmful_val", "harmless_val", "harmful_test")}
        kw = dict(sites=[SITE], positions="all", runtime=interp.Runtime(progress=False))
        acts = {(m, s): capture(model, P[s], **kw) for m, model in (("aligned", aligned), ("base", base))
                for s in ("harmful_train", "harmless_train")}
        X = torch.cat([a.flat_tokens(SITE) for a in acts.values()])  # one SAE for both models' activations
        res = train_sae(X, arch="topk", d_sae=256, k=8, total_tokens=200_000, batch_size=256, lr=3e-3,
                        site=SITE, progress=False)
        yield {"aligned": aligned, "base": base, "P": P, "acts": acts, "sae": res.sae, "capture": capture}
    finally:
        torch.set_num_threads(n)


def test_diffed_latents_separate_and_their_ablation_lowers_refusal(setup):
    from interp.evals.judge import refusal_rate
    from interp.evals.metrics import auroc
    from sae.analysis import diff_latents, encode_tokens
    from sae.edits import LatentAblation
    from sae.quality import evaluate
    from steering import generate

    sae, acts, P, aligned = setup["sae"], setup["acts"], setup["P"], setup["aligned"]
    m = evaluate(sae, acts[("aligned", "harmful_train")].flat_tokens(SITE))
    print(f"SAE on aligned harmful tokens: L0 {m.l0:.1f}, FVU {m.fvu:.3f}")
    assert m.fvu < 0.2
    # model diffing: same prompts, same SAE, base vs aligned activations (every real token)
    d = diff_latents(sae, acts[("base", "harmful_train")].flat_tokens(SITE),
                     acts[("aligned", "harmful_train")].flat_tokens(SITE), top=10)
    top = d.ranking.indices.tolist()
    print("top diffed latents (aligned - base):", [(i, round(s, 3)) for i, s in d.ranking])
    # they separate held-out harmful from harmless prompts in the aligned model (per-prompt mean over tokens)
    val = {k: setup["capture"](aligned, P[k], sites=[SITE], positions="all", runtime=Runtime(progress=False))
           for k in ("harmful_val", "harmless_val")}

    def per_prompt(a):  # [n_prompts, len(top)]: each latent's mean over the prompt's real tokens
        z = encode_tokens(sae, a.tensor[:, 0].reshape(-1, sae.d_in)).reshape(a.n_prompts, -1, sae.d_sae)[..., top]
        mask = a.mask.float()[..., None]
        return (z * mask).sum(1) / mask.sum(1)

    h, s = per_prompt(val["harmful_val"]), per_prompt(val["harmless_val"])
    def a_vs_b(a, b):  # AUROC per column of a (positive) against b, with evals' scores [..., n] and labels y
        return auroc(torch.cat([a, b]).T, torch.cat([torch.ones(len(a)), torch.zeros(len(b))]).long())

    au_each = a_vs_b(h, s)
    au_sum = float(a_vs_b(h.sum(1, keepdim=True), s.sum(1, keepdim=True))[0])
    last = [encode_tokens(sae, val[k].tensor[:, 0, -1])[:, top[:1]] for k in ("harmful_val", "harmless_val")]
    au_first = float(a_vs_b(*last)[0])
    print(f"AUROC harmful vs harmless (aligned model, val prompts): top latent at the last token {au_first:.3f}; "
          f"sum of the top-10 per prompt {au_sum:.3f}; each (prompt mean) {[round(float(v), 2) for v in au_each]}")
    assert au_first > 0.95 and au_sum > 0.8
    # ablating them, error term kept, lowers the aligned model's refusal rate on held-out harmful prompts
    kw = dict(max_new_tokens=12, runtime=interp.Runtime(batch_size=32, progress=False))
    base_rate = refusal_rate(generate(aligned, P["harmful_test"], **kw).texts)
    abl_rate = refusal_rate(generate(aligned, P["harmful_test"], LatentAblation(sae, top), **kw).texts)
    rand = torch.randperm(sae.d_sae, generator=torch.Generator().manual_seed(0))[:10].tolist()
    rand_rate = refusal_rate(generate(aligned, P["harmful_test"], LatentAblation(sae, rand), **kw).texts)
    print(f"refusal rate on harmful test prompts: {base_rate:.3f} -> {abl_rate:.3f} with the top-10 diffed latents "
          f"ablated ({rand_rate:.3f} with 10 random latents)")
    assert base_rate > 0.8
    assert abl_rate < base_rate - 0.2 and abl_rate < rand_rate - 0.1
