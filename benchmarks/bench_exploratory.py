"""Exploratory-session benchmark: attention patterns + residual stream at every layer, 16 prompts of mixed length.

Interleaved in one process on the same prompts: ours (``interp.capturing.capture_groups``: ``pattern`` and
``resid_post`` in one forward pass per batch, each kept at its own width), TransformerLens ``run_with_cache`` (a HookedTransformer with the same weights),
TransformerLens 3.9's ``TransformerBridge`` (booted offline on a copy of the same HF model, SmolLM2 only) and
nnsight (module outputs in a trace; the patterns as the eager attention's returned weights). ``positions="all"``
keeps the full ``query x key`` tables, ``"last"`` the last query row. Prints medians, time and peak-RSS ratios
(ours / theirs; targets: <= 0.8x TransformerLens's time, <= 0.5x its memory) and the largest difference from
TransformerLens, and writes benchmarks/RESULTS_exploratory.md.

Two more rows: the logit lens (``interp.look.logit_lens`` vs ``cache.accumulated_resid(apply_ln=True)`` (the final
norm recomputed per residual) and the unembedding, then log-softmax and top-5) and the direct logit attribution per head
(``interp.look.direct_logit_attribution`` vs ``cache.stack_head_results(apply_ln=True)`` read along the target's
unembedding difference), with their largest difference from TransformerLens: see :func:`look_rows`.

    nice -n 10 python benchmarks/bench_exploratory.py --models tiny,smollm2 --rounds 3
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # _common, then the repo
from _common import interleaved, machine, table, write_text  # noqa: E402

import interp  # noqa: E402
from interp.capturing import capture_groups  # noqa: E402
from interp.forward import batches, prepare  # noqa: E402
from interp.look import direct_logit_attribution, logit_lens  # noqa: E402
from interp.testing.oracles import nnsight_model, transformer_lens_model  # noqa: E402
from interp.testing.tiny import tiny_model  # noqa: E402

GROUPS = {"pattern": "pattern", "resid": "resid_post"}
OURS = "interp.capturing.capture_groups (pattern, resid_post)"
SENTENCES = ["Tell me about bread.", "The moon rose over the quiet harbour while the boats came in.",
             "What should I know before a job interview?", "Rain again.", "Chess openings reward patience and memory.",
             "Write three sentences on the water cycle for a child.", "Sorting algorithms trade memory for speed.",
             "A leaking tap wastes more water than most people think, and fixing one takes ten minutes."]


def prompts(n: int = 16) -> list[str]:
    """``n`` prompts of mixed length (one to four sentences)."""
    return [" ".join(SENTENCES[(i + j) % len(SENTENCES)] for j in range(1 + i % 4)) for i in range(n)]


def _model(name: str) -> tuple[interp.Model, str]:
    if name == "tiny":
        return tiny_model("llama", d_model=128, n_layers=4, max_position_embeddings=512), "tiny llama (4 x 128)"
    return interp.load_model("smollm2-135m-instruct"), "SmolLM2-135M-Instruct"


def _bridge(model: interp.Model) -> tuple[Any, str]:
    """TransformerLens's ``TransformerBridge`` on a copy of the HF model, booted from a local folder holding only
    the config and tokenizer (``hf_model=`` gives the weights: nothing is downloaded); ``(None, why)`` if not."""
    try:
        from transformer_lens.model_bridge import TransformerBridge

        folder = tempfile.mkdtemp()
        model.hf.config.save_pretrained(folder)
        model.tokenizer.save_pretrained(folder)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return TransformerBridge.boot_transformers(folder, hf_model=copy.deepcopy(model.hf),
                                                       tokenizer=model.tokenizer, dtype=model.dtype, device="cpu"), ""
    except Exception as e:  # reported as a row: the bridge is optional
        return None, f"{type(e).__name__}: {str(e)[:80]}"


def _cached(run: Callable[..., Any], b: Any, L: int, last: bool) -> tuple[list, list]:
    """``run_with_cache`` of TransformerLens or its bridge on one batch: (patterns, residuals) per layer."""
    want = {f"blocks.{i}.{s}" for i in range(L) for s in ("attn.hook_pattern", "hook_resid_post")}
    _, cache = run(b.input_ids, attention_mask=b.attention_mask, names_filter=lambda n: n in want)
    pats = [cache[f"blocks.{i}.attn.hook_pattern"] for i in range(L)]
    res = [cache[f"blocks.{i}.hook_resid_post"] for i in range(L)]
    if last:
        pats, res = [p[:, :, -1].clone() for p in pats], [r[:, -1].clone() for r in res]
    return pats, res


def methods(model: interp.Model, texts: list[str], last: bool, tl: Any, bridge: Any) -> dict[str, Callable[[], Any]]:
    """The timed functions, each capturing patterns and residuals at every layer of all ``texts``."""
    L, rule = model.n_layers, "last" if last else "all"
    _, encs = prepare(model, texts, chat=False)
    bs = batches(model, encs, len(texts))
    run = interp.Runtime(batch_size=len(texts), progress=False)
    given = interp.Prompts(texts, chat=False)
    nns = nnsight_model(model)
    blocks = nns
    for part in model.spec.layers.split("."):
        blocks = getattr(blocks, part)

    def ours():
        return capture_groups(model, given, GROUPS, positions=rule, runtime=run)

    def tl_run():
        with torch.inference_mode():
            return [_cached(tl.run_with_cache, b, L, last) for b in bs]

    def bridge_run():
        with torch.inference_mode():
            return [_cached(bridge.run_with_cache, b, L, last) for b in bs]

    def nnsight_run():
        model.hf.set_attn_implementation("eager")  # only eager attention returns its weights
        try:
            out = []
            for b in bs:
                saved: list = []
                with torch.inference_mode(), nns.trace(b.input_ids, attention_mask=b.attention_mask,
                                                       position_ids=b.position_ids, use_cache=False,
                                                       output_attentions=True):
                    for i in range(L):
                        p, r = blocks[i].self_attn.output[1], blocks[i].output
                        saved.append(((p[:, :, -1] if last else p).save(), (r[:, -1] if last else r).save()))
                out.append(saved)
            return out
        finally:
            model.hf.set_attn_implementation("sdpa")

    fns = {OURS: ours, "TransformerLens run_with_cache": tl_run,
           "nnsight trace (eager attention weights)": nnsight_run}
    if bridge is not None:
        fns["TransformerLens TransformerBridge run_with_cache"] = bridge_run
    return fns


def max_diff(model: interp.Model, texts: list[str], tl: Any) -> tuple[float, float]:
    """Largest |ours - TransformerLens| over the last query rows of every pattern and the last residuals."""
    run = interp.Runtime(batch_size=len(texts), progress=False)
    given = interp.Prompts(texts, chat=False)
    got = capture_groups(model, given, GROUPS, positions="last", runtime=run)
    pat, res = got["pattern"], got["resid"]
    _, encs = prepare(model, texts, chat=False)
    b = batches(model, encs, len(texts))[0]
    with torch.inference_mode():
        pats, resids = _cached(tl.run_with_cache, b, model.n_layers, True)
    T = b.input_ids.shape[1]
    dp = 0.0
    for i, name in enumerate(pat.sites):
        ours = pat.site_view(name)  # [n, H, K], keys left-aligned
        for r, n in enumerate(pat.meta["key_lengths"]):
            dp = max(dp, (ours[r, :, :n] - pats[i][r, :, T - n:].float()).abs().max().item())
    dr = max((res.site(name) - resids[i].float()).abs().max().item() for i, name in enumerate(res.sites))
    return dp, dr


def look_rows(model: interp.Model, label: str, texts: list[str], tl: Any, rounds: int
              ) -> tuple[list[dict], tuple[float, float]]:
    """The "logit lens" and "direct logit attribution" rows (last position, every layer / head), and the
    largest differences from TransformerLens: the lens's log-probs, the heads' shares."""
    given, run = interp.Prompts(texts, chat=False), interp.Runtime(batch_size=len(texts), progress=False)
    a, b = (model.tokenizer.encode(t, add_special_tokens=False)[0] for t in (" the", " a"))
    lens = {"interp.look.logit_lens": lambda: logit_lens(model, given, "resid_post", "last", runtime=run),
            "TransformerLens (logit lens)": lambda: _tl_lens(tl, model, texts)}
    dla = {"interp.look.direct_logit_attribution": lambda: direct_logit_attribution(model, given, (a, b),
                                                                                    by="head", runtime=run),
           "TransformerLens (direct logit attribution)": lambda: _tl_dla(tl, model, texts, a, b)}
    rows = []
    for fns in (lens, dla):
        ours, theirs = list(fns)
        rows += _ratio_rows(label, "last", interleaved(fns, rounds=rounds), ours, theirs)
    lp = logit_lens(model, given, "resid_post", "last", keep_logprobs=True, runtime=run).logprobs
    lp = lp.reshape(len(texts), model.n_layers + 1, -1)[:, :-1].float()   # [n, L, V]; the last row: the output
    d_lens = (lp - _tl_lens(tl, model, texts)[0].transpose(0, 1).float()).abs().max().item()
    r = direct_logit_attribution(model, given, (a, b), by="head", runtime=run)
    heads = [r.labels.index(f"L{la}H{h}") for la in range(model.n_layers) for h in range(model.n_heads)]
    d_dla = (r.parts[:, 0, heads] - _tl_dla(tl, model, texts, a, b).T).abs().max().item()
    return rows, (d_lens, d_dla)


def _tl_lens(tl: Any, model: interp.Model, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs ``[L+1, n, V]`` of every layer's residual (after the last layer, the model's output) through the
    final norm (recomputed per residual, gain included, by ``accumulated_resid(apply_ln=True)``) and the top 5."""
    _, encs = prepare(model, texts, chat=False)
    out = []
    with torch.inference_mode():
        for b in batches(model, encs, len(texts)):
            _, cache = tl.run_with_cache(b.input_ids, attention_mask=b.attention_mask)
            resid = cache.accumulated_resid(apply_ln=True, pos_slice=-1)[1:]            # [L, n, (1,) d]
            resid = resid.reshape(*resid.shape[:2], resid.shape[-1])
            out.append(tl.unembed(resid).log_softmax(-1))
    lp = torch.cat(out, 1)
    return lp, lp.topk(5, dim=-1).indices


def _tl_dla(tl: Any, model: interp.Model, texts: list[str], a: int, b: int) -> torch.Tensor:
    """Each head's share ``[L*H, n]`` of ``logit(a) - logit(b)`` at the last position."""
    _, encs = prepare(model, texts, chat=False)
    direction = tl.ln_final.w * (tl.W_U[:, a] - tl.W_U[:, b])
    out = []
    with torch.inference_mode():
        for bt in batches(model, encs, len(texts)):
            _, cache = tl.run_with_cache(bt.input_ids, attention_mask=bt.attention_mask)
            heads = cache.stack_head_results(layer=None, pos_slice=-1, apply_ln=True)     # [L*H, n, (1,) d]
            out.append(heads.reshape(*heads.shape[:2], heads.shape[-1]) @ direction)
    return torch.cat(out, 1).float()


def _ratio_rows(label: str, where: str, res: dict, ours: str, tl: str) -> list[dict]:
    t, m = res[ours]["median_s"], res[ours]["peak_mb"]
    return [{"model": label, "positions": where, "method": k, "median s": v["median_s"],
             "ours / this (time)": t / v["median_s"],
             "ours / this (memory)": m / v["peak_mb"] if v["peak_mb"] > 0 else "",
             "peak RSS growth MB": v["peak_mb"]} for k, v in res.items()]


def run(name: str, rounds: int) -> tuple[list[dict], list[str]]:
    model, label = _model(name)
    texts = prompts()
    tl = transformer_lens_model(model)
    bridge, why = _bridge(model) if name != "tiny" else (None, "run on SmolLM2 only")
    notes = [f"{label}: TransformerBridge {'booted offline' if bridge is not None else 'not run: ' + why}"]
    dp, dr = max_diff(model, texts, tl)
    notes.append(f"{label}: max |ours - TransformerLens|: last pattern rows {dp:.1e}, last resid_post {dr:.1e}")
    rows = []
    for last in (True, False):
        res = interleaved(methods(model, texts, last, tl, bridge), rounds=rounds)
        rows += _ratio_rows(label, "last" if last else "all", res, OURS, "TransformerLens run_with_cache")
    look, diffs = look_rows(model, label, texts, tl, rounds)
    rows += look
    notes.append(f"{label}: max |ours - TransformerLens|: logit lens log-probs {diffs[0]:.1e}, "
                 f"per-head DLA {diffs[1]:.1e}")
    return rows, notes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_exploratory.md")))
    args = ap.parse_args()
    torch.manual_seed(0)
    rows, notes = [], []
    for name in args.models.split(","):
        r, n = run(name, args.rounds)
        rows, notes = rows + r, notes + n
    cols = ["model", "positions", "method", "median s", "ours / this (time)", "ours / this (memory)",
            "peak RSS growth MB"]
    text = table("Exploratory looks: attention patterns + resid_post at every layer, 16 prompts of mixed length, "
                 "one batch", rows, cols)
    text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    text += (f"\nMachine: {machine()}. Command: `nice -n 10 python benchmarks/bench_exploratory.py --models "
             f"{args.models} --rounds {args.rounds}`. On a shared, loaded machine the timings are indicative "
             f"only.\n")
    print(text)
    write_text(args.out, text)


if __name__ == "__main__":
    main()
