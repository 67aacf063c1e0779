"""Run the real ``hybrid`` console entry point in process (fast) and return what a user sees."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable

import pytest

from hybrid.cli import main

CliResult = tuple[int, str, str]


@pytest.fixture
def hybrid_main(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., CliResult]:
    """``hybrid ARGS`` through main(): (exit code, stdout, stderr); an escaping exception fails."""

    def invoke(*args: str, stdin: bytes = b"") -> CliResult:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        with pytest.raises(SystemExit) as exited:
            main(list(args))
        out = capsys.readouterr()
        code = exited.value.code
        return (code if isinstance(code, int) else 1), out.out, out.err

    return invoke
