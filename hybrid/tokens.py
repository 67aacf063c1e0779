"""Bearer tokens for the toolkit's listeners: random, kept in a file only its user can read.

Every listener that a second local user could reach over TCP (``hybrid serve --tcp``, ``hybrid
mcp --transport http``, the local Ray cluster) takes a token from a 0600 file in a 0700
directory of the user's; whoever can read the file is the user. Compare with ``matches``
(constant time: a byte-by-byte compare tells an attacker how much of a guess was right).
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import stat
import tempfile
from pathlib import Path

TOKEN_BYTES = 32
"""Random bytes in a token (43 URL-safe characters)."""


def issue(path: Path) -> str:
    """A new token, written to ``path`` (mode 0600, replaced atomically: a reader never sees half)."""
    token = secrets.token_urlsafe(TOKEN_BYTES)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")  # mkstemp makes it 0600
    try:
        with os.fdopen(fd, "w") as out:
            out.write(token + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return token


def read(path: Path) -> str | None:
    """The token in ``path``, or None when it is missing, not a regular file of this user's, or
    readable by anyone else (then it is no secret any more)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd) as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            return None
        token = handle.read(1024).strip()
    return token or None


def kept(path: Path) -> str:
    """The token in ``path`` if it is sound (see ``read``), else a new one written there."""
    return read(path) or issue(path)


def matches(given: str | bytes, expected: str) -> bool:
    """Whether ``given`` is ``expected``, in time that does not depend on where they differ."""
    if isinstance(given, str):
        given = given.encode("utf-8", "surrogateescape")
    return bool(expected) and hmac.compare_digest(given, expected.encode())
