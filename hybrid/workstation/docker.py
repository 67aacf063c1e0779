"""Docker backend (runc or runsc): hardened workstations over the docker SDK."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import docker
from docker import errors

from hybrid.errors import EngineUnavailable, WorkstationError, WorkstationNotFound

LABEL_MANAGED = "hybrid.managed"
LABEL_KIND = "hybrid.kind"

_CLIENT: docker.DockerClient | None = None


def client() -> docker.DockerClient:
    """A client for the engine at DOCKER_HOST (default the local socket); EngineUnavailable if none."""
    global _CLIENT
    if _CLIENT is None:
        try:
            _CLIENT = docker.from_env(timeout=120)
            _CLIENT.ping()
        except errors.DockerException as exc:
            _CLIENT = None
            raise EngineUnavailable(_unreachable(exc)) from None
    return _CLIENT


def _unreachable(exc: Exception) -> str:
    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return f"no Docker engine at {where} ({str(exc).splitlines()[0][:200]}); start one with scripts/engine.sh"


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
