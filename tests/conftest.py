"""Shared test settings and fixtures.

An isolated cache and state directory per session; the real Docker engine (``engine``,
``require_runtime``), which is a skip when absent and a failure under HYBRID_REQUIRE_ENGINE=1, so
a green CI run means the container tiers were really tested; and the WASI containment probe.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from hybrid.tiers.container import container_tiers

# Test modules import tests/poll_kit.py by name: --import-mode=importlib puts no test directory on
# sys.path. Last, so no directory under tests/ stands in for an installed package.
sys.path.append(str(Path(__file__).parent))

# A private cache and state per session, so tests neither read nor pollute the user's; removed
# when the session ends (pytest_unconfigure).
_PRIVATE: dict[str, str] = {}  # variable -> the directory this session made for it
for _name, _prefix in (
    ("HYBRID_CACHE_DIR", "hybrid-test-cache-"),
    ("HYBRID_STATE_DIR", "hybrid-test-state-"),
):
    if _name not in os.environ:
        os.environ[_name] = _PRIVATE[_name] = tempfile.mkdtemp(prefix=_prefix)
# A `hybrid` console process a test starts runs in process: no resident server outlives the
# session (tests/server starts its own, and says where).
os.environ.setdefault("HYBRID_NO_SERVER", "1")

REQUIRE_ENGINE = os.environ.get("HYBRID_REQUIRE_ENGINE") == "1"
RUNTIMES = {t.runtime: t.name for t in container_tiers()}
"""Engine runtime -> the tier it serves."""

RUSTC = "/usr/bin/rustc"  # Debian's rustc ships the wasm32-wasi std (libstd-rust-dev-wasm32)
PROBE_SOURCE = Path(__file__).parent / "wasm" / "probe.rs"


def _missing(reason: str) -> None:
    if REQUIRE_ENGINE:
        pytest.fail(f"HYBRID_REQUIRE_ENGINE=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def engine():  # type: ignore[no-untyped-def]
    """The Docker backend, once the engine answers and the base image is present."""
    from hybrid.errors import EngineUnavailable
    from hybrid.workstation import backend, images
    from hybrid.workstation.docker import client

    try:
        info = client().info()
        if images.get() is None:
            _missing(f"the base image {images.BASE_IMAGE} is missing (run scripts/engine.sh)")
    except EngineUnavailable as exc:
        _missing(str(exc))
        raise  # unreachable: _missing skips or fails
    runtimes = set(info.get("Runtimes") or {})
    made = backend()
    made.runtimes = runtimes  # type: ignore[attr-defined]
    return made


@pytest.fixture(scope="session")
def require_runtime(engine) -> Callable[[str], str]:  # type: ignore[no-untyped-def]
    """require_runtime(tier): the engine runtime serving ``tier`` (docker or gvisor), or a skip
    (a failure under HYBRID_REQUIRE_ENGINE=1) when the engine lacks it."""
    by_tier = {tier: runtime for runtime, tier in RUNTIMES.items()}

    def check(tier: str) -> str:
        runtime = by_tier[tier]
        if runtime not in engine.runtimes:
            _missing(f"the engine has no {runtime} runtime (scripts/engine.sh registers runsc)")
        return runtime

    return check


@pytest.fixture(scope="session")
def bwrap_backend():  # type: ignore[no-untyped-def]
    """The bwrap backend, once the tier's probe passes (bubblewrap, root, cgroups, seccomp)."""
    from hybrid.tiers.bwrap import BWRAP

    found = BWRAP.probe()
    if not found.available:
        _missing(f"the bwrap tier is unavailable: {found.detail} ({found.fix})")
    return BWRAP.backend()


@pytest.fixture(scope="session")
def microvm():  # type: ignore[no-untyped-def]
    """The microVM backend, once QEMU and its artifacts are there (``hybrid image microvm``);
    a skip when absent, a failure under HYBRID_REQUIRE_ENGINE=1."""
    from hybrid.tiers.microvm import MICROVM
    from hybrid.workstation.microvm import MicrovmBackend

    found = MICROVM.probe()
    if not found.available:
        _missing(f"the microvm tier is unavailable: {found.detail} ({found.fix})")
    return MicrovmBackend()


@pytest.fixture(scope="session")
def probe() -> Path:
    """The containment probe (tests/wasm/probe.rs) built for wasm32-wasi, cached by source hash."""
    digest = hashlib.sha256(PROBE_SOURCE.read_bytes()).hexdigest()[:16]
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
                str(PROBE_SOURCE),
                "-o",
                str(tmp),
            ],
            check=True,
            capture_output=True,
        )
        os.replace(tmp, out)
    return out


CliResult = tuple[int, str, str]


@pytest.fixture
def hybrid_cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., CliResult]:
    """``hybrid ARGS`` through the real console entry point, in process (fast): (exit code,
    stdout, stderr); stdin is ``stdin`` (empty by default); an escaping exception fails.

    With ``HYBRID_TEST_VIA_SERVER=1`` (tests/server/test_suite_both_ways.py sets it) each call
    is instead a ``hybrid`` console process that forwards it to a running ``hybrid serve``."""
    from hybrid.cli import main

    if os.environ.get("HYBRID_TEST_VIA_SERVER") == "1":
        return _via_server

    def invoke(*args: str, stdin: bytes = b"") -> CliResult:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        with pytest.raises(SystemExit) as exited:
            main(list(args))
        out = capsys.readouterr()
        code = exited.value.code
        return (code if isinstance(code, int) else 1), out.out, out.err

    return invoke


def _via_server(*args: str, stdin: bytes = b"") -> CliResult:
    entry = "import sys; from hybrid.server.client import main; sys.exit(main())"
    # The switch itself is no configuration: with it the client would look for another server.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HYBRID_TEST_VIA_SERVER", "HYBRID_NO_SERVER")
    }
    done = subprocess.run(
        [sys.executable, "-c", entry, *args], input=stdin, capture_output=True, env=env, timeout=300
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def pytest_unconfigure(config: pytest.Config) -> None:
    cache = _PRIVATE.get("HYBRID_CACHE_DIR")
    if cache and any(Path(cache, "deps", "layers").glob("*.json")):
        # The dependency layers this session built live in the engine, not in its private
        # cache: remove them with it, or they outlive their records.
        from hybrid.deps.layers import prune, recorded_keys
        from hybrid.errors import HybridError

        with contextlib.suppress(HybridError):
            prune(only=recorded_keys())
    for path in _PRIVATE.values():
        shutil.rmtree(path, ignore_errors=True)
