"""A path for a one-line message (main's ``hybrid.paths.display``; use that one once merged)."""

from __future__ import annotations

import os
from pathlib import Path


def display(path: Path | str) -> str:
    """Bytes that are not UTF-8 shown as escapes, never a crash when the line is printed."""
    text = os.fspath(path)
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "backslashreplace")
    return raw.decode("utf-8", "backslashreplace")
