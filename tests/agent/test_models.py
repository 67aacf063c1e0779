"""Model adapters. The OpenAI-compatible one talks real HTTP to a server this test starts."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hybrid.agent.models import (
    Completion,
    Message,
    OpenAIModel,
    Prices,
    ReplayModel,
    ScriptedModel,
    Usage,
    record,
)
from hybrid.errors import InvalidInput, ModelError, ModelExhausted, ModelTimeout

KEY = "sk-test-" + "k3y" * 12
Reply = Callable[[dict], tuple[int, dict, dict]]  # request body -> (status, headers, body)


def completion_body(text: str, prompt: int = 11, completion: int = 7) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "local-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": 18},
    }


class Server:
    """A chat-completions endpoint on 127.0.0.1 answering from a script of replies."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.requests: list[tuple[dict, dict]] = []  # (headers, body)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                reply = server.replies.pop(0) if server.replies else None
                status, headers, payload = (
                    reply(body) if reply else (500, {}, {"error": {"message": "no reply"}})
                )
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server() -> Iterator[Server]:
    made = Server()
    yield made
    made.httpd.shutdown()
    made.httpd.server_close()


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("HYBRID_TEST_MODEL_KEY", KEY)
    return "HYBRID_TEST_MODEL_KEY"


def ok(text: str) -> Reply:
    return lambda body: (200, {}, completion_body(text))


def test_a_recorded_answer_comes_back_with_usage_and_cost(server: Server, key: str) -> None:
    server.replies.append(ok("def f(): return 1"))
    model = OpenAIModel(
        "local-model",
        base_url=server.url,
        api_key_env=key,
        prices=Prices(input_per_million=1000, output_per_million=2000),
    )
    answer = model.complete([Message(role="user", content="write f")], max_tokens=50)
    assert answer.text == "def f(): return 1"
    assert answer.usage == Usage(input_tokens=11, output_tokens=7)
    assert answer.cost_usd == pytest.approx((11 * 1000 + 7 * 2000) / 1e6)
    assert answer.retries == 0
    headers, body = server.requests[0]
    assert headers["authorization"] == f"Bearer {KEY}"  # the key goes to the endpoint only
    assert body["messages"] == [{"role": "user", "content": "write f"}]
    assert body["max_tokens"] == 50
    assert KEY not in repr(model)


def test_a_429_is_retried_after_backoff(server: Server, key: str) -> None:
    server.replies.append(lambda body: (429, {"Retry-After": "0.2"}, {"error": {"message": KEY}}))
    server.replies.append(lambda body: (503, {}, {"error": {"message": "busy"}}))
    server.replies.append(ok("second"))
    model = OpenAIModel("m", base_url=server.url, api_key_env=key, backoff=0.05)
    start = time.perf_counter()
    answer = model.complete([Message(role="user", content="hi")])
    assert answer.text == "second"
    assert answer.retries == 2
    assert len(server.requests) == 3
    assert time.perf_counter() - start >= 0.2  # Retry-After was honoured


def test_retries_run_out_and_the_error_never_carries_the_key(server: Server, key: str) -> None:
    # The endpoint echoes the key in its error body; the error raised here is built from the
    # status alone.
    for _ in range(3):
        server.replies.append(lambda body: (500, {}, {"error": {"message": f"bad {KEY}"}}))
    model = OpenAIModel("m", base_url=server.url, api_key_env=key, max_retries=2, backoff=0.01)
    with pytest.raises(ModelError) as caught:
        model.complete([Message(role="user", content="hi")])
    assert "HTTP 500" in caught.value.message and "after 2 retries" in caught.value.message
    assert KEY not in str(caught.value) and caught.value.__cause__ is None


def test_a_client_error_is_not_retried(server: Server, key: str) -> None:
    server.replies.append(lambda body: (401, {}, {"error": {"message": f"wrong key {KEY}"}}))
    model = OpenAIModel("m", base_url=server.url, api_key_env=key, backoff=0.01)
    with pytest.raises(ModelError, match="HTTP 401") as caught:
        model.complete([Message(role="user", content="hi")])
    assert KEY not in str(caught.value)
    assert len(server.requests) == 1


def test_a_slow_endpoint_times_out_then_a_retry_succeeds(server: Server, key: str) -> None:
    def slow(body: dict) -> tuple[int, dict, dict]:
        time.sleep(1.5)
        return 200, {}, completion_body("late")

    server.replies += [slow, ok("on time")]
    model = OpenAIModel("m", base_url=server.url, api_key_env=key, timeout=0.5, backoff=0.01)
    assert model.complete([Message(role="user", content="hi")]).text == "on time"

    server.replies += [slow, slow]
    model = OpenAIModel(
        "m", base_url=server.url, api_key_env=key, timeout=0.5, max_retries=1, backoff=0.01
    )
    start = time.perf_counter()
    with pytest.raises(ModelTimeout, match=r"did not answer within 0\.5 s"):
        model.complete([Message(role="user", content="hi")])
    assert time.perf_counter() - start < 3


def test_a_missing_key_variable_is_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HYBRID_NO_SUCH_KEY", raising=False)
    with pytest.raises(InvalidInput, match="HYBRID_NO_SUCH_KEY"):
        OpenAIModel("m", base_url="http://127.0.0.1:9/v1", api_key_env="HYBRID_NO_SUCH_KEY")


def test_credentials_in_the_base_url_stay_out_of_messages() -> None:
    model = OpenAIModel(
        "m", base_url="http://user:hunter2@127.0.0.1:9/v1", api_key_env=None, max_retries=0
    )
    with pytest.raises(ModelError) as caught:
        model.complete([Message(role="user", content="hi")])
    assert "hunter2" not in str(caught.value) and "hunter2" not in repr(model)


def test_replay_plays_recorded_completions_in_order(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    record(Completion(text="one", usage=Usage(input_tokens=3, output_tokens=1)), path)
    with path.open("a") as out:
        out.write(json.dumps({"text": "two"}) + "\n")
    model = ReplayModel(path)
    first = model.complete([Message(role="user", content="q")])
    assert (first.text, first.usage.output_tokens) == ("one", 1)
    assert model.complete([Message(role="user", content="q")]).text == "two"
    with pytest.raises(ModelExhausted):
        model.complete([Message(role="user", content="q")])
    path.write_text("not json\n")
    with pytest.raises(InvalidInput, match=r"run\.jsonl:1"):
        ReplayModel(path)


def test_scripted_answers_honour_max_tokens() -> None:
    model = ScriptedModel(["x" * 400])
    answer = model.complete([Message(role="user", content="q")], max_tokens=10)
    assert answer.usage.output_tokens <= 10 and len(answer.text) == 40


def test_the_cli_loop_over_real_http_keeps_the_key_out_of_output_and_bundle(
    server: Server, key: str, tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys

    shipping = Path(__file__).parents[1] / "python_wasm" / "shipping"
    for attempt in ("attempt1.py", "attempt2.py"):
        # The first candidate prints its whole environment: the key is not in it.
        code = "import os\nprint(dict(os.environ))\n" + (shipping / attempt).read_text()
        server.replies.append(ok(f"```python\n{code}```"))
    result = subprocess.run(
        [sys.executable, "-m", "hybrid", "solve", "--function", "--task", "write calculate_shipping",
         "--tests", "tests.py", "--file", "rate_card.csv", "--model", "local-model",
         "--base-url", server.url, "--api-key-env", key, "--price-in", "1000",
         "--bundle", str(tmp_path / "b"), "--record", str(tmp_path / "rec.jsonl"), "--json"],
        capture_output=True, text=True, cwd=shipping, timeout=300,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["stop"] == "solved" and report["meter"]["usage"]["input_tokens"] == 22
    assert report["meter"]["cost_usd"] == pytest.approx(22 * 1000 / 1e6)
    assert len(server.requests) == 2
    everything = result.stdout + result.stderr
    everything += "".join(p.read_text() for p in (tmp_path / "b").iterdir())
    assert KEY not in everything
    assert "{" in report["attempts"][0]["candidates"][0]["evidence"]  # the print did arrive
    # The recording plays back without the endpoint: same answers, same outcome.
    replayed = ReplayModel(tmp_path / "rec.jsonl")
    assert [replayed.complete([]).text for _ in range(2)] == [
        c["answer"] for a in report["attempts"] for c in a["candidates"]
    ]
