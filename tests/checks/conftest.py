"""Shared helpers for the built-in check tests: run the real `hybrid` entry point in process."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable

import pytest

from hybrid.cli import main

CliResult = tuple[int, str, str]


@pytest.fixture
def hybrid_cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., CliResult]:
    """Run ``hybrid ARGS`` through the console entry point; return (exit code, stdout, stderr)."""

    def invoke(*args: str, stdin: bytes | None = None) -> CliResult:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        with pytest.raises(SystemExit) as exited:
            main(list(args))
        out = capsys.readouterr()
        code = exited.value.code
        return (code if isinstance(code, int) else 1), out.out, out.err

    return invoke
