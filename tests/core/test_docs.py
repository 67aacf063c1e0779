"""The documentation builds with warnings as errors: guides, and the API reference generated
from the docstrings (mkdocs + mkdocstrings; a broken link or an unreadable docstring fails)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_docs_build_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(REPO / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    pages = {
        "guides/cli": "hybrid map",
        "guides/library": "check_csv",
        "guides/mcp": "run_python",
        "guides/tiers": "gvisor",
        "api/checks": "check_csv",
        "api/policy": "SandboxSpec",
        "api/results": "ExecutionResult",
        "api/wasm": "PythonPool",
        "api/agent": "FunctionTask",
    }
    for page, needle in pages.items():
        html = (site / page / "index.html").read_text()
        assert needle in html, f"{page} lacks {needle}"
    # Generated from the docstrings, not written by hand; private helpers stay out.
    checks = (site / "api/checks/index.html").read_text()
    assert "never guessed" in checks and "path=" in checks
    assert "The module&#39;s stdin" not in checks and "_names_a_file" not in checks
