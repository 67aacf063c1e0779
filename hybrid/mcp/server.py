"""The MCP server on the official ``mcp`` SDK: the tools, their sessions, stdio and streamable HTTP.

Agent-client conventions: snake_case verb_noun tools; one JSON text result per call; a
``HybridError`` is an ``isError`` result carrying ``{"error": {"type", "message", "exit_code"}}``
(never a protocol error); long output (a workstation command's stdout and stderr, progress of
the gate and the loop) goes out as log notifications while the call runs.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import warnings
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Annotated, Any, Literal

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.types import CallToolResult, TextContent
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import Field
from pydantic_core import to_json

from hybrid.errors import HybridError
from hybrid.mcp.sessions import STATELESS, Workstations
from hybrid.mcp.tools import Call, CheckName, ContainerTier, Toolbox

# Log notifications are what the issue asks long output to be; SEP-2577 deprecates them in the
# 2026 protocol (where a client opts in per request), but clients of both eras read them.
warnings.filterwarnings("ignore", category=MCPDeprecationWarning, module=__name__)

_SESSION_KEY = "hybrid.session"

# Parameter types shared by several tools (module level: annotations are resolved here).
Text = Annotated[str, Field(description="The file's content (see encoding).")]
Timeout = Annotated[
    float | None, Field(description="Deadline in seconds; at most the server's policy budget.")
]
Ws = Annotated[str, Field(description="A workstation name from ws_create.")]


def _json(value: Any) -> str:
    # pydantic's encoder: models (results, reports, infos), paths and plain data alike.
    return to_json(value).decode()


def error_result(exc: HybridError) -> CallToolResult:
    """A HybridError as the tool's result: isError, with the error as JSON text."""
    error = {"type": type(exc).__name__, "message": exc.message, "exit_code": exc.exit_code}
    return CallToolResult(
        content=[TextContent(type="text", text=_json({"error": error}))], is_error=True
    )


def _session(ctx: Context, workstations: Workstations) -> object:
    """The session a call belongs to: its connection when the protocol has sessions, else the server's.

    Handshake-era connections (stdio, and HTTP with an Mcp-Session-Id) live as long as the
    session; the SDK unwinds their exit stack when it ends, and that removes what it made. The
    2026 protocol has no sessions: its calls share the server's, ended by idle time or shutdown.
    """
    # No public accessor yet (mcp 2.x): the ServerSession holds its Connection privately.
    connection = getattr(ctx.request_context.session, "_connection", None)
    if connection is None or connection.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
        return STATELESS
    if _SESSION_KEY not in connection.state:
        connection.state[_SESSION_KEY] = True

        def ended() -> None:
            # On a thread of its own: removing workstations outlasts the SDK's 5 s bound on
            # exit-stack callbacks; the thread is not a daemon, so the process waits for it.
            threading.Thread(
                target=workstations.end_session, args=(connection,), name="hybrid-mcp-end"
            ).start()

        connection.exit_stack.callback(ended)
    return connection


def _say(ctx: Context) -> Callable[[str, str], None]:
    """A log channel usable from the worker thread a tool's library call runs on."""

    def say(logger: str, text: str) -> None:
        level: Literal["info", "warning"] = "warning" if logger == "stderr" else "info"
        # A client gone mid-call must not fail the run itself.
        with contextlib.suppress(Exception):
            anyio.from_thread.run(partial(ctx.log, level, text, logger_name=logger))

    return say


def build_server(toolbox: Toolbox, *, name: str = "hybrid") -> MCPServer:
    """An MCPServer exposing ``toolbox``'s tools; its lifespan removes every workstation at the end."""

    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[Toolbox]:
        toolbox.workstations.start_reaper()
        try:
            yield toolbox
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(toolbox.workstations.close)

    server: MCPServer = MCPServer(
        name,
        instructions=(
            "Real-file repository context (repo_map, context_pack, skeleton), Python and checks "
            "in WebAssembly (run_python, run_check), hardened container workstations "
            "(ws_*, removed when the session ends), the review gate (gate_patch) and the "
            "generate-execute-debug loop (solve). Every run obeys the server's policy."
        ),
        log_level="WARNING",
        lifespan=lifespan,
    )

    async def call(ctx: Context, method: Callable[..., Any], **kwargs: Any) -> CallToolResult:
        invocation = Call(_session(ctx, toolbox.workstations), _say(ctx))
        try:
            value = await anyio.to_thread.run_sync(partial(method, invocation, **kwargs))
        except HybridError as exc:
            return error_result(exc)
        return CallToolResult(content=[TextContent(type="text", text=_json(value))])

    @server.tool()
    async def repo_map(
        ctx: Context,
        root: Annotated[
            str, Field(description="Repository directory (relative to the server's first root).")
        ] = ".",
        task: Annotated[
            str, Field(description="What you are about to do: ranks the files for it.")
        ] = "",
        tokens: Annotated[int, Field(description="Token budget of the map.", ge=1)] = 2048,
    ) -> CallToolResult:
        """Ranked map of a repository: files and their key signatures under a token budget."""
        return await call(ctx, toolbox.repo_map, root=root, task=task, tokens=tokens)

    @server.tool()
    async def context_pack(
        ctx: Context,
        task: Annotated[str, Field(description="The task, in words.")],
        root: Annotated[str, Field(description="Repository directory.")] = ".",
        tokens: Annotated[int, Field(description="Token budget of the pack.", ge=64)] = 8000,
    ) -> CallToolResult:
        """The context for a task: the relevant files' skeletons and symbol bodies, within a budget."""
        return await call(ctx, toolbox.context_pack, root=root, task=task, tokens=tokens)

    @server.tool()
    async def skeleton(
        ctx: Context, path: Annotated[str, Field(description="A source file inside a root.")]
    ) -> CallToolResult:
        """A source file with its bodies elided: imports, signatures, docstrings."""
        return await call(ctx, toolbox.skeleton, path=path)

    @server.tool()
    async def run_python(
        ctx: Context,
        source: Annotated[str, Field(description="Python source to run (CPython 3.14).")],
        tests: Annotated[
            str,
            Field(
                description="Tests: top-level asserts and test_* functions, run in the snippet's namespace."
            ),
        ] = "",
        files: Annotated[
            dict[str, str] | None,
            Field(description="Input files by name (readable read-only in the working directory)."),
        ] = None,
        timeout_seconds: Timeout = None,
    ) -> CallToolResult:
        """Run Python (and its tests) in a fresh CPython-in-WebAssembly instance: no network, no host files."""
        return await call(
            ctx,
            toolbox.run_python,
            source=source,
            tests=tests or None,
            files=files,
            timeout_seconds=timeout_seconds,
        )

    @server.tool()
    async def run_check(
        ctx: Context,
        check: Annotated[
            CheckName, Field(description="csv, json, grep, redact or scope (a unified diff).")
        ],
        text: Annotated[str, Field(description="The data itself (or give path).")] = "",
        path: Annotated[
            str, Field(description="A file (or, for grep, a directory) inside a root.")
        ] = "",
        pattern: Annotated[str, Field(description="grep: the regular expression.")] = "",
        options: Annotated[
            dict[str, Any] | None,
            Field(
                description=(
                    "The check's options: csv require/types/delimiter/allow_empty; json "
                    "schema (an object)/max_errors; grep ignore_case/context/max_matches/globs; "
                    "redact literals/max_bytes/entropy/label; scope allow/deny/allow_lockfiles/default_deny."
                )
            ),
        ] = None,
    ) -> CallToolResult:
        """A built-in check in a fuel- and memory-capped WebAssembly module."""
        return await call(
            ctx,
            toolbox.run_check,
            check=check,
            text=text or None,
            path=path or None,
            pattern=pattern or None,
            options=options or {},
        )

    @server.tool()
    async def ws_create(
        ctx: Context,
        repo: Annotated[
            str, Field(description="Repository directory to copy in (inside a root).")
        ] = "",
        tier: Annotated[
            ContainerTier | None,
            Field(description="docker (runc) or gvisor (runsc); default from the policy."),
        ] = None,
        from_snapshot: Annotated[
            str, Field(description="A snapshot from ws_snapshot to start from.")
        ] = "",
        timeout_seconds: Timeout = None,
    ) -> CallToolResult:
        """Start a hardened workstation (no network, capped resources); removed when this session ends."""
        return await call(
            ctx,
            toolbox.ws_create,
            repo=repo or None,
            tier=tier,
            from_snapshot=from_snapshot or None,
            timeout_seconds=timeout_seconds,
        )

    @server.tool()
    async def ws_exec(
        ctx: Context,
        workstation: Ws,
        command: Annotated[
            str | list[str], Field(description="A shell command line, or an argv list.")
        ],
        timeout_seconds: Timeout = None,
        workdir: Annotated[
            str, Field(description="Working directory (default the workspace).")
        ] = "",
    ) -> CallToolResult:
        """Run a command in a workstation; its output streams as log notifications while it runs."""
        return await call(
            ctx,
            toolbox.ws_exec,
            workstation=workstation,
            command=command,
            timeout_seconds=timeout_seconds,
            workdir=workdir or None,
        )

    @server.tool()
    async def ws_read_file(
        ctx: Context,
        workstation: Ws,
        path: Annotated[
            str, Field(description="File path (relative to the workspace, or absolute).")
        ],
    ) -> CallToolResult:
        """A file's content from a workstation (UTF-8 text, else base64)."""
        return await call(ctx, toolbox.ws_read_file, workstation=workstation, path=path)

    @server.tool()
    async def ws_write_file(
        ctx: Context,
        workstation: Ws,
        path: Annotated[str, Field(description="File path inside the workspace.")],
        content: Text,
        encoding: Annotated[
            Literal["utf-8", "base64"], Field(description="How content is encoded.")
        ] = "utf-8",
    ) -> CallToolResult:
        """Write a file into a workstation's workspace (directories are made)."""
        return await call(
            ctx,
            toolbox.ws_write_file,
            workstation=workstation,
            path=path,
            content=content,
            encoding=encoding,
        )

    @server.tool()
    async def ws_diff(ctx: Context, workstation: Ws) -> CallToolResult:
        """Every change in the workstation since its repository went in, as a unified diff."""
        return await call(ctx, toolbox.ws_diff, workstation=workstation)

    @server.tool()
    async def ws_snapshot(ctx: Context, workstation: Ws) -> CallToolResult:
        """Commit a workstation (files, installed packages); start new ones from it with ws_create(from_snapshot=...)."""
        return await call(ctx, toolbox.ws_snapshot, workstation=workstation)

    @server.tool()
    async def ws_destroy(ctx: Context, workstation: Ws) -> CallToolResult:
        """Remove a workstation and its workspace."""
        return await call(ctx, toolbox.ws_destroy, workstation=workstation)

    @server.tool()
    async def gate_patch(
        ctx: Context,
        patch: Annotated[str, Field(description="A unified diff against the repository.")],
        repo: Annotated[str, Field(description="Repository directory (inside a root).")],
        test: Annotated[
            str, Field(description="Test command whose success means the task is done.")
        ],
        regression: Annotated[str, Field(description="Command that must keep passing.")] = "",
        allow: Annotated[
            list[str] | None, Field(description="Path prefixes the patch may touch.")
        ] = None,
        deny: Annotated[list[str] | None, Field(description="Extra denied globs.")] = None,
    ) -> CallToolResult:
        """The review gate: scope, secrets, dependencies, then the tests in a fresh workstation; never merges."""
        return await call(
            ctx,
            toolbox.gate_patch,
            patch=patch,
            repo=repo,
            test=test,
            regression=regression or None,
            allow=allow or [],
            deny=deny or [],
        )

    @server.tool()
    async def solve(
        ctx: Context,
        task: Annotated[str, Field(description="What to write or change, in words.")],
        tests: Annotated[str, Field(description="A function task's tests (python-wasm).")] = "",
        repo: Annotated[
            str, Field(description="A repository task's directory (inside a root).")
        ] = "",
        test: Annotated[str, Field(description="A repository task's test command.")] = "",
        steps: Annotated[int, Field(description="Model rounds.", ge=1, le=50)] = 5,
        k: Annotated[int, Field(description="Candidates per step.", ge=1, le=16)] = 1,
    ) -> CallToolResult:
        """The generate-execute-debug loop with the server's model; the report says how it ended."""
        return await call(
            ctx,
            toolbox.solve,
            task=task,
            tests=tests or None,
            repo=repo or None,
            test=test or None,
            steps=steps,
            k=k,
        )

    return server


def serve(
    toolbox: Toolbox,
    transport: Literal["stdio", "http"] = "stdio",
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    listener: socket.socket | None = None,
    token: str | None = None,
) -> None:
    """Run the server until its client goes (stdio EOF) or it is stopped; removes what it made.

    HTTP serves on ``listener`` (else a new socket on ``host:port``): a TCP one only to requests
    bearing ``token`` (auth.BearerAuth; ``token`` is required), a Unix one only to this user."""
    server = build_server(toolbox)
    try:
        if transport == "stdio":
            anyio.run(server.run_stdio_async)
        else:
            anyio.run(partial(_serve_http, server, toolbox, host, port, listener, token))
    finally:
        toolbox.workstations.close()


async def _serve_http(
    server: MCPServer,
    toolbox: Toolbox,
    host: str,
    port: int,
    listener: socket.socket | None,
    token: str | None,
) -> None:
    import uvicorn

    from hybrid.mcp import auth

    if listener is None:
        listener = socket.create_server((host, port))
    local = listener.family == socket.AF_UNIX
    security = None
    if local:
        from mcp.server.transport_security import TransportSecuritySettings

        # Clients name a Unix socket's server localhost, without a port.
        security = TransportSecuritySettings(
            allowed_hosts=["localhost", "localhost:*"],
            allowed_origins=["http://localhost", "http://localhost:*"],
        )
    app: Any = server.streamable_http_app(
        session_idle_timeout=toolbox.workstations.idle_seconds,
        host=host,
        transport_security=security,
    )
    if not local:
        if not token:
            raise ValueError("an HTTP server on TCP needs a token")
        app = auth.BearerAuth(app, token)
    config = uvicorn.Config(
        app,
        log_level="warning",
        http=auth.owner_only_protocol() if local else "auto",
        timeout_keep_alive=5,
    )
    await uvicorn.Server(config).serve(sockets=[listener])
