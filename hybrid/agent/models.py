"""Models: messages in; text, token usage and cost out.

One small protocol (``Model.complete``) and three adapters: any OpenAI-compatible chat endpoint
through the official ``openai`` SDK (hosted APIs, vLLM, llama.cpp's server, Ollama), a replay
adapter that plays recorded completions from a JSONL file, and a scripted adapter for tests.

The API key is read from an environment variable the user names and lives only in the SDK
client: it is never stored on a pydantic model, never passed to a sandbox, and every error
message is built here from the status code alone (an endpoint's error body can echo headers).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hybrid.errors import InvalidInput, ModelError, ModelExhausted, ModelTimeout
from hybrid.paths import display, read_input
from hybrid.results import Millis


class Message(BaseModel):
    """One chat message."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str


class Usage(BaseModel):
    """Tokens one call (or a whole run) used."""

    input_tokens: int = Field(0, description="Prompt tokens.")
    output_tokens: int = Field(0, description="Completion tokens.")

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )


class Prices(BaseModel):
    """Per-token prices, in USD per million tokens (0 for a local server)."""

    model_config = ConfigDict(extra="forbid")

    input_per_million: float = Field(0.0, ge=0)
    output_per_million: float = Field(0.0, ge=0)

    def cost(self, usage: Usage) -> float:
        return (
            usage.input_tokens * self.input_per_million
            + usage.output_tokens * self.output_per_million
        ) / 1e6


class Completion(BaseModel):
    """A model's answer to one call."""

    text: str
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = Field(0.0, description="What the call cost at the configured prices.")
    model: str = ""
    latency_ms: Millis = Field(0.0, description="Wall time of the call, retries included.")
    retries: int = Field(0, description="Calls retried after a 429, a 5xx or a timeout.")
    finish_reason: str | None = None


class Model(Protocol):
    """Anything that turns messages into a completion."""

    name: str

    def complete(self, messages: Sequence[Message], *, max_tokens: int | None = None) -> Completion:
        """Answer ``messages``; ``max_tokens`` caps the completion's length."""
        ...


def estimate_tokens(text: str) -> int:
    """A rough token count (4 characters a token) for budgets checked before a call."""
    return (len(text) + 3) // 4


def prompt_tokens(messages: Sequence[Message]) -> int:
    return sum(estimate_tokens(m.content) + 4 for m in messages)


def _safe_url(url: str) -> str:
    # A base URL may carry user:password@; messages name the host only.
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class OpenAIModel:
    """An OpenAI-compatible chat endpoint through the official ``openai`` SDK.

    ``api_key_env`` names the environment variable holding the key (None for a local server
    that wants none). Retries 429, 5xx, timeouts and dropped connections with exponential
    backoff (honouring a short Retry-After); other 4xx fail at once.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str = "https://api.openai.com/v1",
        api_key_env: str | None = "OPENAI_API_KEY",
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        prices: Prices | None = None,
        temperature: float | None = None,
    ) -> None:
        try:
            import openai
        except ImportError:  # pragma: no cover - depends on the install
            raise InvalidInput(
                "the OpenAI-compatible adapter needs the openai package: pip install 'hybrid[agent]'"
            ) from None
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise InvalidInput(f"environment variable {api_key_env} (the API key) is not set")
        else:
            key = "unused"  # the SDK insists on one; local servers ignore it
        if timeout <= 0:
            raise InvalidInput(f"timeout must be positive, got {timeout}")
        self.name = model
        self.base_url = _safe_url(base_url)
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.prices = prices or Prices()
        self.temperature = temperature
        self._api_key_env = api_key_env
        self._base_url = base_url
        # The SDK's own retries are off: ours count them and keep the key out of every message.
        self._client = openai.OpenAI(api_key=key, base_url=base_url, timeout=timeout, max_retries=0)
        self._openai = openai

    def __reduce__(self) -> tuple[Any, ...]:
        # Sent to another process (a Ray node) as its settings: the key is read there, from
        # that machine's environment, and never travels.
        settings = {
            "base_url": self._base_url,
            "api_key_env": self._api_key_env,
            "timeout": self.timeout,
            "max_retries": self.max_retries,
            "backoff": self.backoff,
            "prices": self.prices,
            "temperature": self.temperature,
        }
        return _rebuild_openai, (self.name, settings)

    def __repr__(self) -> str:
        return f"OpenAIModel(model={self.name!r}, base_url={self.base_url!r})"

    def complete(self, messages: Sequence[Message], *, max_tokens: int | None = None) -> Completion:
        openai = self._openai
        start = time.perf_counter()
        arguments: dict[str, Any] = {
            "model": self.name,
            "messages": [m.model_dump() for m in messages],
        }
        if max_tokens is not None:
            arguments["max_tokens"] = max_tokens
        if self.temperature is not None:
            arguments["temperature"] = self.temperature
        retries = 0
        while True:
            try:
                response = self._client.chat.completions.create(**arguments)
                break
            except openai.APITimeoutError:
                failure: ModelError = ModelTimeout(
                    f"model {self.name} at {self.base_url} did not answer within {self.timeout:g} s"
                )
                wait = None
            except openai.APIConnectionError:
                failure = ModelError(f"model endpoint {self.base_url} is unreachable")
                wait = None
            except openai.APIStatusError as exc:
                status = exc.status_code
                failure = ModelError(f"model {self.name} at {self.base_url} answered HTTP {status}")
                if status != 429 and status < 500:
                    raise failure from None
                wait = _retry_after(exc.response.headers.get("retry-after"))
            if retries >= self.max_retries:
                if retries:
                    failure.message += f" (after {retries} retries)"
                    failure.args = (failure.message,)
                raise failure from None
            delay = self.backoff * 2**retries * (1 + random.random() / 4)
            time.sleep(min(wait if wait is not None else delay, 30.0))
            retries += 1
        choice = response.choices[0] if response.choices else None
        text = (choice.message.content if choice is not None else None) or ""
        if response.usage is not None:
            usage = Usage(
                input_tokens=response.usage.prompt_tokens or 0,
                output_tokens=response.usage.completion_tokens or 0,
            )
        else:  # some local servers send none: estimate, so budgets still hold
            usage = Usage(input_tokens=prompt_tokens(messages), output_tokens=estimate_tokens(text))
        return Completion(
            text=text,
            usage=usage,
            cost_usd=self.prices.cost(usage),
            model=response.model or self.name,
            latency_ms=(time.perf_counter() - start) * 1000,
            retries=retries,
            finish_reason=choice.finish_reason if choice is not None else None,
        )


def _rebuild_openai(name: str, settings: dict[str, Any]) -> OpenAIModel:
    return OpenAIModel(name, **settings)


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


class ScriptedModel:
    """Answers from a list, in order (for tests and demos); thread-safe.

    Each answer is a string or a Completion; a string's usage is estimated. ``max_tokens`` cuts
    an answer as a real endpoint would.
    """

    def __init__(
        self,
        answers: Sequence[str | Completion],
        *,
        name: str = "scripted",
        prices: Prices | None = None,
    ) -> None:
        self.name = name
        self.prices = prices or Prices()
        self._answers = list(answers)
        self._next = 0
        self._lock = threading.Lock()
        self.calls: list[list[Message]] = []

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]  # a copy in another process gets a lock of its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def complete(self, messages: Sequence[Message], *, max_tokens: int | None = None) -> Completion:
        with self._lock:
            if self._next >= len(self._answers):
                raise ModelExhausted(f"{self.name}: all {len(self._answers)} answers were used")
            answer = self._answers[self._next]
            self._next += 1
            self.calls.append(list(messages))
        if isinstance(answer, Completion):
            return answer
        text = answer
        if max_tokens is not None and estimate_tokens(text) > max_tokens:
            text = text[: max_tokens * 4]
        usage = Usage(input_tokens=prompt_tokens(messages), output_tokens=estimate_tokens(text))
        return Completion(text=text, usage=usage, cost_usd=self.prices.cost(usage), model=self.name)


class ReplayModel(ScriptedModel):
    """Plays completions recorded in a JSONL file, one per line, in order.

    A line is a Completion object (``{"text": ..., "usage": {...}}``) or ``{"text": ...}``.
    """

    def __init__(self, path: Path, *, name: str | None = None) -> None:
        answers: list[str | Completion] = []
        text = read_input(path, "replay file").decode("utf-8", "replace")
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                answers.append(
                    Completion.model_validate(record) if "usage" in record else str(record["text"])
                )
            except (ValueError, KeyError, TypeError, ValidationError):
                raise InvalidInput(
                    f"{display(path)}:{number}: not a recorded completion (a JSON object with a text field)"
                ) from None
        super().__init__(answers, name=name or f"replay:{path.name}")


def record(completion: Completion, path: Path) -> None:
    """Append ``completion`` to a JSONL file a ReplayModel can play back."""
    with path.open("a", encoding="utf-8") as out:
        out.write(completion.model_dump_json() + "\n")


class RecordingModel:
    """Wraps a model and appends each completion to a JSONL file (for ReplayModel later)."""

    def __init__(self, inner: Model, path: Path) -> None:
        self.inner = inner
        self.name = inner.name
        self.path = path
        self._lock = threading.Lock()
        try:  # a path that cannot be written is bad input now, not a crash mid-run
            with path.open("a", encoding="utf-8"):
                pass
        except OSError as exc:
            raise InvalidInput(
                f"{display(path)}: cannot write the recording ({exc.strerror})"
            ) from None

    def complete(self, messages: Sequence[Message], *, max_tokens: int | None = None) -> Completion:
        answer = self.inner.complete(messages, max_tokens=max_tokens)
        with self._lock:
            record(answer, self.path)
        return answer


__all__ = [
    "Completion",
    "Message",
    "Model",
    "ModelConfig",
    "OpenAIModel",
    "Prices",
    "RecordingModel",
    "ReplayModel",
    "ScriptedModel",
    "Usage",
    "estimate_tokens",
    "prompt_tokens",
    "record",
]


class ModelConfig(BaseModel):
    """An OpenAI-compatible endpoint as a user writes it down (TOML ``[model]`` table)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="The model name the endpoint knows.")
    base_url: str = "https://api.openai.com/v1"
    api_key_env: str | None = Field("OPENAI_API_KEY", description="Variable holding the key.")
    timeout: float = Field(60.0, gt=0)
    max_retries: int = Field(3, ge=0)
    prices: Prices = Field(default_factory=Prices)
    temperature: float | None = None

    @classmethod
    def from_toml(cls, path: Path) -> ModelConfig:
        import tomllib

        try:
            data = tomllib.loads(read_input(path, "model config").decode("utf-8"))
            return cls.model_validate(data.get("model", data))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"{display(path)}: not TOML ({exc})") from None
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"])
            raise InvalidInput(f"{display(path)}: {where}: {error['msg']}") from None

    def build(self) -> OpenAIModel:
        return OpenAIModel(
            self.name,
            base_url=self.base_url,
            api_key_env=self.api_key_env,
            timeout=self.timeout,
            max_retries=self.max_retries,
            prices=self.prices,
            temperature=self.temperature,
        )
