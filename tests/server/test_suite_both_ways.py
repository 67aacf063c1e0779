"""The CLI tests that drive `hybrid` through the ``hybrid_cli`` fixture pass with every call
forwarded to a running server, as they pass in process (the ordinary run of those files)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from server_kit import Server

ROOT = Path(__file__).resolve().parents[2]
SUITE = [
    "tests/checks/test_csv.py",
    "tests/checks/test_grep.py",
    "tests/checks/test_json.py",
    "tests/checks/test_redact.py",
    "tests/checks/test_scope.py",
    "tests/core/test_inputs.py",
    "tests/core/test_bad_input.py",
    "tests/core/test_policy.py",
]

pytestmark = pytest.mark.slow


def test_cli_tests_pass_through_the_server(server: Server) -> None:
    before = (server.status() or {})["commands"]
    env = {**server.env, "HYBRID_TEST_VIA_SERVER": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            *SUITE,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    served = (server.status() or {})["commands"] - before
    assert served >= 20, f"only {served} commands reached the server"
    assert os.environ.get("HYBRID_TEST_VIA_SERVER") is None
