"""Reading a model's answer: a Python module, a unified diff or search/replace edit blocks.

A malformed answer raises ``MalformedAnswer`` with a message written for the model (it goes back
as evidence); nothing here touches the repository, edit blocks are turned into a diff in memory.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path, PurePosixPath

from hybrid.errors import InvalidInput
from hybrid.repofs import MISSING, Refused, read_text

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)
_BLOCK = re.compile(
    r"(?:^|\n)([^\n`]*?)\s*\n(?:```[^\n]*\n)?<{5,9} SEARCH[^\n]*\n(.*?)(?:^|\n)={5,9}[^\n]*\n(.*?)(?:^|\n)>{5,9} REPLACE[^\n]*",
    re.S | re.M,
)


class MalformedAnswer(InvalidInput):
    """The model's answer is not a usable module, diff or set of edit blocks."""


def extract_code(text: str) -> str:
    """The Python module in an answer: its first ```python block (else the longest fenced block,
    else the whole text)."""
    blocks = _FENCE.findall(text)
    for lang, body in blocks:
        if lang.lower() in ("python", "py", "python3"):
            return body
    if blocks:
        return max((body for _, body in blocks), key=len)
    return text


def to_diff(text: str, repo: Path) -> str:
    """A unified diff from an answer holding a diff or search/replace blocks against ``repo``."""
    if "<<<<<<< SEARCH" in text or re.search(r"<{5,9} SEARCH", text):
        return _edits_to_diff(text, repo)
    for lang, body in _FENCE.findall(text):
        if lang.lower() in ("diff", "patch", "udiff") or body.lstrip().startswith(
            ("diff --git", "--- ")
        ):
            return _normalised(body)
    match = re.search(r"^(diff --git |--- )", text, re.M)
    if match is None:
        raise MalformedAnswer(
            "the answer holds neither a unified diff (```diff) nor SEARCH/REPLACE edit blocks"
        )
    return _normalised(text[match.start() :])


def _normalised(diff: str) -> str:
    return diff if diff.endswith("\n") else diff + "\n"


def _safe_path(name: str) -> str:
    path = name.strip().strip("`*").strip()
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or ".." in pure.parts:
        raise MalformedAnswer(f"edit block names an unusable path {name.strip()!r}")
    return pure.as_posix()


def _original(repo: Path, path: str) -> str | None:
    """The file an edit block names, None when it does not exist (the block creates it).

    Read by ``hybrid.repofs``: a symlink (``x.py -> /etc/shadow``, or under a linked directory),
    a FIFO or a device is refused, never read (its content would go into the diff)."""
    try:
        return read_text(repo, path)
    except Refused as exc:
        if exc.reason == MISSING:
            return None
        raise MalformedAnswer(
            f"edit block path {path!r}: {exc.reason}; edit a regular file"
        ) from None


def _edits_to_diff(text: str, repo: Path) -> str:
    blocks = _BLOCK.findall(text)
    if not blocks:
        raise MalformedAnswer(
            "edit blocks must be: the file path on its own line, then <<<<<<< SEARCH, the exact "
            "old lines, =======, the new lines, >>>>>>> REPLACE"
        )
    originals: dict[str, str | None] = {}
    current: dict[str, str | None] = {}
    for name, search_lines, replace_lines in blocks:
        # The groups stop before the newline that ends their last line.
        search = search_lines + "\n" if search_lines else ""
        replace = replace_lines + "\n" if replace_lines else ""
        path = _safe_path(name)
        if path not in current:
            originals[path] = current[path] = _original(repo, path)
        old = current[path]
        if old is None:
            if search.strip():
                raise MalformedAnswer(f"{path}: no such file (an empty SEARCH creates one)")
            current[path] = replace
            continue
        if not search.strip():
            raise MalformedAnswer(f"{path}: an empty SEARCH only creates a new file")
        count = old.count(search)
        if count == 0:
            raise MalformedAnswer(f"{path}: the SEARCH text does not match the file exactly")
        if count > 1:
            raise MalformedAnswer(f"{path}: the SEARCH text matches {count} places; add context")
        current[path] = old.replace(search, replace, 1)
    chunks: list[str] = []
    for path, new in current.items():
        old_text = originals[path]
        if new == old_text or new is None:
            continue
        header = f"diff --git a/{path} b/{path}\n"
        if old_text is None:
            header += "new file mode 100644\n"
        lines = difflib.unified_diff(
            (old_text or "").splitlines(True),
            new.splitlines(True),
            "/dev/null" if old_text is None else f"a/{path}",
            f"b/{path}",
        )
        body = "".join(
            line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
            for line in lines
        )
        chunks.append(header + body)
    if not chunks:
        raise MalformedAnswer("the edit blocks change nothing")
    return "".join(chunks)


__all__ = ["MalformedAnswer", "extract_code", "to_diff"]
