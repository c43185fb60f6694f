"""The OpenAI-compatible HTTP chat client against servers started on loopback in the test: one that answers
``/v1/chat/completions`` by calling our local client on a real tiny model (and ``/v1/completions`` with the
model's top log-probs, read straight off its forward), and ones that fail with HTTP 500, refuse the connection,
demand a key, sleep past the timeout, or answer completions without log-probs."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from sae.explain import ChatClientError, HTTPChatClient, LocalChatClient

MESSAGES = [{"role": "system", "content": "answer briefly"}, {"role": "user", "content": "tell me about the rain"}]


@pytest.fixture(scope="module")
def local():
    import steering
    from interp.testing.tiny import tiny_model

    return LocalChatClient(tiny_model("llama", max_position_embeddings=2048), steering.generate, max_new_tokens=10)


def completion(local, req: dict, logprobs: bool) -> dict:
    """A legacy completions answer of one token for ``req["prompt"]`` (already chat-formatted): the model's
    greedy next token and, with ``logprobs``, its ``req["logprobs"]`` likeliest tokens, computed here with one plain
    HF forward of the tokenised prompt (as a server would, not through our forward stack)."""
    import torch

    tok, hf = local.model.tokenizer, local.model.hf
    with torch.no_grad():
        lp = hf(input_ids=torch.tensor([tok.encode(req["prompt"], add_special_tokens=False)])).logits[0, -1]
    lp = lp.float().log_softmax(-1)
    top = lp.topk(int(req.get("logprobs") or 1))
    pieces = [tok.decode([int(i)]) for i in top.indices]
    choice = {"index": 0, "text": pieces[0], "finish_reason": "length", "logprobs": None}
    if logprobs:
        choice["logprobs"] = {"tokens": pieces[:1], "token_logprobs": [float(top.values[0])],
                              "top_logprobs": [{p: float(v) for p, v in zip(pieces[::-1], top.values.tolist()[::-1])}]}
    return {"object": "text_completion", "model": req["model"], "choices": [choice]}


class Server:
    """A ``ThreadingHTTPServer`` on 127.0.0.1 (a free port) whose behaviour is ``mode``: ``ok`` (answers with
    ``local``), ``500``, ``slow`` (sleeps ``delay`` seconds first), ``key`` (401 unless the bearer key is ``k``)
    or ``nologprobs`` (completions without log-probs). Counts the requests it got."""

    def __init__(self, mode: str, local=None, delay: float = 0.0):
        self.mode, self.local, self.delay, self.requests = mode, local, delay, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, obj: dict) -> None:
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, req, self.headers.get("Authorization")))
                if self.path == "/v1/completions" and outer.mode in ("ok", "nologprobs"):
                    return self._send(200, completion(outer.local, req, outer.mode == "ok"))
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": f"no route {self.path}"})
                if outer.mode == "500":
                    return self._send(500, {"error": "boom"})
                if outer.mode == "key" and self.headers.get("Authorization") != "Bearer k":
                    return self._send(401, {"error": "bad key"})
                if outer.mode == "slow":
                    time.sleep(outer.delay)
                text = outer.local.complete(req["messages"]) if outer.local else "ok"
                self._send(200, {"object": "chat.completion", "model": req["model"],
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                              "finish_reason": "stop"}]})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_http_client_answers_as_the_local_client_does(local):
    with Server("ok", local) as srv:
        client = HTTPChatClient(srv.url, model="tiny-llama", timeout=60, retries=0)
        assert client.complete(MESSAGES) == local.complete(MESSAGES)
    path, req, auth = srv.requests[0]
    assert path == "/v1/chat/completions" and req["model"] == "tiny-llama" and req["messages"] == MESSAGES
    assert auth is None and req["temperature"] == 0.0


def test_api_key_is_sent_and_a_wrong_one_is_not_retried():
    with Server("key") as srv:
        assert HTTPChatClient(srv.url, model="m", api_key="k", retries=0).complete(MESSAGES) == "ok"
        with pytest.raises(ChatClientError, match=r"HTTP 401.*check api_key"):
            HTTPChatClient(srv.url, model="m", api_key="wrong", retries=3, backoff=0.0).complete(MESSAGES)
    assert len(srv.requests) == 2  # the 401 was asked once


def test_a_server_error_is_retried_then_names_the_url():
    with Server("500") as srv:
        client = HTTPChatClient(srv.url, model="m", retries=2, backoff=0.01)
        with pytest.raises(ChatClientError) as e:
            client.complete(MESSAGES)
    msg = str(e.value)
    assert f"{srv.url}/chat/completions" in msg and "HTTP 500" in msg and "3 attempt" in msg
    assert len(srv.requests) == 3


def test_a_refused_connection_names_the_url_and_the_fix():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    client = HTTPChatClient(f"http://127.0.0.1:{port}/v1", model="m", retries=1, backoff=0.01)
    with pytest.raises(ChatClientError, match=rf"could not connect to http://127.0.0.1:{port}/v1/chat/completions"
                                              r".*start the server or fix base_url"):
        client.complete(MESSAGES)


def test_a_timeout_names_the_url_and_the_setting():
    with Server("slow", delay=1.5) as srv:
        client = HTTPChatClient(srv.url, model="m", timeout=0.2, retries=0)
        with pytest.raises(ChatClientError, match=r"did not answer within timeout=0.2s; raise timeout="):
            client.complete(MESSAGES)


def test_bad_settings_and_messages_are_refused():
    with pytest.raises(ValueError, match="http://"):
        HTTPChatClient("127.0.0.1:8000", model="m")
    client = HTTPChatClient("http://127.0.0.1:1/v1", model="m")
    with pytest.raises(ValueError, match="ending with a 'user' message"):
        client.complete([{"role": "system", "content": "x"}])
    with pytest.raises(ValueError, match="message 0"):
        client.complete([{"role": "robot", "content": "x"}])


def test_a_run_scores_through_the_http_endpoint(local, tmp_path):
    """The explainer local, the scorer over HTTP (served by the same model): the run finishes and every scorer
    prompt went through the endpoint."""
    import torch

    import interp
    from sae.explain import ExplainConfig, explain_latents
    from sae.model import SAE, SAEConfig

    model = interp.load_model("organism")
    sae = SAE(SAEConfig(model.d_model, 32, arch="relu", site="blocks.1.hook_resid_post"), seed=0)
    with torch.no_grad():
        sae.b_enc.fill_(-0.5)  # a sparse random SAE: the machinery, not the latents, is under test here
    from interp.data import load_prompts

    prompts = [r["instruction"] for r in load_prompts("organism_harmless_train")][:60]
    from sae.explain import latent_examples

    cfg = ExplainConfig(n_explain=3, n_explain_random=1, n_test=2, n_test_random=2, n_shown=4)
    ex = latent_examples(model, sae, range(32), prompts, cfg)
    latents = [k for k, e in ex.items() if len(e.test) == 2 and len(e.test_random) == 2][:2]
    assert len(latents) == 2, "the random SAE should have latents firing on a few prompts"
    with Server("ok", local) as srv:
        http = HTTPChatClient(srv.url, model="tiny-llama", timeout=60, retries=0)
        res = explain_latents(model, sae, latents, prompts, local, scorer=http, cfg=cfg, folder=tmp_path / "run")
    assert res.scorer.startswith("http:tiny-llama@") and res.explainer == "local:tiny-llama"
    assert len(srv.requests) == 2 * 2 * 2  # latents x scorers x conditions, one prompt of 4 each


def test_option_logprobs_over_http_equal_the_local_client(local):
    from sae.explain.prompts import scorer_messages

    convs = [scorer_messages(k, "weather words", [t], few_shot=False)
             for k, t in (("detection", "the rain fell"), ("fuzzing", "a <<dry>> day"), ("detection", "1 0"))]
    tok = local.model.tokenizer
    want = local.option_logprobs(convs, ("1", "0"), cue="[")
    with Server("ok", local) as srv:
        vocab = local.model.hf.config.vocab_size  # every token: both options are among the top log-probs
        http = HTTPChatClient(srv.url, model="tiny-llama", retries=0, tokenizer=tok, top_logprobs=vocab)
        got = http.option_logprobs(convs, ("1", "0"), cue="[")
        narrow = HTTPChatClient(srv.url, model="tiny-llama", retries=0, tokenizer=tok, top_logprobs=1)
        first = narrow.option_logprobs(convs[:1], ("1", "0"), cue="[")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    path, req, _ = srv.requests[0]
    assert path == "/v1/completions" and req["max_tokens"] == 1 and req["temperature"] == 0.0
    assert req["prompt"] == local.prompt_text(convs[0]) + "[" and req["logprobs"] == vocab
    # with one top log-prob, an option outside it is -inf (probability 0, as delphi counts it), one inside exact
    out = torch.isinf(first[0])
    assert int(out.sum()) >= 1 and torch.allclose(first[0][~out], want[0][~out], atol=1e-5)


def test_logprob_scores_over_http_match_the_local_ones(local):
    from sae.contexts import Context
    from sae.explain import ExplainConfig, LatentExamples, score

    def ctx(words, acts, p):
        return Context(prompt=p, position=2, tokens=words, acts=acts, peak=2, max_act=max(acts))

    ex = LatentExamples(3, [], [], [ctx(["the", " heavy", " rain"], [0.0, 0.0, 1.0 + i], i) for i in range(2)],
                        [ctx(["a", " dry", " day"], [0.0, 0.0, 0.0], 9 + i) for i in range(2)], 2)
    cfg = ExplainConfig(n_shown=1, verdicts="logprob")
    with Server("ok", local) as srv:
        http = HTTPChatClient(srv.url, model="tiny-llama", retries=0, tokenizer=local.model.tokenizer,
                              top_logprobs=local.model.hf.config.vocab_size)
        over = score("fuzzing", http, "weather", ex, cfg)
    here = score("fuzzing", local, "weather", ex, cfg)
    assert over.mode == here.mode == "logprob" and over.texts == here.texts and over.preds == here.preds
    assert over.margins == pytest.approx(here.margins, abs=1e-4)


def test_option_logprobs_over_http_refuse_with_the_fix(local):
    tok = local.model.tokenizer
    with pytest.raises(ValueError, match="tokenizer=<its HF tokenizer>"):
        HTTPChatClient("http://127.0.0.1:1/v1", model="m").option_logprobs([MESSAGES])
    with pytest.raises(ValueError, match="exactly one token"):
        HTTPChatClient("http://127.0.0.1:1/v1", model="m", tokenizer=tok).option_logprobs([MESSAGES], ("[1]", "0"))
    with Server("nologprobs", local) as srv:  # completions served, log-probs not
        with pytest.raises(ChatClientError, match=r"/v1/completions answered 200 but not as expected.*log-probs"):
            HTTPChatClient(srv.url, model="m", retries=0, tokenizer=tok).option_logprobs([MESSAGES])
    with Server("key") as srv:  # no completions route at all: 404, not retried
        with pytest.raises(ChatClientError, match=r"HTTP 404.*completions API with log-probs.*verdicts='text'"):
            HTTPChatClient(srv.url, model="m", api_key="k", retries=2, tokenizer=tok).option_logprobs([MESSAGES])
    assert len(srv.requests) == 1
