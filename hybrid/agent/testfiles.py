"""The task's tests and the test machinery: what a patch may not change about how it is judged.

The tests that judge a patch come from the task, never from the patch (as SWE-bench's harness
does). The task's tests are the paths its test commands name (``tests/test_x.py``,
``tests/test_x.py::test_y``, ``tests/``), or every test path when they name none. The machinery
is whatever changes how a test run is collected, configured or reported, wherever it sits:
``conftest.py``, pytest/tox configuration (the test sections of ``setup.cfg``, ``tox.ini`` and
``pyproject.toml``), ``sitecustomize``/``usercustomize``, ``.pth`` files, installed-distribution
metadata (a ``*.dist-info`` with a ``pytest11`` entry point is a plugin pytest loads by itself),
modules that shadow the test runner, installed packages (``node_modules``, ``site-packages``),
compiled code that is imported instead of the reviewed source (``__pycache__``, ``*.pyc``,
native modules), ``__init__.py`` of test packages, jest/mocha/vitest/ava/tap/babel
configuration and the test scripts of ``package.json``.
"""

from __future__ import annotations

import configparser
import json
import re
import shlex
import tomllib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from hybrid.agent.applied import Change

_RUNNER_MODULES = {"pytest", "_pytest", "pluggy", "unittest", "nose", "nose2", "py"}
_JS_CONFIG = re.compile(
    r"^(jest|vitest|vite|ava|karma|playwright|cypress|wdio|mocha)\.(config|setup|workspace|conf)"
    r"(\.[a-z]+)*\.(js|cjs|mjs|ts|cts|mts|json)$|^\.mocharc(\..*)?$|^\.taprc(\..*)?$|"
    r"^jest\.(setup|preset)\..*$|^\.c8rc(\..*)?$|^\.nycrc(\..*)?$|^babel\.config\..*$|^\.babelrc(\..*)?$"
)
_TEST_DIRS = {"test", "tests", "testing", "__tests__", "spec", "specs"}
_INI_SECTIONS = re.compile(r"^(pytest|tool:pytest|tox|tox:.*|testenv|testenv:.*|coverage:.*)$")
_PACKAGE_KEYS = ("jest", "mocha", "ava", "tap", "c8", "nyc", "vitest")
_SCRIPTS = re.compile(r"^(pre|post)?test([:.\-].*)?$")
# What a runner reads without being told: `make test` reads the Makefile, `tox` tox.ini.
_IMPLIED = {
    "make": ("Makefile", "makefile", "GNUmakefile"),
    "tox": ("tox.ini",),
    "nox": ("noxfile.py",),
    "hatch": ("hatch.toml",),
}

Contents = Callable[[str | None], bytes | None]


def machinery(path: str) -> str | None:
    """Why ``path`` is test machinery whatever its content, or None."""
    parts = path.split("/")
    name = parts[-1]
    if name == "conftest.py":
        return "conftest.py"
    if name in ("pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml"):
        return "pytest configuration"
    if name in ("sitecustomize.py", "usercustomize.py") or (
        name in ("sitecustomize", "usercustomize")
    ):
        return "interpreter start-up hook"
    if name.endswith(".pth"):
        return ".pth file (run at interpreter start-up)"
    if any(p.endswith((".dist-info", ".egg-info", ".egg-link")) for p in parts) or name.endswith(
        ".egg-link"
    ):
        return "installed-distribution metadata (plugin entry points)"
    if "node_modules" in parts or "site-packages" in parts or "dist-packages" in parts:
        return "installed packages (they shadow the test runner and its plugins)"
    if "__pycache__" in parts or name.endswith((".pyc", ".pyo")):
        return "compiled bytecode (it can run instead of the reviewed source)"
    if re.search(r"\.(so|pyd|dylib)(\.[0-9.]+)?$", name):
        return "a native module (it is imported before the reviewed .py)"
    stems = [p.removesuffix(".py") for p in parts]
    if any(s in _RUNNER_MODULES for s in stems[:-1]) or (
        name.endswith(".py") and stems[-1] in _RUNNER_MODULES
    ):
        return "a module that shadows the test runner"
    if _JS_CONFIG.match(name):
        return "test runner configuration"
    if name == "__init__.py" and any(p.lower() in _TEST_DIRS for p in parts[:-1]):
        return "__init__.py of a test package"
    return None


def _ini_sections(data: bytes | None) -> dict[str, dict[str, str]] | None:
    if data is None:
        return {}
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    try:
        parser.read_string(data.decode("utf-8", "replace"))
    except configparser.Error:
        return None  # unreadable: counts as changed when the file changed
    return {s: dict(parser.items(s)) for s in parser.sections() if _INI_SECTIONS.match(s.lower())}


def _toml_tables(data: bytes | None) -> Any:
    if data is None:
        return {}
    try:
        tool = tomllib.loads(data.decode("utf-8", "replace")).get("tool", {})
    except (tomllib.TOMLDecodeError, AttributeError):
        return None
    return {k: tool.get(k) for k in ("pytest", "tox", "hatch")} if isinstance(tool, dict) else None


def _package_tests(data: bytes | None) -> Any:
    if data is None:
        return {}
    try:
        manifest = json.loads(data)
    except ValueError:
        return None
    if not isinstance(manifest, dict):
        return None
    scripts = manifest.get("scripts")
    scripts = scripts if isinstance(scripts, dict) else {}
    return {
        "scripts": {k: v for k, v in scripts.items() if _SCRIPTS.match(str(k))},
        **{k: manifest.get(k) for k in _PACKAGE_KEYS},
    }


_SECTIONED: dict[str, tuple[str, Callable[[bytes | None], Any]]] = {
    "setup.cfg": ("the test sections of setup.cfg", _ini_sections),
    "tox.ini": ("tox/pytest configuration in tox.ini", _ini_sections),
    "pyproject.toml": ("[tool.pytest]/[tool.tox] in pyproject.toml", _toml_tables),
    "package.json": ("the test scripts or runner configuration of package.json", _package_tests),
}


def sectioned(change: Change, contents: Contents) -> str | None:
    """Why a change to a file that is only partly test configuration touches that part."""
    name = change.path.rsplit("/", 1)[-1]
    if name not in _SECTIONED:
        return None
    why, read = _SECTIONED[name]
    before, after = read(contents(change.old_oid)), read(contents(change.new_oid))
    if before is None or after is None or before != after:
        return why
    return None


def named_tests(commands: Iterable[str], repo: Path) -> list[str]:
    """Repository paths the test commands name (files or directories; ``::`` ids cut off)."""
    root = Path(repo).resolve()
    found: set[str] = set()
    for command in commands:
        try:
            words = shlex.split(command)
        except ValueError:
            words = command.split()
        for word in words:
            for implied in _IMPLIED.get(PurePosixPath(word).name, ()):
                if (root / implied).is_file():
                    found.add(implied)
            # Options and VAR=value words (PYTHONPATH=src, --cov=src) name no test.
            if "=" in word:
                continue
            path = _repo_path(word.split("::", 1)[0].split("[", 1)[0], root)
            if path:
                found.add(path)
    return sorted(found)


def _repo_path(token: str, root: Path) -> str | None:
    token = token.strip()
    if not token or token.startswith("-") or len(token) > 4096:
        return None
    parts = [p for p in PurePosixPath(token).parts if p not in (".",)]
    if not parts or parts[0] == "/" or ".." in parts:
        return None
    try:
        target = root.joinpath(*parts)
        if not (target.is_file() or target.is_dir()) or target.resolve() == root:
            return None
    except (OSError, ValueError):
        return None
    return "/".join(parts)


def is_test_path(path: str) -> bool:
    from hybrid.context.resolve import is_test_path as conventional

    return conventional(path)


_SOURCE = (".py", ".js", ".cjs", ".mjs", ".ts", ".tsx", ".jsx", ".go", ".rs", ".rb", ".java")


def judged_changes(
    changes: Sequence[Change], named: Sequence[str], contents: Contents
) -> list[tuple[str, str]]:
    """(path, why) for every change to the task's tests or the test machinery.

    The task's tests are the named paths (a directory: everything under it) and the data files
    beside a named test (expected outputs, snapshots); with nothing named, every test path.
    """
    beside = {str(PurePosixPath(n).parent) for n in named if PurePosixPath(n).suffix}
    beside.discard(".")
    found: list[tuple[str, str]] = []
    for change in changes:
        path = change.path
        under = [n for n in named if path == n or path.startswith(n.rstrip("/") + "/")]
        data = not path.endswith(_SOURCE) and any(path.startswith(d + "/") for d in beside)
        if why := machinery(path) or sectioned(change, contents):
            found.append((path, why))
        elif under:
            found.append((path, f"a test the task names ({under[0]})"))
        elif data:
            found.append((path, "test data beside the task's tests"))
        elif not named and is_test_path(path):
            found.append((path, "a test of the task (its test command names no file)"))
    return found


__all__ = ["judged_changes", "machinery", "named_tests", "sectioned"]
