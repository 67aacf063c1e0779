from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybrid.wasm.runtime import remove_scratch_dirs

HERE = Path(__file__).parent
RUSTC = "/usr/bin/rustc"  # Debian's rustc ships the wasm32-wasi std (libstd-rust-dev-wasm32)


@pytest.fixture(scope="session")
def probe() -> Path:
    """The containment probe (probe.rs) built for wasm32-wasi, cached by source hash."""
    source = HERE / "probe.rs"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"hybrid-probe-{digest}.wasm"
    if not out.exists():
        if not Path(RUSTC).exists():
            pytest.fail(
                "the containment probe needs Debian's rustc with wasm32-wasi (apt-get install rustc libstd-rust-dev-wasm32 lld-14)"
            )
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run(
            [
                RUSTC,
                "--edition",
                "2021",
                "--target",
                "wasm32-wasi",
                "-O",
                "-C",
                "strip=symbols",
                str(source),
                "-o",
                str(tmp),
            ],
            check=True,
            capture_output=True,
        )
        os.replace(tmp, out)
    return out


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
