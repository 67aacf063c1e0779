"""Where the toolkit keeps its per-machine state (compiled modules, tag caches, images)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from hybrid.errors import InvalidInput


def cache_root() -> Path:
    """Where cache_dir() lives (``$HYBRID_CACHE_DIR``, else ``$XDG_CACHE_HOME/hybrid``); not created."""
    root = os.environ.get("HYBRID_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "hybrid"


def state_root() -> Path:
    """Where state_dir() lives (``$HYBRID_STATE_DIR``, else ``$XDG_STATE_HOME/hybrid``); not created."""
    root = os.environ.get("HYBRID_STATE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "hybrid"


def runtime_dir() -> Path:
    """Where the resident server's sockets live, created 0700: ``$HYBRID_RUNTIME_DIR``, else
    ``$XDG_RUNTIME_DIR/hybrid``, else ``<state root>/run``. Refused when another user owns it."""
    from hybrid.server.wire import runtime_path  # stdlib only: the client's start-up uses it

    return Path(runtime_path())


def cache_dir(*parts: str) -> Path:
    """The cache directory (see cache_root), created on demand."""
    path = cache_root().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def state_dir(*parts: str) -> Path:
    """Host-side state no sandbox can write (``$HYBRID_STATE_DIR``, else ``$XDG_STATE_HOME/hybrid``).

    Created on demand with mode 0700: it holds evidence (diff baselines) and secret values that
    must never live inside a sandbox or in engine metadata.
    """
    base = state_root()
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    for made in (base, *[base.joinpath(*parts[: i + 1]) for i in range(len(parts))]):
        if made.stat().st_mode & 0o077:
            made.chmod(0o700)
    return path


def open_input(
    path: Path, what: str = "file", error: type[InvalidInput] = InvalidInput
) -> BinaryIO:
    """Open a file the user named for reading; a missing or unreadable path raises one ``error`` line.

    The file must not be a host secret path (``hybrid.policy.check_input_path``): it is judged
    as opened, so a symlink, or a path swapped after a check, cannot smuggle one in.
    """
    from hybrid.policy import check_opened_input  # policy imports this module

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise error(f"{display(path)}: no such {what}") from None
    except OSError as exc:
        raise error(f"{display(path)}: cannot read: {exc.strerror}") from None
    try:
        check_opened_input(path, fd, what)
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise error(f"{display(path)}: is a directory, not a {what}")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path: Path, what: str = "file", error: type[InvalidInput] = InvalidInput) -> bytes:
    """Read a file the user named (see open_input); any problem raises one ``error`` line."""
    with open_input(path, what, error) as file:
        try:
            return file.read()
        except OSError as exc:
            raise error(f"{display(path)}: cannot read: {exc.strerror}") from None


def read_text_input(
    path: Path, what: str = "file", error: type[InvalidInput] = InvalidInput
) -> str:
    """Read a UTF-8 text file the user named (see open_input); other bytes raise one ``error`` line."""
    try:
        return read_input(path, what, error).decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{what} {display(path)}: not UTF-8 text") from None


def display(path: str | os.PathLike[str]) -> str:
    """A path for a one-line message: bytes that are not UTF-8 shown as escapes, never a crash."""
    text = os.fspath(path)
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "backslashreplace")
    return raw.decode("utf-8", "backslashreplace")


# C0 and C1 controls, DEL, line/paragraph separators and bidirectional overrides: what can
# move a terminal's cursor, start an escape sequence, forge a line or reorder what is shown.
_UNPRINTABLE = {
    **{c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))},
    **{c: f"\\u{c:04x}" for c in (0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A))},
    ord("\n"): "\\n",
    ord("\t"): "\\t",
    ord("\r"): "\\r",
}


def printable(name: str) -> str:
    """A name (a repository's file name) safe to show on a terminal or in a line-based listing:
    control characters escaped (``\\n``, ``\\x1b``), so a name cannot send terminal escapes or
    forge lines; bytes that are not UTF-8 are shown as escapes too (see ``display``). JSON
    output needs no such care (json escapes them)."""
    return display(name).translate(_UNPRINTABLE)
