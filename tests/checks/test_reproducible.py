"""The shipped modules match their sources: source hashes always, byte-identical rebuild with Rust."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hybrid.wasm import builtins

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "wasm_modules" / "build.py"


def load_build():
    spec = importlib.util.spec_from_file_location("hybrid_wasm_build", BUILD)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_manifest_matches_sources_and_shipped_bytes() -> None:
    build = load_build()
    assert build.check_sources() == []
    manifest = builtins.manifest()
    assert set(manifest["modules"]) == set(builtins.NAMES)
    for name, entry in manifest["modules"].items():
        data = builtins.module_path(name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        assert entry["source_sha256"] == build.source_hash(name)
    assert manifest["toolchain"].startswith("rustc ")


def test_source_hash_sees_a_change(tmp_path: Path) -> None:
    build = load_build()
    crate = tmp_path / "checks"
    import shutil

    shutil.copytree(build.CRATE, crate, ignore=shutil.ignore_patterns("target"))
    before = build.source_hash("csv", crate)
    assert build.source_hash("csv", crate) == before
    lib = crate / "src" / "lib.rs"
    lib.write_text(lib.read_text() + "\n// changed\n")
    assert build.source_hash("csv", crate) != before


@pytest.mark.slow
def test_rebuild_is_byte_identical() -> None:
    if load_build().toolchain() is None:
        pytest.skip("Debian rustc/cargo with the wasm32-wasi std not installed")
    done = subprocess.run(
        [sys.executable, str(BUILD), "--check"], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rebuilt byte-identical" in done.stdout


def test_manifest_is_valid_json() -> None:
    json.loads((builtins.MODULES_DIR / "manifest.json").read_text())
