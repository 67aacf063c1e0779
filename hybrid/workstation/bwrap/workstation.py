"""Tier ``bwrap``: workstations in bubblewrap namespace sandboxes, no daemon.

Each workstation is a directory under the state directory (``bwrap/NAME``): ``meta.json`` (the
spec with ``env.set`` values redacted, owner, image), ``env.json`` (those values, 0600),
``baseline.git`` (what went in, for ``diff``) and ``workspace/``, a size-capped tmpfs the
sandbox sees at ``spec.workspace``. Its cgroup (cgroups.py) holds every process of every exec;
each exec is its own bwrap (sandbox.py) with its own pid namespace. No snapshots (the backend
lacks the ``Snapshots`` capability).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import secrets
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Self

from hybrid import owner
from hybrid.errors import InvalidInput, PolicyViolation, WorkstationError, WorkstationNotFound
from hybrid.paths import state_dir
from hybrid.policy import SandboxSpec, admit
from hybrid.results import ExecutionResult, Termination, Usage
from hybrid.workstation import archive, disk, homes, jobuser, state
from hybrid.workstation.base import (
    AttachCommand,
    GcReport,
    OutputCallback,
    WorkstationInfo,
    check_image,
    check_name,
    check_transfer,
    exec_args,
)
from hybrid.workstation.baseline import Baseline
from hybrid.workstation.bwrap import cgroups, rootfs, sandbox, workspace
from hybrid.workstation.egress import EgressEvent

TIER = "bwrap"
_OWNER = (sandbox.SANDBOX_UID, sandbox.SANDBOX_GID)


def _root() -> Path:
    return state_dir("bwrap")


class BwrapWorkstation:
    """A workspace and a cgroup; every exec is a fresh bubblewrap sandbox over them."""

    def __init__(self, home: Path) -> None:
        try:
            meta = json.loads((home / "meta.json").read_text())
        except (OSError, ValueError):
            raise WorkstationNotFound(f"no workstation named {home.name}") from None
        self._home = home
        self.workspace_dir = Path(meta["workspace"])
        self._staged: list[str] = meta["staged"]
        self.name: str = meta["name"]
        self.id: str = meta["id"]
        self.spec = state.with_values(
            SandboxSpec.model_validate(meta["spec"]), state.load_env(home)
        )
        self.tier = TIER
        self.persistent: bool = meta["persistent"]
        self.image: str = meta["image"]
        self._root_path = Path(meta["root"])
        self._created: str = meta["created"]
        self._running: set[subprocess.Popen[bytes]] = set()
        self._closed = False

    # -- running commands -------------------------------------------------------------------

    def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        on_output: OutputCallback | None = None,
    ) -> ExecutionResult:
        """Run ``cmd`` (a shell string or an argv); the deadline kills its whole pid namespace."""
        argv = exec_args(cmd, env, workdir)
        jobuser.check()  # a host account made since create() would share the jobs' uid
        self._live()
        deadline = timeout if timeout is not None else self.spec.budget.wall_seconds
        cwd = str(
            PurePosixPath(
                self.spec.workspace, workspace.relative(self.spec.workspace, workdir or ".")
            )
        )
        group = self._group()
        oom_before = group.oom_kills()
        outcome = sandbox.run(
            self._plan(cwd, self._environment(env)),
            argv,
            group,
            deadline=deadline,
            limit=self.spec.budget.output_bytes,
            on_output=on_output,
            running=self._running,
        )
        return self._result(outcome, deadline, group.oom_kills() > oom_before)

    def _result(self, outcome: sandbox.Outcome, deadline: float, oom: bool) -> ExecutionResult:
        code = outcome.returncode
        exit_code: int | None = None
        if outcome.timed_out:
            termination = Termination.TIMEOUT
            detail = f"wall-clock deadline of {deadline:g}s reached; every process was killed"
        elif oom and (code is None or code < 0 or code == 137):
            termination = Termination.OUT_OF_MEMORY
            detail = f"memory cap of {self.spec.budget.memory} bytes reached"
        elif code is None or code < 0:
            termination, detail = (
                Termination.ERROR,
                f"the sandbox was killed (signal {-(code or 0)})",
            )
        elif code == 0:
            termination, exit_code, detail = Termination.OK, 0, ""
        else:
            termination, exit_code, detail = Termination.NONZERO_EXIT, code, f"exit status {code}"
            termination, detail = disk.classify(
                str(self.workspace_dir),
                self.spec.budget.disk_for(TIER),
                termination,
                detail,
                outcome.stderr,
            )
        limit = self.spec.budget.output_bytes
        if termination in (Termination.OK, Termination.NONZERO_EXIT) and any(outcome.cut.values()):
            termination, detail = Termination.OUTPUT_LIMIT, f"output over {limit} bytes was cut"
        return ExecutionResult(
            tier=TIER,
            termination=termination,
            exit_code=exit_code,
            stdout=outcome.stdout.decode("utf-8", errors="replace"),
            stderr=outcome.stderr.decode("utf-8", errors="replace"),
            stdout_truncated=outcome.cut["stdout"],
            stderr_truncated=outcome.cut["stderr"],
            usage=Usage(wall_ms=outcome.wall_ms),
            detail=detail,
        )

    def _environment(self, extra: dict[str, str] | None) -> dict[str, str]:
        environment = {"PATH": sandbox.BASE_PATH, "HOME": "/tmp", "LANG": "C.UTF-8"}
        environment.update(self.spec.env.resolve())
        refused = sorted(set(extra or {}) - set(self.spec.env.allow))
        if refused:
            raise PolicyViolation(
                [f"env: {name} is not on the allow-list (env.allow)" for name in refused]
            )
        environment.update(extra or {})
        return environment

    def _plan(self, cwd: str, env: dict[str, str]) -> sandbox.Plan:
        return sandbox.Plan(
            root=rootfs.Root(self._root_path, self.image),
            workspace=self.workspace_dir,
            workspace_target=self.spec.workspace,
            cwd=cwd,
            env=env,
            memory=self.spec.budget.memory,
            mounts=[
                (Path(staged), m.target, m.mode == "rw")
                for staged, m in zip(self._staged, self.spec.mounts, strict=True)
            ],
        )

    def _group(self) -> cgroups.Group:
        return cgroups.Group(cgroups.PREFIX + self.id)

    # -- files ------------------------------------------------------------------------------

    def put(self, source: Path | bytes, dest: str) -> None:
        """Copy a host file or directory (or bytes, as a file) to ``dest`` in the workspace."""
        check_transfer(dest, source)
        self._live()
        rel = workspace.relative(self.spec.workspace, dest)
        if not rel.parts:
            raise InvalidInput(f"{dest}: name a file or directory inside the workspace")
        if not isinstance(source, bytes) and not Path(source).exists():
            raise InvalidInput(f"{source}: no such file or directory")
        parent = workspace.open_dir(self.workspace_dir, rel.parts[:-1], _OWNER)
        try:
            if isinstance(source, bytes):
                workspace.write_bytes(parent, rel.name, source, _OWNER)
            else:
                workspace.copy_tree(Path(source), parent, rel.name, _OWNER)
        finally:
            os.close(parent)

    def get(self, path: str, dest: Path | None = None) -> bytes | None:
        """A file's bytes, or with ``dest`` copy a file or directory into that host directory."""
        check_transfer(path, dest)
        self._live()
        rel = workspace.relative(self.spec.workspace, path)
        parts = rel.parts or ()
        parent = workspace.open_dir(self.workspace_dir, parts[:-1])
        name = parts[-1] if parts else "."
        try:
            items = workspace.entries(parent, name)
            try:
                first = next(items)
            except FileNotFoundError:
                raise WorkstationError(f"{path}: no such file in workstation {self.name}") from None
            if dest is None:
                if first.kind != "file":
                    raise InvalidInput(
                        f"{path}: not a regular file (pass dest= to copy a directory)"
                    )
                data = os.pread(first.fd, first.size, 0)
                items.close()
                return data
            label = PurePosixPath(self.spec.workspace).name if name == "." else name

            def chained() -> archive.Iterator[archive.HostEntry]:
                yield first
                yield from items

            with tempfile.TemporaryFile() as spool:
                workspace.tar_of(chained(), label, spool)
                archive.extract(spool, Path(dest), f"copy {path} out of {self.name}")
            return None
        finally:
            os.close(parent)

    def copy_repo(self, repo: Path) -> None:
        """Copy a repository's working tree in (as every backend selects it) and record it."""
        if not Path(repo).is_dir():
            raise InvalidInput(f"{repo}: not a directory")
        recorder = self._baseline().recorder()
        with tempfile.TemporaryFile() as buffer:
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                entries = archive.walk(Path(repo), archive.repo_selection(Path(repo)))
                later = archive.pack(tar, entries, "", _OWNER, recorder)
                for entry in later:  # relative symlinks that climb out: kept as they are
                    info = tarfile.TarInfo(entry.path)
                    info.type, info.linkname = tarfile.SYMTYPE, entry.target
                    info.uid, info.gid = _OWNER
                    tar.addfile(info)
            buffer.seek(0)
            # Our own archive of the host's files into a fresh workspace no sandbox has run in:
            # nothing there to write through, and every symlink is carried as it is (absolute
            # ones included), owned by the sandbox user.
            with tarfile.open(fileobj=buffer, mode="r:") as tar:
                tar.extractall(self.workspace_dir, filter="fully_trusted", numeric_owner=True)
        recorder.commit()

    def diff(self) -> str:
        """Unified diff (git format, binary-safe) of every change since the repository went in."""
        self._live()
        with tempfile.TemporaryFile() as spool:
            items = archive.walk(self.workspace_dir, archive.Everything())
            workspace.tar_of(items, "workspace", spool)
            patch = self._baseline().diff(spool)
        return patch.decode("utf-8", errors="surrogateescape")

    # -- state ------------------------------------------------------------------------------

    def info(self) -> WorkstationInfo:
        return WorkstationInfo(
            name=self.name,
            id=self.id,
            tier=TIER,
            runtime="bwrap",
            image=self.image,
            status="running"
            if self._running
            else ("created" if self._home.is_dir() else "removed"),
            created=self._created,
            persistent=self.persistent,
        )

    def egress_log(self) -> list[EgressEvent]:
        """None to show: a bwrap workstation has no network at all."""
        raise InvalidInput(f"{self.name} has network mode none: nothing leaves it, no log")

    def attach_command(self, program: str = "/bin/bash", *, tty: bool = True) -> AttachCommand:
        """`hybrid ws exec` with the program: the same sandbox, limits and policy as any exec."""
        import sys

        argv = [sys.executable, "-m", "hybrid", "ws", "exec", self.name, "--", program]
        return AttachCommand(argv, {})

    def stop(self) -> None:
        """Kill every process of every exec (this client's or another's); the files stay."""
        for child in list(self._running):
            sandbox.kill_tree(child)
        with contextlib.suppress(Exception):
            self._group().kill()

    def remove(self) -> None:
        """Delete the workstation: its processes, cgroup and workspace."""
        self.stop()
        with contextlib.suppress(Exception):
            self._group().remove()
        workspace.drop(self._home, [*self._staged, str(self.workspace_dir)])
        self._closed = True

    def close(self) -> None:
        """Remove it unless it is persistent; idempotent."""
        if self._closed:
            return
        if self.persistent:
            self.stop()
            self._closed = True
        else:
            self.remove()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<BwrapWorkstation {self.name}>"

    # -- helpers ----------------------------------------------------------------------------

    def _baseline(self) -> Baseline:
        return Baseline(self._home / "baseline.git")

    def _live(self) -> None:
        if not (self._home / "meta.json").is_file():
            raise WorkstationNotFound(f"workstation {self.name} was removed")


class BwrapBackend:
    """Makes, finds and cleans up bwrap workstations."""

    def create(
        self,
        spec: SandboxSpec | None = None,
        *,
        image: str | None = None,
        repo: Path | None = None,
        name: str | None = None,
        persistent: bool = False,
        lifetime: float | None = None,
    ) -> BwrapWorkstation:
        """A new workstation: a workspace (with ``repo`` copied in) and a limited cgroup.

        ``image``: the toolchain root (default the base image, exported once; ``host`` for the
        host's own /usr). ``lifetime`` needs nothing here: every process dies with its client.
        """
        check_image(image)
        jobuser.check()
        spec = (spec or SandboxSpec(tier=TIER)).model_copy(update={"tier": TIER})
        violations = admit(spec, TIER)
        if violations:
            raise PolicyViolation(violations)
        name = check_name(name or f"ws-{secrets.token_hex(4)}")
        root = rootfs.prepare(image)
        home = homes.make(_root(), name)
        ident = secrets.token_hex(8)
        where = workspace.base() / "ws" / ident
        staged = [f"{where}.m{i}" for i in range(len(spec.mounts))]
        group: cgroups.Group | None = None
        try:
            redacted, values = state.split_env(spec)
            meta = {
                "name": name,
                "id": ident,
                "spec": redacted.model_dump(mode="json"),
                "persistent": persistent,
                "created": datetime.now(UTC).isoformat(),
                "owner": owner.mark(),
                "image": root.image,
                "root": str(root.path),
                "workspace": str(where),
                "staged": staged,
            }
            # Written first: whatever a killed create leaves, gc finds through it.
            homes.write_meta(home, meta)
            if values:
                state.save_env(home, values)
            where.mkdir(mode=0o755)
            workspace.mount(where, spec.budget.disk_for(TIER), *_OWNER)
            for mount, target in zip(spec.mounts, staged, strict=True):
                workspace.bind(mount.source, Path(target), mount.mode == "rw")
            b = spec.budget
            group = cgroups.Group.create(cgroups.PREFIX + ident, b.memory, b.pids, b.cpus)
            made = BwrapWorkstation(home)
            if repo is not None:
                made.copy_repo(repo)
        except BaseException:
            if group is not None:
                group.remove()
            workspace.drop(home, [*staged, str(where)])
            raise
        return made

    def open(self, name: str) -> BwrapWorkstation:
        return BwrapWorkstation(homes.find(_root(), name))

    def list(self) -> builtins.list[WorkstationInfo]:
        found = []
        for home in sorted(_root().iterdir()):
            with contextlib.suppress(WorkstationNotFound):
                found.append(BwrapWorkstation(home).info())
        return found

    def reap(self) -> GcReport:
        """Remove non-persistent workstations whose creating process is gone, and their cgroups."""
        return self.gc()

    def gc(self, everything: bool = False) -> GcReport:
        report = GcReport()
        kept: set[str] = set()
        for home in sorted(_root().iterdir()):
            try:
                meta = homes.read_meta(home)
                dead = not owner.mark_alive(meta["owner"])
            except (OSError, ValueError, KeyError):
                # No meta yet: a create in progress, or one killed before it wrote any.
                if time.time() - home.stat().st_mtime < 60:
                    continue
                meta, dead = {"name": home.name, "persistent": False, "id": ""}, True
            if everything or (dead and not meta["persistent"]):
                if meta["id"]:
                    with contextlib.suppress(Exception):
                        cgroups.Group(cgroups.PREFIX + meta["id"]).remove()
                workspace.drop(home, [*meta.get("staged", []), meta.get("workspace", "")])
                report.containers.append(meta["name"])
            else:
                kept.add(cgroups.PREFIX + meta["id"])
        for group_name in cgroups.existing():
            if group_name not in kept and (everything or _orphaned(group_name)):
                with contextlib.suppress(Exception):
                    cgroups.Group(group_name).remove()
        return report


def _orphaned(group_name: str) -> bool:
    """A cgroup no workstation directory names (its create was killed half-way) and that is idle."""
    ident = group_name.removeprefix(cgroups.PREFIX)
    for home in _root().iterdir():
        with contextlib.suppress(OSError, ValueError):
            if json.loads((home / "meta.json").read_text()).get("id") == ident:
                return False
    return not cgroups.Group(group_name).pids()
