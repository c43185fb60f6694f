"""Chat clients the explainer and the scorers talk to: one protocol, ``complete(messages) -> str``.

:class:`LocalChatClient` runs any local chat model through the project's own generation (``steering.generate``,
passed in: ``sae`` sits below ``steering`` and never imports it); :class:`HTTPChatClient` calls an
OpenAI-compatible ``/chat/completions`` endpoint over HTTP (stdlib ``urllib``; retries with backoff; errors that
name the URL and the fix). Messages are OpenAI-style dicts ``{"role": "system" | "user" | "assistant",
"content": str}``.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

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


class LocalChatClient:
    """A local chat model answering through ``generate`` (pass ``steering.generate``): greedy, ``max_new_tokens``.

    The messages are laid out by the model's own chat template (multi-turn few-shot examples kept as turns) and
    handed to ``generate`` as one raw prompt (``Prompts(chat=False)``), so no decoding loop lives here."""

    def __init__(self, model: Any, generate: Callable[..., Any], max_new_tokens: int = 64, name: str | None = None):
        if not callable(generate):
            raise TypeError("generate must be the generation function, e.g. LocalChatClient(model, "
                            "generate=steering.generate)")
        self.model, self.generate, self.max_new_tokens = model, generate, int(max_new_tokens)
        self.name = name or f"local:{getattr(model, 'name', type(model).__name__)}"

    def prompt_text(self, messages: Messages) -> str:
        """The raw prompt the model reads: its chat template over ``messages`` with the assistant turn opened."""
        msgs = check_messages(messages)
        tok = self.model.tokenizer
        if getattr(tok, "chat_template", None):
            return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in msgs) + "Assistant:"

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


@dataclass
class HTTPChatClient:
    """An OpenAI-compatible chat-completions endpoint: ``POST {base_url}/chat/completions``.

    ``api_key`` (optional) goes in an ``Authorization: Bearer`` header. A refused connection, a timeout, a 429 or
    a 5xx is retried ``retries`` times with exponential backoff (``backoff * 2**attempt`` seconds); another 4xx
    is not. The final failure is a :class:`ChatClientError` naming the URL and what to fix."""

    base_url: str
    model: str
    api_key: str | None = None
    timeout: float = 60.0
    retries: int = 3
    backoff: float = 1.0
    max_tokens: int = 256
    temperature: float = 0.0

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r} "
                             f"(e.g. 'http://127.0.0.1:8000/v1')")
        if self.timeout <= 0 or self.retries < 0 or self.backoff < 0:
            raise ValueError("timeout must be > 0, retries and backoff >= 0")
        self.base_url = self.base_url.rstrip("/")

    @property
    def name(self) -> str:
        return f"http:{self.model}@{self.base_url}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def _request(self, messages: list[dict[str, str]]) -> urllib.request.Request:
        body = json.dumps({"model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                           "temperature": self.temperature}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return urllib.request.Request(self.url, data=body, headers=headers, method="POST")

    def _once(self, messages: list[dict[str, str]]) -> str:
        with urllib.request.urlopen(self._request(messages), timeout=self.timeout) as r:
            raw = r.read()
        try:
            return json.loads(raw)["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise ChatClientError(f"{self.url} answered 200 but not with an OpenAI chat completion "
                                  f"(choices[0].message.content): {raw[:200]!r}; point base_url at an "
                                  f"OpenAI-compatible server (the path ends in /v1)") from e

    def _failure(self, e: BaseException) -> tuple[bool, str]:
        """``(retry?, message)`` for one failed attempt."""
        if isinstance(e, urllib.error.HTTPError):
            detail = e.read()[:200].decode(errors="replace") if e.fp else ""
            fix = ("check api_key" if e.code in (401, 403) else "check base_url and model" if e.code in (404, 400)
                   else "the server failed; check its log, or retry later")
            return e.code == 429 or e.code >= 500, f"{self.url} answered HTTP {e.code} {e.reason}: {detail!r}; {fix}"
        if isinstance(e, (TimeoutError, socket.timeout)) or isinstance(getattr(e, "reason", None), TimeoutError):
            return True, (f"{self.url} did not answer within timeout={self.timeout}s; raise timeout= (a local model "
                          f"on CPU can need minutes) or check the server is not stuck")
        if isinstance(e, (urllib.error.URLError, ConnectionError)):
            reason = getattr(e, "reason", e)
            return True, (f"could not connect to {self.url} ({reason}); start the server or fix base_url "
                          f"(e.g. 'http://127.0.0.1:8000/v1')")
        return False, f"{self.url}: {type(e).__name__}: {e}"

    def complete(self, messages: Messages) -> str:
        msgs = check_messages(messages)
        for attempt in range(self.retries + 1):
            try:
                return self._once(msgs)
            except ChatClientError:
                raise
            except Exception as e:  # noqa: BLE001 - classified just below, unknown ones re-raised with the URL
                retry, msg = self._failure(e)
                if not retry or attempt == self.retries:
                    raise ChatClientError(f"{msg} (after {attempt + 1} attempt(s))") from e
                time.sleep(self.backoff * 2 ** attempt)
        raise AssertionError("unreachable")


__all__ = ["ChatClient", "ChatClientError", "HTTPChatClient", "LocalChatClient", "Messages", "check_messages"]
