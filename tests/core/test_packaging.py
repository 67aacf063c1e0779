"""What a wheel user gets: the files messages point at, and a LICENSE that matches the metadata."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the tracked files (the checkout stays clean)."""
    src = tmp_path_factory.mktemp("src")
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        origin = REPO / name
        if not origin.exists() and not origin.is_symlink():
            continue  # deleted in the work tree
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(origin, src / name, follow_symlinks=False)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        # Build isolation, as a user's build: pyproject's build requirements, not this venv's.
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    (built,) = out.glob("hybrid-*.whl")
    return built


def test_the_wheel_ships_what_messages_point_at(wheel: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        script = archive.read("hybrid/workstation/engine.sh")
        archive.extractall(tmp_path / "site")
    assert script == (REPO / "scripts" / "engine.sh").read_bytes()
    assert any(n.startswith("hybrid/grammars/") and n.endswith(".scm") for n in names)
    assert "hybrid/wasm/modules/redact.wasm" in names
    # The wheel alone (no checkout on the path): the command messages name finds its script.
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    done = subprocess.run(
        [sys.executable, "-m", "hybrid", "engine", "install", "--dry-run", "--json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = Path(json.loads(done.stdout)["script"])
    assert shown.is_relative_to(tmp_path / "site") and shown.read_bytes() == script


def test_license_file_matches_the_metadata(wheel: Path) -> None:
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'license = { text = "Apache-2.0" }' in pyproject
    with zipfile.ZipFile(wheel) as archive:
        licenses = [n for n in archive.namelist() if n.endswith("LICENSE") and ".dist-info/" in n]
        assert licenses and archive.read(licenses[0]).decode() == text
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        assert "License: Apache-2.0" in archive.read(metadata).decode()
