"""wasm fixtures (the probe module itself is built by tests/conftest.py)."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybrid.wasm.runtime import remove_scratch_dirs


@pytest.fixture
def run_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point the runtime's temp dir at a private folder and check no run directory is left behind."""
    private = tmp_path / "tmp"
    private.mkdir()
    started = time.time() - 1
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    yield private
    left = [p for p in private.rglob("*")]
    assert all(p.is_dir() and p.name.startswith("hybrid-run-") for p in left), (
        f"guest files left behind: {left}"
    )
    remove_scratch_dirs()  # what happens at interpreter exit
    assert list(private.iterdir()) == [], "scratch directories survive exit"
    io_root = Path("/dev/shm")
    if io_root.is_dir():
        mine = [p for p in io_root.glob("hybrid-io-*") if p.stat().st_mtime >= started]
        assert mine == [], f"I/O directories left behind: {mine}"
    shutil.rmtree(private)
