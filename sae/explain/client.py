"""Chat clients the explainer and the scorers talk to: one protocol, ``complete(messages) -> str``; a client that
can also read its model's next-token log-probabilities has ``option_logprobs(conversations, options, cue)`` (the
scorers' constrained verdicts, ``ExplainConfig(verdicts="logprob")``).

:class:`LocalChatClient` runs any local chat model through the project's own generation (``steering.generate``,
passed in: ``sae`` sits below ``steering`` and never imports it); :class:`HTTPChatClient` calls an
OpenAI-compatible ``/chat/completions`` endpoint over HTTP (stdlib ``urllib``; retries with backoff; errors that
name the URL and the fix). Messages are OpenAI-style dicts ``{"role": "system" | "user" | "assistant",
"content": str}``.
"""

from __future__ import annotations

import json
import math
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

Messages = Sequence[dict[str, str]]


@runtime_checkable
class ChatClient(Protocol):
    """Anything with ``complete(messages) -> str`` (the answer's text) and a ``name`` for the records."""

    name: str

    def complete(self, messages: Messages) -> str: ...


class ChatClientError(RuntimeError):
    """A chat endpoint refused, failed or timed out; the message names the URL and the fix."""


def check_messages(messages: Messages) -> list[dict[str, str]]:
    """``messages`` as a list of ``{"role", "content"}`` dicts, or a ``ValueError`` naming the bad one."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") or \
                not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} must be {{'role': 'system'|'user'|'assistant', 'content': str}}, "
                             f"got {m!r:.80}")
        out.append({"role": m["role"], "content": m["content"]})
    if not out or out[-1]["role"] != "user":
        raise ValueError("a chat completion needs messages ending with a 'user' message")
    return out


def chat_prompt(tokenizer: Any, messages: Messages) -> str:
    """The raw prompt a chat model reads: its tokenizer's chat template over ``messages`` with the assistant turn
    opened (``System: ... / User: ... / Assistant:`` lines for a tokenizer without a template)."""
    msgs = check_messages(messages)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in msgs) + "Assistant:"


def option_tokens(tokenizer: Any, options: Sequence[str], context: str | None = None) -> list[int]:
    """The token id of each option: each must be one token of ``tokenizer`` (not its unknown token) and no two
    may share one; with ``context`` (a prompt and its cue), ``context + option`` must tokenize as ``context``'s
    tokens and then that one token (a tokenizer that merges the option with the text before it, or spells it
    differently inside text, would make its log-prob the wrong token's). Else a ``ValueError`` naming the fix."""
    if isinstance(options, str) or len(options) < 2:
        raise ValueError(f"options must be two or more answer strings, e.g. ('1', '0'), got {options!r}")
    ids = []
    for o in options:
        got = tokenizer.encode(o, add_special_tokens=False) if isinstance(o, str) else None
        if got is None or len(got) != 1:
            raise ValueError(f"option {o!r} is {'not a string' if got is None else f'{len(got)} tokens {got}'} for "
                             f"this tokenizer; each option must be exactly one token (e.g. '1' / '0' after a "
                             f"'[' cue): pick single-token answers")
        if got[0] is not None and got[0] == getattr(tokenizer, "unk_token_id", None):
            raise ValueError(f"option {o!r} is the tokenizer's unknown token; pick answers the vocabulary holds")
        ids.append(int(got[0]))
    if len(set(ids)) != len(ids):
        raise ValueError(f"options {list(options)!r} map to the same token(s) {ids}; pick answers that are "
                         f"distinct tokens")
    if context is not None:
        head = tokenizer.encode(context, add_special_tokens=False)
        for o, i in zip(options, ids):
            if tokenizer.encode(context + o, add_special_tokens=False) != head + [i]:
                raise ValueError(f"option {o!r} does not follow the prompt as its own token {i} (the tokenizer "
                                 f"merges it with the text before, ending {context[-20:]!r}); end the cue where a "
                                 f"token ends (e.g. '[' before '1' / '0')")
    return ids


class LocalChatClient:
    """A local chat model answering through ``generate`` (pass ``steering.generate``): greedy, ``max_new_tokens``.

    The messages are laid out by the model's own chat template (multi-turn few-shot examples kept as turns) and
    handed to ``generate`` as one raw prompt (``Prompts(chat=False)``), so no decoding loop lives here.
    :meth:`option_logprobs` (the scorers' constrained verdicts) runs the same prompts through ``interp.forward``
    (prepare, batches, last-position logits): one forward, no generation."""

    def __init__(self, model: Any, generate: Callable[..., Any], max_new_tokens: int = 64, name: str | None = None):
        if not callable(generate):
            raise TypeError("generate must be the generation function, e.g. LocalChatClient(model, "
                            "generate=steering.generate)")
        self.model, self.generate, self.max_new_tokens = model, generate, int(max_new_tokens)
        self.name = name or f"local:{getattr(model, 'name', type(model).__name__)}"

    def prompt_text(self, messages: Messages) -> str:
        """The raw prompt the model reads: its chat template over ``messages`` with the assistant turn opened."""
        return chat_prompt(self.model.tokenizer, messages)

    def complete(self, messages: Messages) -> str:
        return self.complete_many([messages])[0]

    def complete_many(self, conversations: Sequence[Messages], batch_size: int = 8) -> list[str]:
        """Answers to several conversations, generated ``batch_size`` at a time (left-padded batches, the way
        ``generate`` batches any prompt list); the scorers use it when a client has it."""
        from interp.values import Prompts, Runtime

        texts = tuple(self.prompt_text(m) for m in conversations)
        out = self.generate(self.model, Prompts(texts, chat=False), max_new_tokens=self.max_new_tokens,
                            runtime=Runtime(batch_size=batch_size, progress=False))
        return list(out.texts)

    def option_logprobs(self, conversations: Sequence[Messages], options: Sequence[str] = ("1", "0"),
                        cue: str = "", batch_size: int = 8, reuse_prefix: bool = True) -> torch.Tensor:
        """``[n, len(options)]`` float32: the model's log-probability (log-softmax over the whole vocabulary) of
        each option as the next token after each conversation's prompt (:meth:`prompt_text`) followed by ``cue``
        (the start of the answer, e.g. ``"["``). Each option must be one token (:func:`option_tokens`). One
        forward per left-padded batch of ``batch_size`` (prompts batched longest first), no generation.
        ``reuse_prefix``: the prompts' longest common token prefix (a scorer's system prompt and explanation) is
        run once and its keys and values reused (``interp.forward``'s ``prefix=, start=``; exact for a causal
        model); each batch then holds prompts of one length, unpadded. Off, or for a model whose cache cannot be
        reused (sliding-window attention), every prompt runs whole."""
        from interp.forward import batches, last_logits, length_order, prepare

        ids = option_tokens(self.model.tokenizer, options)
        if not conversations:
            return torch.empty(0, len(ids))
        texts = [self.prompt_text(m) + cue for m in conversations]
        option_tokens(self.model.tokenizer, options, context=texts[0])  # the same prompt layout for every row
        _, encs = prepare(self.model, texts, chat=False)
        order = length_order(encs)
        groups, prefix, start = [order], None, 0
        if reuse_prefix and len(encs) > 1:
            prefix, start = shared_prefix(self.model, encs)
            if prefix is not None:  # equal lengths together: no padding, so the prefix's columns line up
                groups = [[i for i in order if len(encs[i].ids) == n] for n in dict.fromkeys(len(e.ids) for e in encs)]
        out = torch.empty(len(encs), len(ids))
        for group in groups:
            for a, batch in zip(range(0, len(group), batch_size),
                                batches(self.model, [encs[i] for i in group], batch_size)):
                rows = batch.input_ids.shape[0]
                kv = None if prefix is None else [(K.expand(rows, -1, -1, -1), V.expand(rows, -1, -1, -1))
                                                  for K, V in prefix]
                lp = last_logits(self.model, batch, prefix=kv, start=start).log_softmax(-1)[:, ids].cpu()
                out[group[a:a + rows]] = lp
        return out


def shared_prefix(model: Any, encs: Sequence[Any]) -> tuple[Any, int]:
    """``(keys and values, length)`` of the longest token prefix all ``encs`` share (one row, one forward; at
    least one token of every encoding left after it), or ``(None, 0)`` when they share none or the model's cache
    cannot be reused (``interp.forward.prefix_cache``)."""
    from interp.forward import batches, encode_ids, prefix_cache

    first, start = encs[0].ids, min(len(e.ids) for e in encs) - 1
    for e in encs[1:]:
        start = next((k for k in range(start) if e.ids[k] != first[k]), start)
    if start < 1:
        return None, 0
    kv = prefix_cache(model, batches(model, encode_ids([first[:start]]), 1)[0])
    return (kv, start) if kv is not None else (None, 0)


@dataclass
class HTTPChatClient:
    """An OpenAI-compatible chat-completions endpoint: ``POST {base_url}/chat/completions``.

    ``api_key`` (optional) goes in an ``Authorization: Bearer`` header. A refused connection, a timeout, a 429 or
    a 5xx is retried ``retries`` times with exponential backoff (``backoff * 2**attempt`` seconds); another 4xx
    is not. The final failure is a :class:`ChatClientError` naming the URL and what to fix.

    :meth:`option_logprobs` (constrained verdicts) uses the completions API, ``POST {base_url}/completions`` with
    ``logprobs=top_logprobs``, on the prompt laid out here by ``tokenizer``'s chat template (the served model's
    tokenizer: the chat API cannot end a prompt with an answer cue)."""

    base_url: str
    model: str
    api_key: str | None = None
    timeout: float = 60.0
    retries: int = 3
    backoff: float = 1.0
    max_tokens: int = 256
    temperature: float = 0.0
    tokenizer: Any = None
    top_logprobs: int = 20

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r} "
                             f"(e.g. 'http://127.0.0.1:8000/v1')")
        if self.timeout <= 0 or self.retries < 0 or self.backoff < 0 or self.top_logprobs < 1:
            raise ValueError("timeout must be > 0, retries and backoff >= 0, top_logprobs >= 1")
        self.base_url = self.base_url.rstrip("/")

    @property
    def name(self) -> str:
        return f"http:{self.model}@{self.base_url}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def _request(self, url: str, body: dict[str, Any]) -> urllib.request.Request:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")

    def _failure(self, e: BaseException, url: str, hint: str = "") -> tuple[bool, str]:
        """``(retry?, message)`` for one failed attempt on ``url`` (``hint``: the fix for a 400 / 404 there)."""
        if isinstance(e, urllib.error.HTTPError):
            detail = e.read()[:200].decode(errors="replace") if e.fp else ""
            fix = ("check api_key" if e.code in (401, 403) else (hint or "check base_url and model")
                   if e.code in (404, 400) else "the server failed; check its log, or retry later")
            return e.code == 429 or e.code >= 500, f"{url} answered HTTP {e.code} {e.reason}: {detail!r}; {fix}"
        if isinstance(e, (TimeoutError, socket.timeout)) or isinstance(getattr(e, "reason", None), TimeoutError):
            return True, (f"{url} did not answer within timeout={self.timeout}s; raise timeout= (a local model "
                          f"on CPU can need minutes) or check the server is not stuck")
        if isinstance(e, (urllib.error.URLError, ConnectionError)):
            reason = getattr(e, "reason", e)
            return True, (f"could not connect to {url} ({reason}); start the server or fix base_url "
                          f"(e.g. 'http://127.0.0.1:8000/v1')")
        return False, f"{url}: {type(e).__name__}: {e}"

    def _post(self, url: str, body: dict[str, Any], read: Callable[[Any], Any], hint: str = "") -> Any:
        """``read(the JSON answer)`` of ``POST url``, retried as the class says; ``read`` raises ``KeyError`` /
        ``IndexError`` / ``TypeError`` on an answer of the wrong shape, which is not retried."""
        for attempt in range(self.retries + 1):
            try:
                with urllib.request.urlopen(self._request(url, body), timeout=self.timeout) as r:
                    raw = r.read()
            except Exception as e:  # noqa: BLE001 - classified just below, unknown ones re-raised with the URL
                retry, msg = self._failure(e, url, hint)
                if not retry or attempt == self.retries:
                    raise ChatClientError(f"{msg} (after {attempt + 1} attempt(s))") from e
                time.sleep(self.backoff * 2 ** attempt)
                continue
            try:
                return read(json.loads(raw))
            except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
                raise ChatClientError(f"{url} answered 200 but not as expected ({e}): {raw[:200]!r}; "
                                      f"{hint or 'point base_url at an OpenAI-compatible server (the path ends in /v1)'}"
                                      ) from e
        raise AssertionError("unreachable")

    def complete(self, messages: Messages) -> str:
        body = {"model": self.model, "messages": check_messages(messages), "max_tokens": self.max_tokens,
                "temperature": self.temperature}
        return self._post(self.url, body, lambda a: a["choices"][0]["message"]["content"] or "")

    def option_logprobs(self, conversations: Sequence[Messages], options: Sequence[str] = ("1", "0"),
                        cue: str = "") -> torch.Tensor:
        """``[n, len(options)]``: each option's log-probability as the next token after each conversation's prompt
        (``tokenizer``'s chat template, assistant turn opened) and ``cue``, read from the server's
        ``top_logprobs`` most likely tokens (matched to an option by its exact text); an option outside them gets
        ``-inf`` (delphi counts it as probability 0). One request per conversation."""
        if self.tokenizer is None:
            raise ValueError("option log-probs over HTTP need the served model's chat template: pass "
                             "HTTPChatClient(..., tokenizer=<its HF tokenizer>), or score with "
                             "ExplainConfig(verdicts='text')")
        option_tokens(self.tokenizer, options)  # the same single-token check as the local client
        url = f"{self.base_url}/completions"
        hint = (f"the server must serve the completions API with log-probs (vLLM does, up to its --max-logprobs; "
                f"lower top_logprobs={self.top_logprobs} if refused), or score with ExplainConfig(verdicts='text')")
        rows = []
        for m in conversations:
            body = {"model": self.model, "prompt": chat_prompt(self.tokenizer, m) + cue, "max_tokens": 1,
                    "temperature": 0.0, "logprobs": self.top_logprobs}
            top = self._post(url, body, lambda a: dict(a["choices"][0]["logprobs"]["top_logprobs"][0]), hint)
            rows.append([float(top.get(o, -math.inf)) for o in options])
        return torch.tensor(rows, dtype=torch.float32).reshape(len(rows), len(options))


__all__ = ["ChatClient", "ChatClientError", "HTTPChatClient", "LocalChatClient", "Messages", "chat_prompt",
           "check_messages", "option_tokens"]
