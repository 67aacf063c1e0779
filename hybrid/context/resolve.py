"""Resolve import strings (Python modules, JS paths, Go packages, includes ...) to repo files."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable

from hybrid.context.tags import Definition

_STRIP_EXT = re.compile(
    r"\.(py|pyi|js|jsx|mjs|cjs|ts|tsx|mts|cts|go|rs|java|c|h|cc|cpp|cxx|hpp|hh|hxx|rb)$"
)
_PACKAGE_FILES = frozenset({"__init__", "index", "mod", "lib", "main"})


def _module_key(path: str) -> str:
    return _STRIP_EXT.sub("", path)


def is_test_path(path: str) -> bool:
    """Test files and directories by the usual conventions of the supported languages."""
    parts = path.lower().split("/")
    name = parts[-1]
    if any(
        p in ("test", "tests", "testing", "__tests__", "spec", "specs", "testdata")
        for p in parts[:-1]
    ):
        return True
    stem = name.rsplit(".", 1)[0]
    return (
        stem.startswith("test_")
        or stem.endswith(("_test", "_tests", "_spec", ".test", ".spec", "test"))
        or name == "conftest.py"
    )


def test_spans(definitions: Iterable[Definition]) -> list[tuple[int, int]]:
    """Line spans of the test modules inside a source file (Rust's ``mod tests``)."""
    return [
        (d.line, d.end_line)
        for d in definitions
        if d.kind == "module" and d.name in ("tests", "test") and not d.scope
    ]


class Resolver:
    """Maps import strings of one repository to its files, deterministically."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = set(paths)
        self.suffixes: dict[str, list[str]] = {}
        self.dirs: dict[str, list[str]] = {}
        for path in sorted(paths):
            key = _module_key(path)
            parts = key.split("/")
            if parts[-1] in _PACKAGE_FILES and len(parts) > 1:
                self._add(parts[:-1], path, self.suffixes)
            self._add(parts, path, self.suffixes)
            if len(parts) > 1:
                self._add(parts[:-1], path, self.dirs)

    @staticmethod
    def _add(parts: list[str], path: str, table: dict[str, list[str]]) -> None:
        for i in range(len(parts)):
            table.setdefault("/".join(parts[i:]), []).append(path)

    def _pick(self, importer: str, candidates: list[str]) -> list[str]:
        if not candidates:
            return []
        base = importer.split("/")

        def closeness(path: str) -> tuple[int, int, str]:
            parts = path.split("/")
            common = 0
            for a, b in zip(parts, base, strict=False):
                if a != b:
                    break
                common += 1
            return (-common, len(parts), path)

        return [min(candidates, key=closeness)]

    def _lookup(self, importer: str, mod: str) -> list[str]:
        parts = [p for p in mod.split("/") if p]
        while parts:
            found = self.suffixes.get("/".join(parts))
            if found:
                return self._pick(importer, found)
            parts = parts[:-1]
        return []

    def _relative(self, importer: str, target: str) -> list[str]:
        base = posixpath.normpath(posixpath.join(posixpath.dirname(importer), target))
        key = _module_key(base)
        found = self.suffixes.get(key)
        if found:
            exact = [
                p for p in found if _module_key(p) == key or _module_key(p).startswith(key + "/")
            ]
            return self._pick(importer, exact or found)
        return []

    def resolve(self, importer: str, lang: str, spec: str) -> list[str]:
        """Files of this repository that ``importer`` pulls in with ``spec``."""
        spec = spec.strip()
        if not spec:
            return []
        if lang == "python":
            dots = len(spec) - len(spec.lstrip("."))
            rest = spec[dots:].replace(".", "/")
            if dots:
                up = "/".join([".."] * (dots - 1))
                target = posixpath.join(up, rest) if rest else (up or ".")
                found = self._relative(importer, target)
                if found or not rest:
                    return found or self._relative(importer, posixpath.join(up or ".", "__init__"))
                return self._relative(
                    importer, posixpath.join(up, rest.split("/")[0]) if up else rest.split("/")[0]
                )
            return self._lookup(importer, rest)
        if lang in ("javascript", "typescript", "tsx", "c", "cpp", "ruby"):
            if spec.startswith("."):
                return self._relative(importer, spec)
            if lang in ("c", "cpp", "ruby"):
                found = self._relative(importer, spec)
                if found:
                    return found
            return self._lookup(importer, spec.lstrip("@"))
        if lang == "go":
            parts = spec.strip('"').split("/")
            for i in range(len(parts)):
                in_dir = self.dirs.get("/".join(parts[i:]))
                if in_dir:
                    same_dir = sorted(
                        p for p in in_dir if posixpath.dirname(p) == posixpath.dirname(in_dir[0])
                    )
                    return [p for p in same_dir if not p.endswith("_test.go")]
            return []
        if lang == "rust":
            body = re.split(r"[{ ]", spec, maxsplit=1)[0]
            parts = [p for p in body.split("::") if p and p not in ("crate", "self", "super", "*")]
            if "::" not in spec and parts:  # `mod name;`
                return self._relative(importer, parts[0])
            return self._lookup(importer, "/".join(parts))
        if lang == "java":
            return self._lookup(importer, spec.replace(".", "/"))
        return []
