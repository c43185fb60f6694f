"""Explanations of SAE latents scored by detection and fuzzing, each against a shuffled-explanation control.

smollm2-aligned (the realistic organism, SmolLM2-135M-Instruct + a safety LoRA) is the model under study and, by
default, the explainer and scorer (through ``steering.generate``; ``--explainer`` / ``--scorer`` name others). A TopK SAE is trained quickly on its residual stream over
persona statements (Anthropic model-written evaluations, plain text, no chat template); ``--latents`` latents are
drawn at random (seeded) among those firing on enough statements, explained from their top contexts and random
non-activating ones, and scored on held-out contexts. ``--verdicts logprob`` reads each scorer verdict from the
scorer's log-probabilities of "1" vs "0" (no generation; margins and AUROC) instead of parsing its answer. Beside
the own and shuffled explanations, a non-LM reference explanation (the latent's most frequent peak tokens in its
top contexts, "the tokens 'x', 'y', 'z'") is scored on the same examples (``--no-reference`` to skip), and so is
the lexical baseline (those tokens matched in the examples, no model: what the reference could reach read
literally, and whether the held-out examples carry the top contexts' tokens at all). The report
goes to ``--out`` (and ``report.md`` in the run folder); ``benchmarks/RESULTS_explain.md`` is written by hand from
it.

    python benchmarks/bench_explain.py --explainer smollm2-135m-instruct --verdicts logprob --out /tmp/explain.md
    python benchmarks/bench_explain.py --explainer qwen2.5-coder-1.5b-instruct --verdicts logprob  # explains and scores
    python benchmarks/bench_explain.py --explainer qwen2.5-coder-1.5b-instruct --verdicts logprob --corpus mixed \
        --test-from quantiles --latents 12 --d-sae 1024 --train-tokens 400000 --n-test 10 --explain-tokens 80
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
from interp.data import prompt_texts  # noqa: E402
from interp.io import read_json, write_json  # noqa: E402
from sae.analysis import encode_tokens  # noqa: E402
from sae.explain import ExplainConfig, LocalChatClient, Verdicts, explain_latents, latent_examples, score  # noqa: E402
from sae.explain.examples import TEST_FROM  # noqa: E402
from sae.explain.explainer import reference_explanation, reference_tokens  # noqa: E402
from sae.explain.scorers import auroc_difference, lexical_score, pooled, scorer_chunks  # noqa: E402
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

    def option_logprobs(self, conversations: Any, options: Any = ("1", "0"), cue: str = "") -> torch.Tensor:
        t = time.perf_counter()
        try:
            return self.inner.option_logprobs(conversations, options, cue)
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


def corpus(args: argparse.Namespace) -> tuple[list[str], str]:
    """The texts the SAE is trained and its latents read on, and their description for the report."""
    rows = statements(args.statements, 0)
    what = f"{len(rows)} persona statements"
    if args.corpus == "mixed":
        extra = prompt_texts(("instruction",))  # harmless, harmful, borderline and multilingual requests
        rows = rows + extra
        what += f" and the {len(extra)} instructions of the committed prompt sets"
        random.Random(1).shuffle(rows)
    return rows, what + " (plain text)"


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
                 ) -> tuple[list[int], str, dict]:
    """``n`` latents drawn at random among those firing on 0.2%..5% of tokens that have enough contexts (and the
    contexts of all drawn: each latent's split is seeded by the latent alone, as ``explain_latents`` makes it)."""
    band = ((freq >= 0.002) & (freq <= 0.05)).nonzero()[:, 0].tolist()
    pool = random.Random(seed).sample(band, min(len(band), 6 * n))
    ex = latent_examples(model, sae, pool, prompts, cfg)
    ok = [lt for lt in pool if len(ex[lt].test) == cfg.n_test and len(ex[lt].test_random) == cfg.n_test_random][:n]
    rule = (f"drawn at random (seed {seed}) among the {len(band)} latents firing on 0.2%-5% of tokens, keeping "
            f"those with {cfg.n_explain} + {cfg.n_test} activating texts")
    return ok, rule, ex


def score_reference(examples: dict, control_of: dict, scorer: Any, cfg: ExplainConfig, folder: str
                    ) -> dict[str, dict[str, list[Verdicts]]]:
    """Each latent's reference explanation (``"reference"``) and the reference of the latent whose explanation
    scores it in the shuffled control (``"reference_shuffled"``: informative, but about another latent), scored by
    both scorers on its own held-out examples (resumable)."""
    out: dict[str, dict[str, list[Verdicts]]] = {}
    for cond, whose in (("reference", None), ("reference_shuffled", control_of)):
        out[cond] = {"detection": [], "fuzzing": []}
        for kind in out[cond]:
            for lt, ex in examples.items():
                path = Path(folder) / f"{cond}_{kind}_{lt}.json"
                of = lt if whose is None else whose[lt]
                if path.exists():
                    v = Verdicts(**read_json(path))
                    shown = [t for chunk in scorer_chunks(kind, ex, cfg) for _, t, _ in chunk]
                    if v.explanation_of != of or v.texts != shown:
                        raise SystemExit(f"{path} holds verdicts on other examples or another latent's reference "
                                         f"(of {v.explanation_of}, want {of}); delete it to score it again")
                    out[cond][kind].append(v)
                    continue
                v = score(kind, scorer, reference_explanation(examples[of]), ex, cfg, explanation_of=of)
                write_json(path, v.__dict__)
                out[cond][kind].append(v)
    for cond, whose in (("lexical", None), ("lexical_shuffled", control_of)):  # no model: computed, not stored
        out[cond] = {kind: [lexical_score(kind, reference_tokens(examples[of]), ex, cfg, explanation_of=of)
                            for lt, ex in examples.items() for of in [lt if whose is None else whose[lt]]]
                     for kind in ("detection", "fuzzing")}
    return out


CONDS = (("explanation", "own"), ("shuffled", "shuffled (control)"), ("reference", "reference (top tokens)"),
         ("reference_shuffled", "reference of the control's latent"),
         ("lexical", "lexical: the reference's tokens matched, no model"),
         ("lexical_shuffled", "lexical: the control's latent's tokens matched"))


def _conditions(res: Any, ref: dict | None, kind: str) -> dict[str, list]:
    out = {c: res.verdicts(kind, c) for c in ("explanation", "shuffled")}
    for cond, by_kind in (ref or {}).items():
        out[cond] = by_kind[kind]
    return out


def _f(x: float, lo: float | None = None, hi: float | None = None) -> str:
    if x != x:
        return "n/a"
    return f"{x:.3f}" if lo is None else f"{x:.3f} [{lo:.3f}, {hi:.3f}]"


def _pooled_rows(res: Any, ref: dict | None) -> list[str]:
    rows = ["| scorer | explanations | accuracy [95% Wilson] | balanced accuracy [95% bootstrap] | AUROC of the margin "
            "[95% bootstrap] | answered | said 1 |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for kind in ("detection", "fuzzing"):
        for cond, vs in _conditions(res, ref, kind).items():
            m = pooled(vs)
            a = m["accuracy"].columns()
            said1 = sum(q == 1 for v in vs for q in v.preds) / max(1, sum(q is not None for v in vs for q in v.preds))
            auc = _f(m["auroc"], *m["auroc_ci95"]) if "auroc" in m else "n/a (text verdicts)"
            rows.append(f"| {kind} | {dict(CONDS)[cond]} | {a['rate']:.3f} ({a['k']}/{a['n']}) [{a['low']:.3f}, "
                        f"{a['high']:.3f}] | {_f(m['balanced_accuracy'], *m['balanced_accuracy_ci95'])} | {auc} | "
                        f"{m['answered'].rate:.2f} | {said1:.2f} |")
    return rows


def _latent_rows(res: Any, ref: dict | None) -> list[str]:
    metric = "auroc" if res.detection[0].mode == "logprob" else "balanced_accuracy"
    conds = " / ".join(c.split(" ")[0] for c in _conditions(res, ref, "detection"))
    rows = [f"| latent | explanation | reference | detection {metric}: {conds} | fuzzing {metric}: {conds} |",
            "| --- | --- | --- | --- | --- |"]
    for i, (lt, e) in enumerate(zip(res.latents, res.explanations)):
        cells = []
        for kind in ("detection", "fuzzing"):
            vals = [vs[i].metrics(n_boot=10).get(metric, float("nan")) for vs in _conditions(res, ref, kind).values()]
            cells.append(" / ".join(_f(v) for v in vals))
        r = ref["reference"]["detection"][i].explanation if ref else ""
        rows.append(f"| {lt} | {e.text.replace('|', '/')[:100]} | {r.replace('|', '/')} | {cells[0]} | {cells[1]} |")
    return rows


def _verdicts(res: Any, ref: dict | None) -> list[str]:
    out = []
    for kind in ("detection", "fuzzing"):
        conds = _conditions(res, ref, kind)
        if conds["explanation"][0].mode != "logprob":
            own, ctl = (pooled(conds[c])["accuracy"].columns() for c in ("explanation", "shuffled"))
            out.append(f"- {kind}: accuracy own {own['rate']:.3f} (n={own['n']}) vs shuffled {ctl['rate']:.3f} "
                       f"(n={ctl['n']}); text verdicts, no margin.")
            continue
        pairs = [("explanation", "shuffled"), ("reference", "reference_shuffled"), ("reference", "shuffled"),
                 ("lexical", "lexical_shuffled")]
        for cond, ctl in [(a, b) for a, b in pairs if a in conds and b in conds]:
            d, (lo, hi) = auroc_difference(conds[cond], conds[ctl])
            verdict = "above the control" if lo > 0 else "NOT above the control (the interval reaches 0 or below)"
            out.append(f"- {kind}, {dict(CONDS)[cond]} minus {dict(CONDS)[ctl]}: AUROC difference {_f(d, lo, hi)} "
                       f"(paired bootstrap over the same examples): {verdict}.")
    return out


def report(res: Any, args: argparse.Namespace, info: dict, rule: str, times: dict, cmd: str,
           ref: dict | None = None) -> str:
    c = res.config
    return "\n".join([
        "# Explanations of SAE latents: detection and fuzzing vs shuffled explanations", "",
        f"Command: `{cmd}`", "", f"Machine: {machine()}", "",
        f"- Model under study: `smollm2-aligned` (SmolLM2-135M-Instruct + safety LoRA); explainer `{args.explainer}`, "
        f"scorer `{args.scorer}` (`{res.scorer}`), {args.chat_dtype or 'float32'}; explanations greedy through `steering.generate`; scorer verdicts: "
        f"**{c['verdicts']}**" + (" (log p('1') vs log p('0') after the cue '[', one forward per prompt, no "
                                  "generation)" if c["verdicts"] == "logprob" else " (the answer's text parsed)") + ".",
        f"- SAE: TopK, d_sae {args.d_sae}, k {args.k}, trained on `{res.site}` over {info['tokens']} tokens of "
        f"{info['corpus']} for {args.train_tokens} tokens: FVU {info['fvu']}, "
        f"L0 {info['l0']}, dead {info['dead']} ({info['seconds']} s capture + training).",
        f"- Latents ({len(res.latents)}): {rule}.",
        f"- Shown: explainer {c['n_explain']} top + {c['n_explain_random']} non-activating contexts; each scorer "
        f"{c['n_test']} held-out activating ({c.get('test_from', 'random')}) + {c['n_test_random']} non-activating, "
        f"{c['n_shown']} per prompt; window "
        f"{tuple(c['window'])} around the peak; few-shot worked example: {'yes' if c['few_shot'] else 'no'}; "
        f"marked tokens' activations shown to the explainer: {'yes' if c.get('show_activations') else 'no'}.",
        f"- Time: explaining {times['explain_s']:.0f} s ({times['explain_calls']} calls); scoring "
        f"{times['score_s']:.0f} s ({times['score_calls']} scorer prompts, all conditions).", "",
        "## Pooled over latents", "", *_pooled_rows(res, ref), "", *_verdicts(res, ref), "",
        "## Per latent", "", *_latent_rows(res, ref), "",
        "- Notes from the run: " + ("; ".join(res.notes) if res.notes else "none."), ""])


def make_config(args: argparse.Namespace, test_from: str) -> ExplainConfig:
    # zero-shot, one example per scorer prompt: a 135M model copies a worked example verbatim (measured: every
    # explanation came back as the example's own) and cannot keep a list of five answers in order
    return ExplainConfig(n_explain=10, n_explain_random=5, n_test=args.n_test, n_test_random=args.n_test, n_shown=1,
                         window=(12, 4), few_shot=False, verdicts=args.verdicts, test_from=test_from,
                         show_activations=args.show_activations)


def lexical_report(model: Any, sae: Any, prompts: Any, freq: torch.Tensor, args: argparse.Namespace, info: dict,
                   cmd: str) -> str:
    """``--lexical-only``: no explainer, no scorer. For each way of drawing the scorers' activating contexts, the
    lexical baseline (each latent's top-token reference matched in its held-out examples) against the same with
    the shuffled control's latent's tokens: how much the examples carry what the top contexts show."""
    from sae.explain import shuffled_assignment

    rows = ["| held-out activating contexts | scorer | activating with a reference token | non-activating with one | "
            "lexical AUROC [95% bootstrap] | with the control latent's tokens | difference [95% paired bootstrap] |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    rule = ""
    for tf in TEST_FROM:
        cfg = make_config(args, tf)
        latents, rule, examples = pick_latents(model, sae, prompts, freq, cfg, args.latents, seed=0)
        control_of = shuffled_assignment(latents, cfg.seed)
        for kind in ("detection", "fuzzing"):
            own = [lexical_score(kind, reference_tokens(examples[lt]), examples[lt], cfg) for lt in latents]
            ctl = [lexical_score(kind, reference_tokens(examples[control_of[lt]]), examples[lt], cfg,
                                 explanation_of=control_of[lt]) for lt in latents]
            hit = {y: [m > 0 for v in own for m, lab in zip(v.margins, v.labels) if lab == y] for y in (1, 0)}
            a, c = pooled(own), pooled(ctl)
            d, (lo, hi) = auroc_difference(own, ctl)
            rows.append(f"| {tf} | {kind} | {sum(hit[1])}/{len(hit[1])} | {sum(hit[0])}/{len(hit[0])} | "
                        f"{_f(a['auroc'], *a['auroc_ci95'])} | {_f(c['auroc'], *c['auroc_ci95'])} | {_f(d, lo, hi)} |")
    return "\n".join([
        "# The lexical baseline by test sampling (no explainer, no scorer)", "", f"Command: `{cmd}`", "",
        f"Machine: {machine()}", "",
        f"- SAE: TopK, d_sae {args.d_sae}, k {args.k}, on `{sae.site}` over {info['tokens']} tokens of {info['corpus']}: "
        f"FVU {info['fvu']}, L0 {info['l0']}, dead {info['dead']}.",
        f"- Latents ({args.latents}): {rule}; {args.n_test} held-out activating and {args.n_test} non-activating "
        f"contexts per latent and scorer.", "", *rows, ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latents", type=int, default=8)
    ap.add_argument("--statements", type=int, default=1000)
    ap.add_argument("--corpus", choices=("persona", "mixed"), default="persona",
                    help="persona statements only, or with every committed prompt set's instructions")
    ap.add_argument("--test-from", choices=TEST_FROM, default="random",
                    help="the scorers' activating contexts: random, one per activation quantile, or the next strongest")
    ap.add_argument("--layer", type=int, default=9)
    ap.add_argument("--d-sae", type=int, default=1024)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--train-tokens", type=int, default=300_000)
    ap.add_argument("--n-test", type=int, default=5, help="held-out activating (and as many non-activating) per latent")
    ap.add_argument("--explain-tokens", type=int, default=40, help="the explainer's answer length")
    ap.add_argument("--explainer", default="smollm2-aligned",
                    help="the chat model that explains (e.g. smollm2-135m-instruct: no safety LoRA; "
                         "qwen2.5-coder-1.5b-instruct; or a .gguf path)")
    ap.add_argument("--scorer", default=None, help="the chat model that scores (default: the explainer)")
    ap.add_argument("--chat-dtype", default=None, choices=("float32", "bfloat16"),
                    help="dtype of the explainer / scorer when loaded apart from the model under study "
                         "(default float32)")
    ap.add_argument("--verdicts", choices=("text", "logprob"), default="text",
                    help="scorer verdicts from the answer's text, or from log p('1') vs log p('0') (no generation)")
    ap.add_argument("--show-activations", action="store_true",
                    help="the explainer also sees each example's marked tokens with their activation (0-9)")
    ap.add_argument("--no-reference", action="store_true", help="skip the top-token reference explanation")
    ap.add_argument("--lexical-only", action="store_true",
                    help="no explainer or scorer: the lexical baseline under each --test-from, then stop")
    ap.add_argument("--folder", default=None, help="run folder (resumable); default a fresh temporary one")
    ap.add_argument("--out", default=None, help="also write the report here")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(int(__import__("os").environ.get("OMP_NUM_THREADS", "1")))
    model = interp.load_model("smollm2-aligned")
    rows, what = corpus(args)
    prompts = interp.Prompts(rows, chat=False)
    site = f"blocks.{args.layer}.hook_resid_post"
    sae, freq, info = fit_sae(model, prompts, site, args)
    info["corpus"] = what
    cmd = ("python benchmarks/bench_explain.py " + " ".join(sys.argv[1:])).strip()
    if args.lexical_only:
        text = lexical_report(model, sae, prompts, freq, args, info, cmd)
        if args.out:
            write_text(args.out, text)
        print(text)
        return
    cfg = make_config(args, args.test_from)
    latents, rule, examples = pick_latents(model, sae, prompts, freq, cfg, args.latents, seed=0)
    args.scorer = args.scorer or args.explainer
    chat = {n: model if n == "smollm2-aligned" else interp.load_model(n, dtype=args.chat_dtype)
            for n in dict.fromkeys((args.explainer, args.scorer))}
    explainer = Timed(LocalChatClient(chat[args.explainer], steering.generate, max_new_tokens=args.explain_tokens))
    scorer = Timed(LocalChatClient(chat[args.scorer], steering.generate, max_new_tokens=6))
    folder = args.folder or tempfile.mkdtemp(prefix="explain_run_")
    res = explain_latents(model, sae, latents, prompts, explainer, scorer=scorer, cfg=cfg, folder=folder)
    ref = None if args.no_reference else score_reference({lt: examples[lt] for lt in latents},
                                                         dict(zip(res.latents, res.control_of)), scorer, cfg, folder)
    times = {"explain_s": explainer.seconds, "explain_calls": explainer.calls, "score_s": scorer.seconds,
             "score_calls": scorer.calls}
    text = report(res, args, info, rule, times, cmd, ref)
    write_text(Path(folder) / "report.md", text)
    if args.out:
        write_text(args.out, text)
    res.save(Path(folder) / "result", overwrite=True)
    print(text)
    print(f"run folder: {folder}")


if __name__ == "__main__":
    main()
