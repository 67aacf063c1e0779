"""The engine client and the translation of docker.errors into the hybrid family."""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING

import docker
from docker import errors

from hybrid.errors import EngineUnavailable, WorkstationError, WorkstationNotFound

if TYPE_CHECKING:
    from collections.abc import Iterator


_CLIENT: docker.DockerClient | None = None
_STREAM: docker.APIClient | None = None
_LOCK = threading.Lock()


def client() -> docker.DockerClient:
    """A client for the engine at DOCKER_HOST (default the local socket); EngineUnavailable if none."""
    global _CLIENT
    with _LOCK:
        if _CLIENT is None:
            try:
                made = docker.from_env(timeout=120)
                _local(made.api)
                made.ping()
            except errors.DockerException as exc:
                raise EngineUnavailable(_unreachable(exc)) from None
            _CLIENT = made
        return _CLIENT


def _stream_client() -> docker.APIClient:
    # Exec output streams may stay silent longer than any request timeout; the supervisor
    # enforces the deadline instead, so this client has none.
    global _STREAM
    api = client().api
    with _LOCK:
        if _STREAM is None:
            _STREAM = _local(docker.from_env(timeout=None, version=api.api_version).api)
        return _STREAM


def _local(api: docker.APIClient) -> docker.APIClient:
    # No proxy applies to a Unix socket, yet requests looks for one in the environment on every
    # call: ~1.5 ms of a ~5 ms engine call on a slow host, four or five calls per exec.
    if api.base_url.startswith("http+docker://"):
        api.trust_env = False
    return api


def _unreachable(exc: BaseException) -> str:
    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
    return f"no Docker engine at {where} ({first}); start one with: hybrid engine install"


@contextlib.contextmanager
def translate(what: str = "") -> Iterator[None]:
    """Translate docker.errors.* into the hybrid error family (the one place this happens)."""
    prefix = f"{what}: " if what else ""
    try:
        yield
    except errors.NotFound as exc:
        raise WorkstationNotFound(prefix + _explain(exc)) from None
    except errors.APIError as exc:
        raise WorkstationError(prefix + _explain(exc)) from None
    except errors.DockerException as exc:
        raise EngineUnavailable(prefix + _unreachable(exc)) from None
    except ConnectionError as exc:
        raise EngineUnavailable(prefix + _unreachable(exc)) from None


def _explain(exc: errors.DockerException) -> str:
    if isinstance(exc, errors.APIError) and exc.explanation:
        return str(exc.explanation)
    return str(exc)
