"""Explanations of SAE latents scored by detection and fuzzing, each against a shuffled-explanation control.

smollm2-aligned (the realistic organism, SmolLM2-135M-Instruct + a safety LoRA) is both the model under study and
the explainer / scorer (through ``steering.generate``). A TopK SAE is trained quickly on its residual stream over
persona statements (Anthropic model-written evaluations, plain text, no chat template); ``--latents`` latents are
drawn at random (seeded) among those firing on enough statements, explained from their top contexts and random
non-activating ones, and scored on held-out contexts. Writes ``benchmarks/RESULTS_explain.md``.

    python benchmarks/bench_explain.py                     # ~8 latents, a few minutes of CPU on 2 cores
    python benchmarks/bench_explain.py --latents 4 --statements 600 --out /tmp/explain.md   # a quicker look
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo before this folder

from _common import machine, write_text  # noqa: E402

import interp  # noqa: E402
import steering  # noqa: E402
from interp.capturing import capture  # noqa: E402
from sae.analysis import encode_tokens  # noqa: E402
from sae.explain import ExplainConfig, LocalChatClient, explain_latents, latent_examples  # noqa: E402
from sae.quality import evaluate  # noqa: E402
from sae.trainer import train_sae  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared"


class Timed:
    """A chat client that counts its calls and the seconds spent in them."""

    def __init__(self, inner: Any):
        self.inner, self.name, self.calls, self.seconds = inner, inner.name, 0, 0.0

    def complete(self, messages: Any) -> str:
        return self.complete_many([messages])[0]

    def complete_many(self, conversations: Any) -> list[str]:
        t = time.perf_counter()
        try:
            return self.inner.complete_many(conversations)
        finally:
            self.calls += len(conversations)
            self.seconds += time.perf_counter() - t


def statements(n: int, seed: int) -> list[str]:
    import os

    folder = Path(os.environ.get("INTERP_SHARED", SHARED)) / "data" / "persona"
    rows = [json.loads(line)["statement"] for f in sorted(folder.glob("*.jsonl")) for line in f.open()]
    if not rows:
        raise SystemExit(f"no persona statements under {folder}; set INTERP_SHARED to the shared data folder")
    return random.Random(seed).sample(rows, min(n, len(rows)))


def fit_sae(model: Any, prompts: Any, site: str, args: argparse.Namespace) -> tuple[Any, torch.Tensor, dict]:
    t = time.perf_counter()
    acts = capture(model, prompts, sites=[site], positions="all", runtime=interp.Runtime(batch_size=32, progress=False))
    x = acts.flat_tokens(site)  # real tokens, attention sinks left out
    res = train_sae(x, arch="topk", d_sae=args.d_sae, k=args.k, total_tokens=args.train_tokens, batch_size=256,
                    lr=2e-3, site=site, progress=False, seed=0)
    q = evaluate(res.sae, x)
    freq = (encode_tokens(res.sae, x) > 0).float().mean(0)
    info = {"tokens": x.shape[0], "fvu": round(float(q.fvu), 3), "l0": round(float(q.l0), 1),
            "dead": int((freq == 0).sum()), "seconds": round(time.perf_counter() - t, 1)}
    return res.sae, freq, info


def pick_latents(model: Any, sae: Any, prompts: Any, freq: torch.Tensor, cfg: ExplainConfig, n: int, seed: int
                 ) -> tuple[list[int], str]:
    """``n`` latents drawn at random among those firing on 0.2%..5% of tokens that have enough contexts."""
    band = ((freq >= 0.002) & (freq <= 0.05)).nonzero()[:, 0].tolist()
    pool = random.Random(seed).sample(band, min(len(band), 6 * n))
    ex = latent_examples(model, sae, pool, prompts, cfg)
    ok = [lt for lt in pool if len(ex[lt].test) == cfg.n_test and len(ex[lt].test_random) == cfg.n_test_random][:n]
    rule = (f"drawn at random (seed {seed}) among the {len(band)} latents firing on 0.2%-5% of tokens, keeping "
            f"those with {cfg.n_explain} + {cfg.n_test} activating statements")
    return ok, rule


def _pooled_rows(res: Any) -> list[str]:
    s = res.summary()
    rows = ["| scorer | explanations | accuracy [95% Wilson] | balanced accuracy [95% bootstrap] | F1 [95% bootstrap] "
            "| answered |", "| --- | --- | --- | --- | --- | --- |"]
    for kind in ("detection", "fuzzing"):
        for cond, label in (("explanation", "own"), ("shuffled", "shuffled (control)")):
            m = s[f"{kind}/{cond}"]
            a = m["accuracy"]
            bl, bh = m["balanced_accuracy_ci95"]
            fl, fh = m["f1_ci95"]
            rows.append(f"| {kind} | {label} | {a['rate']:.3f} ({a['k']}/{a['n']}) [{a['low']:.3f}, {a['high']:.3f}] "
                        f"| {m['balanced_accuracy']:.3f} [{bl:.3f}, {bh:.3f}] | {m['f1']:.3f} [{fl:.3f}, {fh:.3f}] "
                        f"| {m['answered']:.2f} |")
    return rows


def _latent_rows(res: Any) -> list[str]:
    f = res.to_frame()
    rows = ["| latent | explanation | detection bal. acc. own / shuffled | fuzzing bal. acc. own / shuffled |",
            "| --- | --- | --- | --- |"]
    def cell(lt: int, kind: str) -> str:
        v = [f[(f.latent == lt) & (f.scorer == kind) & (f.condition == c)].balanced_accuracy.iloc[0]
             for c in ("explanation", "shuffled")]
        return " / ".join("n/a" if x != x else f"{x:.2f}" for x in v)

    for lt, e in zip(res.latents, res.explanations):
        text = e.text.replace("|", "\\|")[:110]
        rows.append(f"| {lt} | {text} | {cell(lt, 'detection')} | {cell(lt, 'fuzzing')} |")
    return rows


def report(res: Any, args: argparse.Namespace, info: dict, rule: str, times: dict, cmd: str) -> str:
    s = res.summary()
    verdict = []
    for kind in ("detection", "fuzzing"):
        own, ctl = s[f"{kind}/explanation"]["accuracy"], s[f"{kind}/shuffled"]["accuracy"]
        if not own["n"] or not ctl["n"]:
            verdict.append(f"- {kind}: no answered examples ({own['n']} with own, {ctl['n']} with shuffled "
                           f"explanations): no score and no comparison with the control.")
            continue
        sep = own["low"] > ctl["high"]
        verdict.append(f"- {kind}: accuracy {own['rate']:.3f} with the latents' own explanations vs {ctl['rate']:.3f} "
                       f"with shuffled ones; the Wilson intervals {'do not overlap' if sep else 'overlap'}: "
                       f"{'the explanations carry information the control lacks' if sep else 'no measurable effect at this size'}.")
    return "\n".join([
        "# Explanations of SAE latents: detection and fuzzing vs shuffled explanations", "",
        f"Command: `{cmd}`", "", f"Machine: {machine()}", "",
        "- Model under study: `smollm2-aligned` (SmolLM2-135M-Instruct + safety LoRA); explainer and scorer: "
        f"`{args.explainer}`, greedy, through `steering.generate` (`sae.explain.LocalChatClient`, scorer prompts "
        "batched).",
        f"- SAE: TopK, d_sae {args.d_sae}, k {args.k}, trained on `{res.site}` over {info['tokens']} tokens of "
        f"{args.statements} persona statements (plain text) for {args.train_tokens} tokens: FVU {info['fvu']}, "
        f"L0 {info['l0']}, dead {info['dead']} ({info['seconds']} s capture + training).",
        f"- Latents ({len(res.latents)}): {rule}.",
        f"- Shown: explainer {res.config['n_explain']} top + {res.config['n_explain_random']} non-activating contexts; "
        f"each scorer {res.config['n_test']} held-out activating + {res.config['n_test_random']} non-activating, "
        f"{res.config['n_shown']} per prompt; window {tuple(res.config['window'])} tokens around the peak; "
        f"few-shot worked example: {'yes' if res.config['few_shot'] else 'no'}.",
        f"- Time: explaining {times['explain_s']:.0f} s ({times['explain_calls']} calls); scoring "
        f"{times['score_s']:.0f} s ({times['score_calls']} calls, both conditions): "
        f"**{times['latents_per_min']:.2f} latents/min scored** (detection + fuzzing, own + shuffled).", "",
        "## Pooled over latents", "", *_pooled_rows(res), "", *verdict, "",
        "## Per latent", "", *_latent_rows(res), "",
        "## Reading", "",
        "- A 135M model is a weak explainer and a weak scorer: read the answered column (answers that were not a "
        "list of 0/1 of the right length count as unanswered, not wrong) and the control before any score. The "
        "control is the same scorer on the same examples in the same order with another latent's explanation, so "
        "any bias of the scorer (always answering 1, position habits) shows in both rows alike.",
        "- Accuracy and the per-class rates use Wilson intervals (`interp.evals.rates`); balanced accuracy and F1 "
        "are not binomial proportions, so their intervals are percentile bootstraps over examples, resampled "
        "within each class (`interp.evals.bootstrap`).",
        "- Notes from the run: " + ("; ".join(res.notes) if res.notes else "none."), ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latents", type=int, default=8)
    ap.add_argument("--statements", type=int, default=1000)
    ap.add_argument("--layer", type=int, default=9)
    ap.add_argument("--d-sae", type=int, default=1024)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--train-tokens", type=int, default=300_000)
    ap.add_argument("--explain-tokens", type=int, default=40, help="the explainer's answer length")
    ap.add_argument("--explainer", default="smollm2-aligned",
                    help="the chat model that explains and scores (e.g. smollm2-135m-instruct: no safety LoRA)")
    ap.add_argument("--folder", default=None, help="run folder (resumable); default a fresh temporary one")
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_explain.md")))
    args = ap.parse_args()
    torch.manual_seed(0)
    model = interp.load_model("smollm2-aligned")
    prompts = interp.Prompts(statements(args.statements, 0), chat=False)
    site = f"blocks.{args.layer}.hook_resid_post"
    sae, freq, info = fit_sae(model, prompts, site, args)
    # zero-shot, one example per scorer prompt: a 135M model copies a worked example verbatim (measured: every
    # explanation came back as the example's own) and cannot keep a list of five answers in order
    cfg = ExplainConfig(n_explain=10, n_explain_random=5, n_test=5, n_test_random=5, n_shown=1, window=(12, 4),
                        few_shot=False)
    latents, rule = pick_latents(model, sae, prompts, freq, cfg, args.latents, seed=0)
    chat_model = model if args.explainer == "smollm2-aligned" else interp.load_model(args.explainer)
    explainer = Timed(LocalChatClient(chat_model, steering.generate, max_new_tokens=args.explain_tokens))
    scorer = Timed(LocalChatClient(chat_model, steering.generate, max_new_tokens=6))
    folder = args.folder or tempfile.mkdtemp(prefix="explain_run_")
    res = explain_latents(model, sae, latents, prompts, explainer, scorer=scorer, cfg=cfg, folder=folder)
    times = {"explain_s": explainer.seconds, "explain_calls": explainer.calls, "score_s": scorer.seconds,
             "score_calls": scorer.calls,
             "latents_per_min": len(latents) / max(scorer.seconds / 60, 1e-9) if scorer.calls else float("nan")}
    cmd = "python benchmarks/bench_explain.py " + " ".join(sys.argv[1:])
    text = report(res, args, info, rule, times, cmd.strip())
    write_text(args.out, text)
    res.save(Path(folder) / "result", overwrite=True)
    print(text)
    print(f"run folder: {folder}")


if __name__ == "__main__":
    main()
