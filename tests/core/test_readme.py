"""Every snippet in the README runs, as a reader would run it.

Python blocks run as scripts (``python3 snippet.py``, so a missing ``if __name__ == "__main__":``
shows), the TOML policy loads as a SandboxSpec, and shell blocks run line by line in bash. A
comment line ``<!-- readme-test: ... -->`` right before a block says where it runs (``cwd:
DIR``), that it needs the Docker engine or another tier (``engine``, ``bwrap``, ``microvm``), or
why it is not run (``skip: REASON``).
Shell blocks run from a scratch directory that links to the checkout's examples/, tests/ and hybrid/, with
/tmp/ paths and workstation names made unique, so concurrent runs never meet.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hybrid.policy import SandboxSpec

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
FENCE = re.compile(
    r"(?:<!-- readme-test: (?P<note>.*?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)^```", re.S | re.M
)
RUN = {"python", "sh", "bash", "toml"}
# Exit statuses a line may end with: checks exit 1 when they find problems (the README's csv
# example is one), and gate/solve exit 1 for a blocked patch.
FOUND_PROBLEMS = ("hybrid check ", "hybrid gate ")
# Workstation and snapshot names the README uses: suffixed per run on the shared engine.
NAMES = ("demo", "try2", "warm", "pgdemo")
# Lines that touch what other runs on the same engine own: reaping every dead client's leftovers.
NOT_RUN = {"hybrid ws gc": "reaps every dead client's leftovers on a shared engine"}


def _blocks() -> list[tuple[str, str, dict[str, str], int]]:
    text = README.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        lang = match["lang"]
        if lang not in RUN:
            continue
        notes: dict[str, str] = {}
        for part in (match["note"] or "").split(";"):
            key, _, value = part.strip().partition(":")
            if key:
                notes[key.strip()] = value.strip()
        line = text[: match.start("body")].count("\n") + 1
        blocks.append((lang, match["body"], notes, line))
    return blocks


BLOCKS = _blocks()


def test_the_readme_has_snippets_of_each_kind() -> None:
    kinds = {lang for lang, *_ in BLOCKS}
    assert kinds >= {"python", "sh", "bash", "toml"}
    assert sum(lang == "python" for lang, *_ in BLOCKS) >= 3


def _commands(body: str) -> list[str]:
    """Shell lines with continuations joined; comment lines and trailing comments dropped."""
    joined = re.sub(r"\\\n\s*", "", body)
    joined = re.sub(r"&&\n\s*", "&& ", joined)
    lines = []
    for line in joined.splitlines():
        line = re.sub(r"\s{2,}# .*$", "", line).strip()
        if not line or line.startswith("#"):
            continue
        for skip in NOT_RUN:
            line = re.sub(rf"(^|;\s*){re.escape(skip)}\b.*$", "", line).strip()
        if line:
            lines.append(line)
    return lines


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A working directory like the checkout's root (examples/, tests/, hybrid/ linked), a git
    repository with nothing to diff."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("examples", "tests", "hybrid"):
        (work / name).symlink_to(REPO / name)
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    return work


@pytest.mark.parametrize(
    ("lang", "body", "notes", "line"), BLOCKS, ids=[f"README.md:{b[3]}-{b[0]}" for b in BLOCKS]
)
def test_snippet_runs(
    lang: str, body: str, notes: dict[str, str], line: int, scratch: Path, tmp_path: Path, request
) -> None:
    if "skip" in notes:
        pytest.skip(f"README.md:{line}: {notes['skip']}")
    for note, fixture in (("engine", "engine"), ("bwrap", "bwrap_backend"), ("microvm", "microvm")):
        if note in notes:
            request.getfixturevalue(fixture)  # skips (or fails under HYBRID_REQUIRE_ENGINE=1)
    cwd = REPO / notes["cwd"] if "cwd" in notes else scratch
    env = {**os.environ, "PYTHONPATH": str(REPO), "DEPLOY_TOKEN": "tok-0123456789abcdef"}
    if lang == "toml":
        (cwd / "data").mkdir(exist_ok=True)
        policy = cwd / "policy.toml"
        policy.write_text(body)
        assert SandboxSpec.from_toml(policy).budget.memory
        return
    if lang == "python":
        body = body.replace('Path("/tmp/', f'Path("{tmp_path}/')
        script = tmp_path / "snippet.py"
        script.write_text(body)
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, f"README.md:{line}\n{done.stdout}\n{done.stderr}"
        return
    suffix = f"-rt{os.getpid()}"
    commands = _commands(body)
    status = tmp_path / "status"
    script = [f'hybrid() {{ "{sys.executable}" -m hybrid "$@"; }}']
    for command in commands:
        command = command.replace("/tmp/", f"{tmp_path}/")
        for name in NAMES:
            command = re.sub(rf"(?<![\w/.-]){name}(?![\w/.-])", name + suffix, command)
        script += [command, f'echo $? >> "{status}"']
    # One shell for the block, as a reader pastes it (a `cd` holds for the lines after it).
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    codes = [int(c) for c in status.read_text().split()] if status.exists() else []
    assert len(codes) == len(commands), (codes, done.stderr[-3000:])
    for number, (command, code) in enumerate(zip(commands, codes, strict=True)):
        allowed = {0, 1} if any(k in command for k in FOUND_PROBLEMS) else {0}
        assert code in allowed, (
            f"README.md:{line} command {number + 1}: {command}\nexit {code}\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    assert "Traceback" not in done.stderr, done.stderr
