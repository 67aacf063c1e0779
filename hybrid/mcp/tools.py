"""What each MCP tool does, as plain library calls (no MCP types here).

Each method takes the ``Call`` it serves (its session, and where long output goes) and returns
a pydantic model or plain data that becomes the one JSON text result; a ``HybridError`` becomes
an error result. Host paths go through the server's ``Scope``; runs get its spec, admitted.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from hybrid.errors import InvalidInput
from hybrid.mcp.scope import Scope
from hybrid.mcp.sessions import Workstations
from hybrid.paths import display
from hybrid.repofs import Refused, read_file

Say = Callable[[str, str], None]
"""say(logger, text): one log notification (logger ``stdout``, ``stderr`` or ``progress``)."""

CHECKS = ("csv", "json", "grep", "redact", "scope")
OPTIONS = {
    "csv": ("require", "types", "delimiter", "allow_empty"),
    "json": ("schema", "max_errors"),
    "grep": ("ignore_case", "context", "max_matches", "globs"),
    "redact": ("literals", "max_bytes", "entropy", "label"),
    "scope": ("allow", "deny", "allow_lockfiles", "default_deny"),
}
"""The options each check takes (the library function's keyword arguments, budget excepted)."""
CheckName = Literal["csv", "json", "grep", "redact", "scope"]
ContainerTier = Literal["docker", "gvisor"]


@dataclass(frozen=True)
class Call:
    """One tool call: the session it belongs to and its log channel."""

    session: object
    say: Say


class Toolbox:
    """Every tool of the server over one scope, one workstation registry and (for solve) one model."""

    def __init__(self, scope: Scope, workstations: Workstations, model: Any = None) -> None:
        self.scope = scope
        self.workstations = workstations
        self.model = model

    # -- context ------------------------------------------------------------------------------

    def repo_map(self, call: Call, root: str, task: str, tokens: int) -> Any:
        from hybrid.context import repo_map

        path = self.scope.path(root, "root", "dir")
        return repo_map(path, task, tokens, progress=_indexed(call))

    def context_pack(self, call: Call, root: str, task: str, tokens: int) -> Any:
        from hybrid.context import context_pack

        path = self.scope.path(root, "root", "dir")
        return context_pack(path, task, tokens, progress=_indexed(call))

    def skeleton(self, call: Call, path: str) -> dict[str, str]:
        from hybrid.context.languages import language_for
        from hybrid.context.skeletons import skeleton_source

        file = self.scope.path(path, "file", "file")
        lang = language_for(file.name)
        if lang is None:
            raise InvalidInput(f"{path}: unsupported file type")
        # Read again from the root it lies in without following a link: the file checked
        # above may have been swapped for a link or a FIFO since.
        root = next(r for r in self.scope.roots if file == r or r in file.parents)
        try:
            source = read_file(root, file.relative_to(root).as_posix())
        except Refused as exc:
            raise InvalidInput(f"{display(path)}: {exc.reason}") from None
        return {"path": str(file), "skeleton": skeleton_source(source, lang)}

    # -- runs in WebAssembly -------------------------------------------------------------------

    def run_python(
        self,
        call: Call,
        source: str,
        tests: str | None,
        files: dict[str, str] | None,
        timeout_seconds: float | None,
    ) -> Any:
        from hybrid.wasm.python import run_python

        spec = self.scope.spec_for("python-wasm", timeout_seconds)
        inputs = {name: text.encode() for name, text in (files or {}).items()}
        return run_python(source, tests, files=inputs or None, spec=spec)

    def run_check(
        self,
        call: Call,
        check: str,
        text: str | None,
        path: str | None,
        pattern: str | None,
        options: dict[str, Any],
    ) -> Any:
        from hybrid import checks

        if check not in CHECKS:
            raise InvalidInput(f"check {check!r}: one of {', '.join(CHECKS)}")
        unknown = sorted(set(options) - set(OPTIONS[check]))
        if unknown:
            raise InvalidInput(
                f"{check}: unknown option {unknown[0]!r} (takes {', '.join(OPTIONS[check])})"
            )
        if "schema" in options and not isinstance(options["schema"], dict):
            # A string would name a host file: schemas come inline here.
            raise InvalidInput("json: schema must be an object (the schema itself)")
        # A policy names the budget of the wasm tier; without one the checks' own default.
        budget = self.scope.spec_for("wasm").budget if self.scope.spec is not None else None
        if check == "grep":
            if pattern is None or text is not None:
                raise InvalidInput("grep takes a pattern and a path (a file or directory)")
            where = self.scope.path(path or ".", "path")
            return checks.grep(pattern, where, budget=budget, **options)
        if (text is None) == (path is None):
            raise InvalidInput(f"{check} takes the data as text or as a path, exactly one")
        data: Any = text if text is not None else self.scope.path(path or "", "path", "file")
        runners: dict[str, Callable[..., Any]] = {
            "csv": checks.check_csv,
            "json": checks.check_json,
            "redact": checks.redact,
            "scope": checks.scope,
        }
        return runners[check](data, budget=budget, **options)

    # -- workstations --------------------------------------------------------------------------

    def ws_create(
        self,
        call: Call,
        repo: str | None,
        tier: ContainerTier | None,
        from_snapshot: str | None,
        timeout_seconds: float | None,
    ) -> Any:
        from hybrid.workstation.base import snapshots_of

        tier = tier or self._container_tier()
        spec = self.scope.spec_for(tier, timeout_seconds)
        name = self.workstations.new_name()
        if from_snapshot is not None:
            if repo is not None:
                raise InvalidInput("from_snapshot starts from a snapshot; it takes no repo")
            self.workstations.check_snapshot(call.session, from_snapshot)
            made = snapshots_of(self.workstations.backend).start(
                from_snapshot, spec=spec, name=name
            )
        else:
            where = self.scope.path(repo, "repo", "dir") if repo is not None else None
            call.say("progress", f"starting a {tier} workstation")
            made = self.workstations.backend.create(spec, repo=where, name=name)
        self.workstations.add(call.session, made)
        return made.info()

    def _container_tier(self) -> ContainerTier:
        tier = self.scope.spec.tier if self.scope.spec is not None else "docker"
        return "gvisor" if tier == "gvisor" else "docker"

    def ws_exec(
        self,
        call: Call,
        workstation: str,
        command: str | list[str],
        timeout_seconds: float | None,
        workdir: str | None,
    ) -> Any:
        ws = self.workstations.get(call.session, workstation)
        if timeout_seconds is not None:
            # Within the workstation's own budget, which came from the policy.
            self.scope.spec_for(ws.tier, timeout_seconds)

        def live(kind: str, chunk: bytes) -> None:
            call.say(kind, chunk.decode("utf-8", "replace"))

        return ws.exec(command, timeout=timeout_seconds, workdir=workdir, on_output=live)

    def ws_read_file(self, call: Call, workstation: str, path: str) -> dict[str, Any]:
        ws = self.workstations.get(call.session, workstation)
        data = ws.get(path)
        assert data is not None  # no dest: the bytes come back
        limit = ws.spec.budget.output_bytes
        kept = data[:limit]
        try:
            content, encoding = kept.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            content, encoding = base64.b64encode(kept).decode(), "base64"
        return {
            "path": path,
            "bytes": len(data),
            "encoding": encoding,
            "content": content,
            "truncated": len(data) > limit,
        }

    def ws_write_file(
        self,
        call: Call,
        workstation: str,
        path: str,
        content: str,
        encoding: Literal["utf-8", "base64"],
    ) -> dict[str, Any]:
        ws = self.workstations.get(call.session, workstation)
        if encoding == "base64":
            try:
                data = base64.b64decode(content, validate=True)
            except ValueError:
                raise InvalidInput("content is not valid base64") from None
        else:
            data = content.encode()
        ws.put(data, path)
        return {"path": path, "bytes": len(data)}

    def ws_diff(self, call: Call, workstation: str) -> dict[str, str]:
        ws = self.workstations.get(call.session, workstation)
        return {"workstation": workstation, "diff": ws.diff()}

    def ws_snapshot(self, call: Call, workstation: str) -> Any:
        from hybrid.workstation.base import snapshotting

        ws = snapshotting(self.workstations.get(call.session, workstation))
        name = self.workstations.new_name("mcp-snap")
        self.workstations.add_snapshot(call.session, name)
        call.say("progress", f"committing {workstation} as {name}")
        return ws.snapshot(name)

    def ws_destroy(self, call: Call, workstation: str) -> dict[str, str]:
        self.workstations.remove(call.session, workstation)
        return {"removed": workstation}

    # -- the loop --------------------------------------------------------------------------------

    def gate_patch(
        self,
        call: Call,
        patch: str,
        repo: str,
        test: str,
        regression: str | None,
        allow: list[str],
        deny: list[str],
    ) -> Any:
        from hybrid.agent.gate import gate
        from hybrid.checks import scope

        where = self.scope.path(repo, "repo", "dir")
        if patch.strip():  # an empty patch is a verdict (blocked), not bad input
            scope(patch)  # a patch that does not parse is bad input, not a blocked gate
        return gate(
            patch,
            where,
            test=test,
            regression=regression,
            allow=allow,
            deny=deny,
            spec=self.scope.spec_for(self._container_tier()),
            progress=lambda m: call.say("progress", m),
        )

    def solve(
        self,
        call: Call,
        task: str,
        tests: str | None,
        repo: str | None,
        test: str | None,
        steps: int,
        k: int,
    ) -> Any:
        from hybrid.agent.limits import LoopBudget
        from hybrid.agent.loop import FunctionTask, RepoTask, solve

        if self.model is None:
            raise InvalidInput(
                "solve needs a model: start the server with --model, --model-config, "
                "--replay or --answer"
            )
        if (tests is None) == (repo is None):
            raise InvalidInput(
                "solve takes tests (a function task) or repo and test (a repository task)"
            )
        goal: FunctionTask | RepoTask
        if repo is not None:
            if not test:
                raise InvalidInput("a repository task needs a test command (test)")
            goal = RepoTask(task=task, repo=self.scope.path(repo, "repo", "dir"), test=test)
            spec = self.scope.spec_for(self._container_tier())
        else:
            goal = FunctionTask(prompt=task, tests=tests or "")
            spec = self.scope.spec_for("python-wasm")
        try:
            budget = LoopBudget(steps=steps)
        except ValueError as exc:
            raise InvalidInput(f"steps: {exc}") from None
        return solve(
            goal,
            self.model,
            budget=budget,
            k=k,
            spec=spec,
            progress=lambda m: call.say("progress", m),
        )


def _indexed(call: Call) -> Callable[[int, int], None]:
    """The index's progress (files done, of how many) as log lines of the call."""
    return lambda done, total: call.say("progress", f"indexed {done}/{total} files")
