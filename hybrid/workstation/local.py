"""A directory-backed workstation whose commands run as plain host subprocesses.

NOT A SANDBOX. Commands run as the calling user, with the host's filesystem, network and
processes in reach; only the wall deadline (the whole process group is killed) and the output
budget are enforced. It exists for tests where the engine is not the subject (like SWE-ReX's
dummy deployment or httpx's mock transport) and for the workstation contract's conformance
suite. Neither the router nor ``hybrid.workstation.backend()`` ever picks it: only
``backend("local")`` or ``LocalBackend()`` does. It has no snapshots (no ``Snapshots``
capability).

Each workstation is a directory under the state directory (``local/NAME``): ``workspace/``
(what the workspace path maps to), ``baseline.git`` (what the repository copy put in, for
``diff``) and ``meta.json``.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import secrets
import shutil
import signal
import subprocess
import tarfile
import threading
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
from hybrid.results import ExecutionResult, Termination, Usage, finish_result
from hybrid.workstation import archive, homes
from hybrid.workstation.base import (
    AttachCommand,
    GcReport,
    OutputCallback,
    WorkstationInfo,
    check_transfer,
    exec_args,
)
from hybrid.workstation.baseline import Baseline
from hybrid.workstation.egress import EgressEvent

TIER = "local"
"""What a local workstation reports as its tier; not a registered tier, so never routed to."""


def _root() -> Path:
    return state_dir("local")


class LocalWorkstation:
    """A workspace directory on the host; see the module docstring (not a sandbox)."""

    def __init__(self, home: Path) -> None:
        meta = homes.read_meta(home)
        self._home = home
        self._meta = meta
        self.workspace_dir = home / "workspace"
        self.name: str = meta["name"]
        self.id: str = meta["id"]
        self.spec = SandboxSpec.model_validate(meta["spec"])
        self.tier = TIER
        self.persistent: bool = meta["persistent"]
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
        """Run ``cmd`` (a shell string or an argv) in the workspace; the deadline kills its group."""
        argv = exec_args(cmd, env, workdir)
        self._live()
        deadline = timeout if timeout is not None else self.spec.budget.wall_seconds
        cwd = self._host(workdir or self.spec.workspace)
        environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd)}
        environment.update(self.spec.env.resolve())
        refused = sorted(set(env or {}) - set(self.spec.env.allow))
        if refused:
            raise PolicyViolation(
                [f"env: {name} is not on the allow-list (env.allow)" for name in refused]
            )
        environment.update(env or {})
        limit = self.spec.budget.output_bytes
        start = time.monotonic()
        try:
            child = subprocess.Popen(
                argv,
                cwd=cwd,
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # one process group: the deadline kills all of it
            )
        except OSError as exc:
            return ExecutionResult(
                tier=TIER,
                termination=Termination.NONZERO_EXIT,
                exit_code=127,
                stderr=f"{argv[0]}: {exc.strerror}\n",
                usage=Usage(wall_ms=0.0),
                detail="exit status 127",
            )
        self._running.add(child)
        kept = {"stdout": bytearray(), "stderr": bytearray()}
        cut = {"stdout": False, "stderr": False}
        lock = threading.Lock()

        def pump(kind: str, pipe: io.BufferedReader) -> None:
            for chunk in iter(lambda: pipe.read1(65536), b""):
                with lock:
                    room = limit - len(kept[kind])
                    if len(chunk) > room:
                        cut[kind] = True
                        chunk = chunk[: max(room, 0)]
                    if chunk:
                        kept[kind].extend(chunk)
                        if on_output is not None:
                            on_output(kind, bytes(chunk))

        assert child.stdout is not None and child.stderr is not None
        readers = [
            threading.Thread(target=pump, args=(kind, pipe), daemon=True)
            for kind, pipe in (("stdout", child.stdout), ("stderr", child.stderr))
        ]
        for reader in readers:
            reader.start()
        timed_out = False
        try:
            child.wait(deadline)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(child)
            child.wait()
            for reader in readers:
                reader.join()
            self._running.discard(child)
        wall_ms = (time.monotonic() - start) * 1000
        code = child.returncode
        if timed_out:
            termination, exit_code, detail = (
                Termination.TIMEOUT,
                None,
                f"killed at the {deadline:g} s deadline",
            )
        elif code == 0:
            termination, exit_code, detail = Termination.OK, 0, ""
        elif code < 0:
            termination, exit_code, detail = (
                Termination.ERROR,
                None,
                f"killed by signal {-code}",
            )
        else:
            termination, exit_code, detail = Termination.NONZERO_EXIT, code, f"exit status {code}"
        return finish_result(
            TIER,
            termination,
            exit_code,
            stdout=kept["stdout"],
            stderr=kept["stderr"],
            stdout_truncated=cut["stdout"],
            stderr_truncated=cut["stderr"],
            output_bytes=limit,
            wall_ms=wall_ms,
            detail=detail,
        )

    # -- files ------------------------------------------------------------------------------

    def put(self, source: Path | bytes, dest: str) -> None:
        """Copy a host file or directory (or bytes, as a file) to ``dest`` in the workspace."""
        check_transfer(dest, source)
        self._live()
        target = self._host(dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(source, bytes):
            target.write_bytes(source)
        elif Path(source).is_dir():
            shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
        elif Path(source).is_file():
            shutil.copy2(source, target)
        else:
            raise InvalidInput(f"{source}: no such file or directory")

    def get(self, path: str, dest: Path | None = None) -> bytes | None:
        """A file's bytes, or with ``dest`` copy a file or directory into that host directory."""
        check_transfer(path, dest)
        self._live()
        found = self._host(path)
        if not found.exists():
            raise WorkstationError(f"{path}: no such file in workstation {self.name}")
        if dest is None:
            if not found.is_file() or found.is_symlink():
                raise InvalidInput(f"{path}: not a regular file (pass dest= to copy a directory)")
            return found.read_bytes()
        target = Path(dest) / found.name
        Path(dest).mkdir(parents=True, exist_ok=True)
        if found.is_dir():
            shutil.copytree(found, target, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(found, target, follow_symlinks=False)
        return None

    def copy_repo(self, repo: Path) -> None:
        """Copy a repository's working tree in (as the Docker backend selects it) and record it."""
        if not Path(repo).is_dir():
            raise InvalidInput(f"{repo}: not a directory")
        recorder = self._baseline().recorder()
        with io.BytesIO() as buffer:
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                entries = archive.walk(Path(repo), archive.repo_selection(Path(repo)))
                later = archive.pack(tar, entries, "", (os.getuid(), os.getgid()), recorder)
            buffer.seek(0)
            archive.extract(buffer, self.workspace_dir, f"copy {repo} in")
        for entry in later:  # relative symlinks that climb out: made as they are
            link = self.workspace_dir / entry.path
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(entry.target, link)
        recorder.commit()

    def diff(self) -> str:
        """Unified diff (git format, binary-safe) of every change since the repository went in."""
        self._live()
        with io.BytesIO() as buffer:
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                tar.add(self.workspace_dir, arcname="workspace")
            buffer.seek(0)
            patch = self._baseline().diff(buffer)
        return patch.decode("utf-8", errors="surrogateescape")

    # -- state ------------------------------------------------------------------------------

    def info(self) -> WorkstationInfo:
        return WorkstationInfo(
            name=self.name,
            id=self.id,
            tier=TIER,
            runtime="host",
            image="",
            status="running" if self._home.is_dir() else "removed",
            created=self._created,
            persistent=self.persistent,
        )

    def egress_log(self) -> list[EgressEvent]:
        """None to show: a local workstation never takes egress (create refuses it)."""
        raise InvalidInput(f"{self.name} has network mode none: nothing leaves it, no log")

    def attach_command(self, program: str = "/bin/bash", *, tty: bool = True) -> AttachCommand:
        """A shell in the workspace directory, on the host."""
        return AttachCommand(
            ["/bin/sh", "-c", 'cd "$1" && exec "$2"', "sh", str(self.workspace_dir), program], {}
        )

    def stop(self) -> None:
        """Kill every command still running; the files stay."""
        for child in list(self._running):
            _kill_group(child)

    def remove(self) -> None:
        """Delete the workstation and its workspace."""
        self.stop()
        shutil.rmtree(self._home, ignore_errors=True)
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
        return f"<LocalWorkstation {self.name} (not a sandbox)>"

    # -- helpers ----------------------------------------------------------------------------

    def _baseline(self) -> Baseline:
        return Baseline(self._home / "baseline.git")

    def _live(self) -> None:
        if not self._home.is_dir():
            raise WorkstationNotFound(f"workstation {self.name} was removed")

    def _host(self, path: str) -> Path:
        """The host path of ``path`` (relative to, or inside, the workspace)."""
        workspace = PurePosixPath(self.spec.workspace)
        inside = PurePosixPath(path) if path.startswith("/") else workspace / path
        try:
            relative = inside.relative_to(workspace)
        except ValueError:
            raise InvalidInput(f"{path}: files go into the workspace {workspace}") from None
        if ".." in relative.parts:
            raise InvalidInput(f"{path}: must not contain '..'")
        return self.workspace_dir.joinpath(*relative.parts)


class LocalBackend:
    """Makes, finds and cleans up local workstations (host subprocesses, not a sandbox)."""

    def create(
        self,
        spec: SandboxSpec | None = None,
        *,
        image: str | None = None,
        repo: Path | None = None,
        name: str | None = None,
        persistent: bool = False,
        lifetime: float | None = None,
    ) -> LocalWorkstation:
        """A new local workstation with ``repo`` copied in (no images: ``image`` must be None)."""
        if image is not None:
            raise InvalidInput("the local backend runs on the host: it has no images")
        spec = spec or SandboxSpec()
        violations = admit(spec, "auto")
        if spec.network.mode == "egress":
            violations.append(
                "network: the local backend has no egress proxy (it is not a sandbox); "
                'use mode = "none"'
            )
        if violations:
            raise PolicyViolation(violations)
        name = name or f"ws-{secrets.token_hex(4)}"
        home = homes.make(_root(), name)
        (home / "workspace").mkdir()
        meta = {
            "name": name,
            "id": f"local-{secrets.token_hex(8)}",
            "spec": spec.model_dump(mode="json"),
            "persistent": persistent,
            "created": datetime.now(UTC).isoformat(),
            "owner": owner.mark(),
        }
        homes.write_meta(home, meta)
        made = LocalWorkstation(home)
        if repo is not None:
            try:
                made.copy_repo(repo)
            except BaseException:
                made.remove()
                raise
        return made

    def open(self, name: str) -> LocalWorkstation:
        return LocalWorkstation(homes.find(_root(), name))

    def list(self) -> builtins.list[WorkstationInfo]:
        return [LocalWorkstation(home).info() for home in homes.every(_root())]

    def reap(self) -> GcReport:
        """Remove non-persistent workstations whose creating process is gone."""
        return self.gc()

    def gc(self, everything: bool = False) -> GcReport:
        report = GcReport()
        for home, meta in homes.collectable(_root(), everything):
            shutil.rmtree(home, ignore_errors=True)
            report.containers.append(meta["name"])
        return report


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
