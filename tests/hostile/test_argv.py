"""NUL and control characters on every tier: no policy string and no library argument becomes an
option of the sandbox itself.

bwrap reads its options NUL-separated (``--args FD``): a policy with
``env.set = { X = "1\\u0000--share-net\\u0000--ro-bind\\u0000/\\u0000/tmp/hostroot" }`` once gave a job
the host's network and its root filesystem, and so did ``exec(workdir="d\\0--share-net")``. Each
case here tries such a value in one place (every policy string field, every argument of run,
exec, put, get and create) and checks that it is refused with the typed error before anything
runs, and that when something did run, the job saw neither a host interface nor a host file.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hostile_kit import Attack, Driver, WorkstationDriver, hybrid_cli

from hybrid import tiers
from hybrid.errors import HybridError, InvalidInput, PolicyError, PolicyViolation
from hybrid.policy import Environment, SandboxSpec
from hybrid.results import ExecutionResult

pytestmark = pytest.mark.timeout(300)

ESCAPE = "\0--share-net\0--ro-bind\0/\0/tmp/hostroot"
"""Appended to a value: what a NUL-separated option list would read as more bwrap options."""


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    """A host file no sandbox may read; the attack looks for it under /tmp/hostroot."""
    path = tmp_path / "host-marker"
    path.write_text(f"host-marker-{secrets.token_hex(8)}\n")
    yield path


def host_interfaces() -> set[str]:
    """The host's network interfaces other than lo (a sandbox without network sees only lo)."""
    lines = Path("/proc/net/dev").read_text().splitlines()[2:]
    return {line.split(":")[0].strip() for line in lines} - {"lo"}


def probe_shell(marker: Path) -> str:
    """What the job runs when a refused value got through: its interfaces and the marker."""
    return f"cat /proc/net/dev; cat /tmp/hostroot{marker} 2>&1; cat {marker} 2>&1; true"


def no_escape(result: ExecutionResult, marker: Path) -> None:
    """A job that ran saw no host interface and no host file."""
    seen = result.stdout + result.stderr
    assert marker.read_text().strip() not in seen, f"the job read the host's {marker}"
    shown = {line.split(":")[0].strip() for line in result.stdout.splitlines() if ":" in line}
    assert not shown & host_interfaces(), f"the job saw host interfaces {shown}"


def refused(
    attempt: Callable[[], Any], error: type[HybridError], marker: Path, what: str
) -> HybridError:
    """``attempt()`` raises ``error``; if it ran instead, fail (after checking it did not escape)."""
    try:
        outcome = attempt()
    except error as exc:
        return exc
    except HybridError as exc:
        pytest.fail(f"{what}: refused with {type(exc).__name__}, not {error.__name__}: {exc}")
    if isinstance(outcome, ExecutionResult):
        no_escape(outcome, marker)
    pytest.fail(f"{what}: accepted ({outcome!r:.300})")


# -- every policy string field ---------------------------------------------------------------------

# (field, policy data with the hostile value). Each reaches an argv, an environment or a path on
# some tier: bwrap's --setenv/--bind/--chdir, QEMU's -fsdev path=, the guest agent, docker.
FIELDS: dict[str, Callable[[str], dict[str, Any]]] = {
    "env.set value": lambda v: {"env": {"allow": ["X"], "set": {"X": "1" + v}}},
    "env.set name": lambda v: {"env": {"allow": ["X" + v], "set": {"X" + v: "1"}}},
    "env.allow": lambda v: {"env": {"allow": ["X" + v]}},
    "env.inherit": lambda v: {"env": {"allow": ["X" + v], "inherit": ["X" + v]}},
    "mounts.source": lambda v: {"mounts": [{"source": "/usr/share" + v, "target": "/m"}]},
    "mounts.target": lambda v: {"mounts": [{"source": "/usr/share", "target": "/m" + v}]},
    "workspace": lambda v: {"workspace": "/workspace" + v},
    "network.allow": lambda v: {"network": {"mode": "egress", "allow": ["example.com" + v]}},
    "services.name": lambda v: {"services": [{"kind": "redis", "name": "r" + v}]},
    "services.version": lambda v: {"services": [{"kind": "redis", "version": "7" + v}]},
    "services.image": lambda v: {"services": [{"kind": "image", "image": "img" + v}]},
    "services.env name": lambda v: {"services": [{"kind": "redis", "env": {"A" + v: "1"}}]},
    "services.env value": lambda v: {"services": [{"kind": "redis", "env": {"A": "1" + v}}]},
    "services.command": lambda v: {
        "services": [{"kind": "image", "image": "i", "command": ["x" + v]}]
    },
    "services.health": lambda v: {"services": [{"kind": "redis", "health": ["x" + v]}]},
    "services.data": lambda v: {"services": [{"kind": "image", "image": "i", "data": "/d" + v}]},
    "deps.allow": lambda v: {"deps": {"allow": ["pkg" + v]}},
    "deps.deny": lambda v: {"deps": {"deny": ["pkg" + v]}},
    "deps.groups": lambda v: {"deps": {"groups": ["test" + v]}},
    "deps.approved": lambda v: {"deps": {"approved": "/tmp/approved" + v}},
}
VERBATIM = {"env.set value", "services.env value", "services.command", "services.health"}
"""Values a job receives as they are: a newline is legitimate there (a script, a certificate)."""


def test_nul_in_every_policy_field(sandbox: Driver, marker: Path) -> None:
    """Every field refuses a NUL (and, but for verbatim values, a newline or an escape) when the
    policy is read; a spec that skipped validation (model_copy, model_construct) is refused by
    admission on this tier before anything starts."""
    for field, make in FIELDS.items():
        values = [ESCAPE, "\0"] + ([] if field in VERBATIM else ["\n--share-net", "\x1b]0;x\x07"])
        for value in values:
            with pytest.raises(PolicyError) as caught:
                SandboxSpec.from_dict({"tier": sandbox.spec_tier, **make(value)})
            assert "\0" not in str(caught.value) and "\x1b" not in str(caught.value), caught.value
            if field in VERBATIM:  # a value (a secret, say) is never repeated in the error
                assert "share-net" not in str(caught.value), caught.value
    # Past the validators: the strings bwrap and QEMU would have been given.
    base = sandbox.spec()
    bypass = {
        "env.set value": {"env": base.env.model_construct(allow=["X"], set={"X": "1" + ESCAPE})},
        "env.set name": {
            "env": base.env.model_construct(allow=["X" + ESCAPE], set={"X" + ESCAPE: "1"})
        },
        "workspace": {"workspace": "/workspace" + ESCAPE},
    }
    for field, update in bypass.items():
        spec = base.model_copy(update=update)
        attack = Attack(wasi=["print", "ran"], python="print('ran')", shell=probe_shell(marker))
        refused(lambda: sandbox.run(attack, spec=spec), PolicyViolation, marker, field)  # noqa: B023
    # What stays allowed: a verbatim value with a newline reaches the job whole.
    newline_value_arrives_whole(sandbox, marker)


def test_nul_policy_on_the_command_line(sandbox: Driver, tmp_path: Path) -> None:
    """The issue's policy file: `policy check` and `run` refuse it with one line, exit 2."""
    policy = tmp_path / "escape.toml"
    policy.write_text(
        '[env]\nallow = ["X"]\n'
        'set = { X = "1\\u0000--share-net\\u0000--ro-bind\\u0000/\\u0000/tmp/hostroot" }\n'
    )
    for args in (
        ["policy", "check", str(policy)],
        ["run", "--tier", sandbox.spec_tier, "--policy", str(policy), "--", "true"],
    ):
        cli = hybrid_cli(args)
        out, err = cli.communicate(timeout=120)
        lines = err.decode().strip().splitlines()
        assert cli.returncode == 2, (args, out, err)
        assert len(lines) == 1 and "NUL" in lines[0] and "Traceback" not in lines[0], lines


def newline_value_arrives_whole(sandbox: Driver, marker: Path) -> None:
    """A newline and a tab in an env.set value are the job's data: they arrive whole, as one
    variable, and add no option (the value looks like options on purpose)."""
    value = "line one\n--share-net\t--ro-bind / /tmp/hostroot"
    spec = SandboxSpec.from_dict(
        {
            "tier": sandbox.spec_tier,
            "budget": sandbox.budget(wall_seconds=20).model_dump(exclude_unset=True),
            "env": {"allow": ["X"], "set": {"X": value}},
        }
    )
    if isinstance(sandbox, WorkstationDriver):
        with sandbox.backend.create(spec) as ws:
            result = ws.exec(["/bin/sh", "-c", 'printf %s "$X"; echo; ' + probe_shell(marker)])
    elif sandbox.kind in ("wasi", "python"):
        # No command line here: admitted, and the run is the tier's ordinary one.
        result = sandbox.run(Attack(wasi=["print", "ok"], python="print('ok')"), spec=spec)
        assert result.ok, result
        return
    else:
        attack = Attack(shell='printf %s "$X"; echo; ' + probe_shell(marker))
        result = sandbox.run(attack, spec=spec)
    assert result.ok, result
    assert result.stdout.startswith(value + "\n"), result.stdout[:300]
    no_escape(result, marker)


# -- every library argument that reaches an argv ---------------------------------------------------


def _workstation(sandbox: Driver) -> Any:
    """A workstation of the driver's tier that allows X in its environment (the session's shared
    one, which is not closed here, for the workstation driver)."""
    if isinstance(sandbox, WorkstationDriver):
        return contextlib.nullcontext(sandbox.ws)
    backend = tiers.get(sandbox.spec_tier).backend()
    assert backend is not None
    spec = sandbox.spec(wall_seconds=20)
    return backend.create(spec.model_copy(update={"env": Environment(allow=["X"])}))


def test_nul_in_library_arguments(sandbox: Driver, marker: Path, tmp_path: Path) -> None:
    """run/exec/put/get/create arguments with a NUL (or a control character in a workdir or an
    image) raise InvalidInput at the tier boundary; nothing runs, nothing escapes."""
    shell = probe_shell(marker)
    if sandbox.kind == "wasi":
        from hybrid.wasm import run

        module = sandbox.module_path(Attack(wasi=["print", "x"]))  # type: ignore[attr-defined]
        for args in (["print", "a" + ESCAPE], ["print", "ok", "\0"]):
            refused(lambda: run(module, args), InvalidInput, marker, f"wasm args {args!r}")  # noqa: B023
        return
    if sandbox.kind == "python":
        from hybrid.wasm.python import run_python

        for name in ("a" + ESCAPE, "x\ny.py"):
            refused(
                lambda: run_python("print(1)", files={name: b"x"}),  # noqa: B023
                InvalidInput,
                marker,
                f"input file {name!r}",
            )
        return
    from hybrid import router

    job = router.Job(command=["/bin/sh", "-c", shell, "x" + ESCAPE], needs_processes=True)
    refused(lambda: router.run(job, sandbox.spec_tier), InvalidInput, marker, "job command")
    job = router.Job(command=["true"], needs_processes=True, image="img\0--share-net")
    refused(lambda: router.run(job, sandbox.spec_tier), InvalidInput, marker, "job image")
    if not isinstance(sandbox, WorkstationDriver):
        backend = tiers.get(sandbox.spec_tier).backend()
        assert backend is not None
        for image in ("img" + ESCAPE, "-v/:/host"):
            if sandbox.spec_tier == "microvm":
                continue  # takes no image at all (InvalidInput for any)
            refused(
                lambda: backend.create(sandbox.spec(), image=image),  # noqa: B023
                InvalidInput,
                marker,
                f"create image {image!r}",
            )
    with _workstation(sandbox) as ws:
        source = tmp_path / "file"
        source.write_text("x")
        attempts: dict[str, Callable[[], Any]] = {
            "exec argv": lambda: ws.exec(["/bin/sh", "-c", shell, "a" + ESCAPE]),
            "exec shell string": lambda: ws.exec(shell + ESCAPE),
            "exec workdir NUL": lambda: ws.exec(["/bin/sh", "-c", shell], workdir="d" + ESCAPE),
            "exec workdir newline": lambda: ws.exec(["true"], workdir="d\n--share-net"),
            "exec env value": lambda: ws.exec(["true"], env={"X": "1" + ESCAPE}),
            "exec env name": lambda: ws.exec(["true"], env={"X" + ESCAPE: "1"}),
            "exec env name with =": lambda: ws.exec(["true"], env={"PATH=/tmp:": "1"}),
            "put dest": lambda: ws.put(b"x", "f" + ESCAPE),
            "put source": lambda: ws.put(Path(f"{source}\0--share-net"), "f"),
            "get path": lambda: ws.get("f" + ESCAPE),
            "get dest": lambda: ws.get("f", Path(f"{tmp_path}\0x")),
        }
        for what, attempt in attempts.items():
            refused(attempt, InvalidInput, marker, what)
        # The workstation still works, and its honest job sees only lo.
        result = ws.exec(["/bin/sh", "-c", shell])
        no_escape(result, marker)
        assert result.ok, result
