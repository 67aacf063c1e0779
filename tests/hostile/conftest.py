"""The hostile suite's fixtures and hooks (the machinery they use is in hostile_kit.py).

Every test here takes a ``tier``, parametrized over ``hostile_kit.hostile_tiers()`` (the one
place the list is built), and a ``sandbox``: the driver that runs an ``Attack`` on that tier.
The autouse ``nothing_left_behind`` compares before and after every case what it could leave
behind; the session ends with the case x tier table (termination, wall time, leftovers, outcome)
on the terminal and in ``$HYBRID_HOSTILE_REPORT`` (default: hostile-report.md under the pytest
basetemp).
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The test modules import the kit by name: --import-mode=importlib puts no test directory on sys.path.
sys.path.insert(0, str(Path(__file__).parent))

from hostile_kit import (
    _ROWS,
    BASE_BUDGET,
    CONTAINER_TIERS,
    GRACE,
    WORKSTATION_ALLOW,
    Driver,
    Listener,
    ProcessDriver,
    PythonDriver,
    Row,
    WasiDriver,
    WorkstationDriver,
    baseline,
    hostile_tiers,
    leftovers,
    make_repo,
    stop_children,
    table,
    warm,
)

from hybrid.policy import Budget, SandboxSpec


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "tier" in metafunc.fixturenames:
        metafunc.parametrize("tier", hostile_tiers())


@pytest.fixture(scope="session")
def hostile_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private temp dir for the whole session (this process and every CLI it starts), so the
    leftover check sees only what the suite's runs made."""
    private = Path(tempfile.mkdtemp(prefix="hostile-tmp-", dir=tmp_path_factory.getbasetemp()))
    saved, saved_env = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = str(private)
    os.environ["TMPDIR"] = str(private)
    yield private
    tempfile.tempdir = saved
    if saved_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved_env


@pytest.fixture(scope="session")
def hostile_io() -> Iterator[Path]:
    """A private directory for the in-process wasm runs' I/O (pipes, stdin files), normally in
    /dev/shm where every other process on this machine keeps its own."""
    from hybrid.wasm import runtime

    saved = getattr(runtime, "_IO_ROOT", None)
    private = Path(tempfile.mkdtemp(prefix="hostile-io-", dir=saved))
    if saved is not None:
        runtime._IO_ROOT = str(private)
    yield private
    if saved is not None:
        runtime._IO_ROOT = saved
    shutil.rmtree(private, ignore_errors=True)


@pytest.fixture(scope="session")
def hostile_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("hostile-repo"))


@pytest.fixture(scope="session")
def shared_workstation(engine, require_runtime, hostile_repo: Path) -> Iterator[Callable[[], Any]]:  # type: ignore[no-untyped-def]
    """The session's workstation, made on first use (a getter, so tiers that never use it pay nothing)."""
    require_runtime("docker")
    made: list[Any] = []
    lock = threading.Lock()

    def get() -> Any:
        with lock:
            if not made:
                spec = SandboxSpec(
                    tier="docker",
                    budget=Budget.model_validate({**BASE_BUDGET, "memory": "256M"}),
                    network={"mode": "egress", "allow": WORKSTATION_ALLOW},  # type: ignore[arg-type]
                )
                made.append(
                    engine.create(
                        spec,
                        repo=hostile_repo,
                        name=f"hostile-{os.getpid()}-{secrets.token_hex(3)}",
                    )
                )
            return made[0]

    yield get
    for ws in made:
        ws.close()


@pytest.fixture
def row(request: pytest.FixtureRequest) -> Row:
    """This case x tier's row of the closing table."""
    item = request.node
    params = dict(item.callspec.params) if hasattr(item, "callspec") else {}
    tier = params.pop("tier", "")
    case = item.originalname.removeprefix("test_") + "".join(f"[{v}]" for v in params.values())
    return _ROWS.setdefault(item.nodeid, Row(case=case, tier=tier))


@pytest.fixture
def sandbox(  # type: ignore[no-untyped-def]
    request: pytest.FixtureRequest, tier: str, row: Row, hostile_tmp: Path, tmp_path: Path
) -> Driver:
    """The driver for ``tier``; engine tiers need the engine (a failure under HYBRID_REQUIRE_ENGINE=1)."""
    driver: Driver
    if tier == "wasm":
        driver = WasiDriver(tier, row, request.getfixturevalue("probe"), tmp_path)
    elif tier == "python-wasm":
        driver = PythonDriver(tier, row)
    elif tier == "workstation":
        driver = WorkstationDriver(
            tier,
            row,
            request.getfixturevalue("engine"),
            request.getfixturevalue("shared_workstation"),
            request.getfixturevalue("hostile_repo"),
        )
        driver.ws  # made now, before the case's leftover baseline  # noqa: B018
    else:
        if tier in CONTAINER_TIERS:
            request.getfixturevalue("require_runtime")(tier)
        else:
            from hybrid.router import availability

            ok, why = availability().get(tier, (False, "not probed"))
            if not ok:
                reason = f"tier {tier} is not available on this host: {why}"
                if os.environ.get("HYBRID_REQUIRE_ENGINE") == "1":
                    pytest.fail(f"HYBRID_REQUIRE_ENGINE=1 but {reason}", pytrace=False)
                pytest.skip(reason)
        driver = ProcessDriver(tier, row)
    warm(driver)
    return driver


@pytest.fixture(autouse=True)
def nothing_left_behind(
    sandbox: Driver, row: Row, hostile_tmp: Path, hostile_io: Path
) -> Iterator[None]:
    """After every case: nothing it made survives (waiting up to GRACE for async cleanup)."""
    base = baseline(hostile_tmp, hostile_io)
    started = time.monotonic()
    yield
    row.wall_s = time.monotonic() - started
    end = time.monotonic() + GRACE
    while True:
        found = leftovers(base, hostile_tmp, hostile_io, sandbox.tier)
        if not found or time.monotonic() > end:
            break
        time.sleep(0.25)
    row.leftovers = found
    stop_children()  # a failed case must not hand its clients to the next one
    assert not found, f"left behind: {found}"


# -- the closing table ------------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    report = yield
    found = _ROWS.get(item.nodeid)
    if found is not None and (report.when == "call" or report.outcome != "passed"):
        if report.when == "call":
            found.outcome = report.outcome
        elif not found.outcome.startswith("failed"):
            found.outcome = f"{report.outcome} in {report.when}"
    return report


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not _ROWS:
        return
    text = table()
    target = os.environ.get("HYBRID_HOSTILE_REPORT")
    basetemp = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    path = Path(target) if target else basetemp / "hostile-report.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    terminalreporter.section("hostile suite: case x tier")
    terminalreporter.write(text)
    terminalreporter.write_line(f"(written to {path})")


@pytest.fixture
def listener() -> Iterator[Listener]:
    """A TCP listener on every host address, closed after the case."""
    made = Listener()
    yield made
    made.close()
