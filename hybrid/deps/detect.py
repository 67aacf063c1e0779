"""What a repository declares about its dependencies, read statically (no project code runs).

Python: ``pyproject.toml`` (dependencies, the test extras and dependency groups),
``requirements*.txt``, ``setup.cfg``, literal arguments of ``setup()`` in ``setup.py``, test
deps of ``tox.ini`` and ``noxfile.py``; pins from ``uv.lock`` / ``poetry.lock``. Node:
``package.json`` with ``package-lock.json`` or ``npm-shrinkwrap.json``.
"""

from __future__ import annotations

import ast
import configparser
import contextlib
import hashlib
import re
import subprocess
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement as Req
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from hybrid import git
from hybrid.deps.models import Declared, Requirement
from hybrid.errors import InvalidDeclaration, InvalidInput
from hybrid.paths import display

_REQ_FILES = ("requirements*.txt", "requirements/*.txt", "*requirements*/*.txt")
_TOX_FACTOR = re.compile(r"^!?[\w.-]+(,!?[\w.-]+)*:\s")  # "coverage: coverage", "py38,py39: x"
_TEST_FACTORS = {"unit", "test", "tests", "testing", "pytest"}
_SKIP_REQ = re.compile(r"(docs?|doc-|lint|typecheck|release|publish)", re.IGNORECASE)


def detect(repo: Path, groups: Iterable[str] = ("test", "tests", "testing", "dev")) -> Declared:
    """Everything ``repo`` declares; InvalidDeclaration names the file and line of a malformed
    entry."""
    repo = Path(repo)
    if not repo.is_dir():
        raise InvalidInput(f"{display(repo)}: not a directory")
    reader = _Reader(repo, [canonicalize_name(g) for g in groups])
    reader.pyproject()
    reader.setup_cfg()
    reader.setup_py()
    # The files tox's test environment installs are the project's own choice; the glob is the
    # fallback (it would also take jinja's tests37.txt, whose pins conflict with tests.txt).
    if not reader.tox_ini():
        for pattern in _REQ_FILES:
            for path in sorted(repo.glob(pattern)):
                if not _SKIP_REQ.search(path.name):
                    reader.requirements_file(path)
    reader.noxfile()
    reader.uv_lock()
    reader.poetry_lock()
    reader.node()
    return reader.result()


def tag_release(repo: Path, rev: str = "HEAD") -> str | None:
    """The version of the latest tag before ``rev`` in the git repository ``repo`` (v1.2 and
    release-1.2 give 1.2), or None: no git, no tag, or a tag that names no version."""
    try:
        tag = git.run(["describe", "--tags", "--abbrev=0", rev], repo, text=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    version = re.sub(r"^\D+", "", tag)
    try:
        Version(version)
    except InvalidVersion:
        return None
    return version


class _Reader:
    def __init__(self, repo: Path, groups: list[str]) -> None:
        self.repo = repo
        self.groups = groups
        self.declared = Declared()
        self.extras: dict[str, list[tuple[str, str]]] = {}  # the project's own extras
        self.own: list[tuple[str, str]] = []  # the project's own dependencies
        self.self_extras: set[str] = set()
        self.wanted: list[tuple[str, str]] = []  # (spec, source) from test declarations
        self.read: dict[str, bytes] = {}
        self.versions: list[str] = []  # the project's own version, as its files state it

    # -- files ---------------------------------------------------------------------------------

    def _load(self, path: Path) -> str | None:
        if not path.is_file():
            return None
        rel = path.relative_to(self.repo).as_posix()
        if rel in self.read:
            return None  # each file once (a -r cycle ends here)
        data = path.read_bytes()
        self.read[rel] = data
        return data.decode("utf-8", errors="replace")

    def _version(self) -> str | None:
        """The release the checkout is at: a version its files state, else an sdist's PKG-INFO,
        else its latest git tag (setuptools-scm and hatch-vcs projects)."""
        stated = list(self.versions)
        text = self._load(self.repo / "PKG-INFO") or ""
        stated += [line[8:].strip() for line in text.splitlines() if line.startswith("Version:")]
        if (self.repo / ".git").exists():
            stated.append(tag_release(self.repo) or "")
        for version in stated:
            # The release itself: what a dependent's specifier matches (1.4.0.dev3 and
            # 1.4.0+local are not, as pre and local releases).
            with contextlib.suppress(InvalidVersion, TypeError):
                return Version(version).base_version
        return None

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.repo).as_posix()

    def pyproject(self) -> None:
        path = self.repo / "pyproject.toml"
        text = self._load(path)
        if text is None:
            return
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InvalidDeclaration(f"{display(path)}: not valid TOML: {exc}") from None
        project = data.get("project") or {}
        poetry = (data.get("tool") or {}).get("poetry") or {}
        name = project.get("name") or poetry.get("name")
        if isinstance(name, str):
            self.declared.project = canonicalize_name(name)
        self.versions += [v for v in (project.get("version"), poetry.get("version")) if v]
        for spec in _strings(project.get("dependencies")):
            self.own.append((spec, "pyproject.toml"))
        for extra, specs in (project.get("optional-dependencies") or {}).items():
            self.extras[canonicalize_name(extra)] = [(s, "pyproject.toml") for s in _strings(specs)]
        points = self.declared.entry_points
        for group, table in (
            ("console_scripts", project.get("scripts")),
            ("gui_scripts", project.get("gui-scripts")),
            ("console_scripts", poetry.get("scripts")),
            *((str(g), t) for g, t in (project.get("entry-points") or {}).items()),
        ):
            for entry, ref in (table or {}).items() if isinstance(table, dict) else ():
                if isinstance(ref, str):
                    points.setdefault(group, {})[str(entry)] = ref
        groups = data.get("dependency-groups") or {}
        for group in groups:
            if canonicalize_name(group) in self.groups:
                for spec in self._group(groups, group, set()):
                    self.wanted.append((spec, "pyproject.toml"))
        # Poetry's tables: names only matter with poetry.lock, which pins them.
        for table in (poetry.get("dependencies"), poetry.get("dev-dependencies")):
            for dep in table or {}:
                if dep.lower() != "python":
                    self.wanted.append((dep, "pyproject.toml"))
        for group, body in (poetry.get("group") or {}).items():
            if canonicalize_name(group) in self.groups:
                for dep in (body or {}).get("dependencies") or {}:
                    self.wanted.append((dep, "pyproject.toml"))

    def _group(self, groups: dict[str, Any], name: str, seen: set[str]) -> list[str]:
        if name in seen:
            return []
        seen.add(name)
        out: list[str] = []
        for item in groups.get(name) or []:
            if isinstance(item, str):
                out.append(item)
            elif isinstance(item, dict) and isinstance(item.get("include-group"), str):
                out += self._group(groups, item["include-group"], seen)
        return out

    def setup_cfg(self) -> None:
        text = self._load(self.repo / "setup.cfg")
        if text is None:
            return
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(text)
        except configparser.Error as exc:
            raise InvalidDeclaration(f"{display(self.repo / 'setup.cfg')}: {exc}") from None
        if parser.has_option("metadata", "name") and not self.declared.project:
            self.declared.project = canonicalize_name(parser.get("metadata", "name"))
        if parser.has_option("metadata", "version"):
            self.versions.append(parser.get("metadata", "version"))
        if parser.has_option("options", "install_requires"):
            self.own += [
                (s, "setup.cfg") for s in _lines(parser.get("options", "install_requires"))
            ]
        if parser.has_option("options", "tests_require"):
            self.wanted += [
                (s, "setup.cfg") for s in _lines(parser.get("options", "tests_require"))
            ]
        if parser.has_section("options.entry_points"):
            for group, value in parser.items("options.entry_points"):
                self._entry_lines(group, _lines(value))
        if parser.has_section("options.extras_require"):
            for extra, value in parser.items("options.extras_require"):
                self.extras[canonicalize_name(extra)] = [(s, "setup.cfg") for s in _lines(value)]

    def setup_py(self) -> None:
        # Literal arguments of setup() only: running setup.py would run the project's code here.
        text = self._load(self.repo / "setup.py")
        if text is None:
            return
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return
        names: dict[str, Any] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    literal = _literal(node.value, {})
                    if literal is not None:
                        names[target.id] = literal
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "setup"):
                continue
            for keyword in call.keywords:
                value = _literal(keyword.value, names)
                if keyword.arg == "name" and isinstance(value, str) and not self.declared.project:
                    self.declared.project = canonicalize_name(value)
                elif keyword.arg == "install_requires":
                    self.own += [(s, "setup.py") for s in _strings(value)]
                elif keyword.arg == "tests_require":
                    self.wanted += [(s, "setup.py") for s in _strings(value)]
                elif keyword.arg == "entry_points" and isinstance(value, dict):
                    for group, lines in value.items():
                        self._entry_lines(str(group), _strings(lines))
                elif keyword.arg == "extras_require" and isinstance(value, dict):
                    for extra, specs in value.items():
                        self.extras[canonicalize_name(str(extra))] = [
                            (s, "setup.py") for s in _strings(specs)
                        ]

    def _entry_lines(self, group: str, lines: Iterable[str]) -> None:
        """``name = pkg.mod:func`` lines (setup.cfg, setup.py) of one entry point group."""
        for line in lines:
            entry, sep, ref = line.partition("=")
            if sep and entry.strip() and ref.strip():
                self.declared.entry_points.setdefault(group, {})[entry.strip()] = ref.strip()

    def requirements_file(self, path: Path) -> None:
        text = self._load(path)
        if text is None:
            return
        rel = self._rel(path)
        for number, line in enumerate(_joined(text), 1):
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            if not line:
                continue
            option, _, rest = line.partition(" ")
            if option in ("-r", "--requirement", "-c", "--constraint"):
                included = (path.parent / rest.strip()).resolve()
                if included.is_relative_to(self.repo.resolve()):
                    self.requirements_file(self.repo / included.relative_to(self.repo.resolve()))
                continue
            if option in ("-e", "--editable"):
                line = rest.strip()
            elif line.startswith("-"):
                continue  # index and other options: the user's own pip configuration decides
            if line.startswith((".", "/")) or "://" in line:
                extras = re.search(r"\[([^\]]*)\]", line)
                if line.split("[")[0].rstrip("/") in (".", "./"):
                    self.self_extras.update(_extras(extras.group(1) if extras else ""))
                continue
            spec = line.split(" --hash", 1)[0].split(" \\", 1)[0].strip()
            self._check(spec, f"{rel}:{number}")
            self.wanted.append((spec, rel))
            digests = re.findall(r"--hash[= ]sha256:([0-9a-fA-F]{64})", line)
            if digests:
                req = Req(spec)
                pins = [s.version for s in req.specifier if s.operator in ("==", "===")]
                if pins:
                    key = f"{canonicalize_name(req.name)}=={pins[0]}"
                    self.declared.hashes.setdefault(key, []).extend(d.lower() for d in digests)

    def tox_ini(self) -> bool:
        """Read tox's ``[testenv] deps``; True when they name a requirements file."""
        path = self.repo / "tox.ini"
        text = self._load(path)
        if text is None:
            return False
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        try:
            parser.read_string(text)
        except configparser.Error:
            return False
        if not parser.has_option("testenv", "deps"):
            return False
        named = False
        for line in _lines(parser.get("testenv", "deps")):
            factor = _TOX_FACTOR.match(line)
            if factor:
                # A factor's own dependency is tox's to choose ("coverage: coverage"), except
                # the unit-test environment's ("unit: pytest"): that is how the tests run.
                names = {f.strip() for f in factor.group(0).strip().rstrip(":").split(",")}
                if not names <= {*_TEST_FACTORS, *self.groups}:
                    continue
                line = line[factor.end() :].strip()
            if "{" in line:
                continue  # a substitution: only tox knows what it becomes
            if line.startswith(("-r", "-c")):
                included = self.repo / line[2:].strip().lstrip("=")
                self.requirements_file(included)
                named = named or (line.startswith("-r") and included.is_file())
            elif not line.startswith("-"):
                self._check(line, "tox.ini")
                self.wanted.append((line, "tox.ini"))
        return named

    def noxfile(self) -> None:
        text = self._load(self.repo / "noxfile.py")
        if text is None:
            return
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return
        for node in ast.walk(tree):
            func = getattr(node, "func", None)
            if isinstance(node, ast.Call) and getattr(func, "attr", None) == "install":
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        value = arg.value.strip()
                        if value and not value.startswith(("-", ".")):
                            with _ignore_invalid():
                                Req(value)
                                self.wanted.append((value, "noxfile.py"))

    def uv_lock(self) -> None:
        text = self._load(self.repo / "uv.lock")
        if text is not None:
            self._lock(text, "uv.lock", lambda p: [p.get("sdist") or {}, *(p.get("wheels") or [])])

    def poetry_lock(self) -> None:
        text = self._load(self.repo / "poetry.lock")
        if text is not None:
            self._lock(text, "poetry.lock", lambda p: p.get("files") or [])

    def _lock(self, text: str, name: str, files: Any) -> None:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InvalidDeclaration(
                f"{display(self.repo / name)}: not valid TOML: {exc}"
            ) from None
        versions: dict[str, set[str]] = {}
        for package in data.get("package") or []:
            pkg, version = package.get("name"), package.get("version")
            if not (isinstance(pkg, str) and isinstance(version, str)):
                continue
            pkg = canonicalize_name(pkg)
            source = package.get("source") or {}
            if pkg == self.declared.project or "editable" in source or "virtual" in source:
                continue
            versions.setdefault(pkg, set()).add(version)
            digests = [
                str(f.get("hash", "")).removeprefix("sha256:").lower()
                for f in files(package)
                if str(f.get("hash", "")).startswith("sha256:")
            ]
            if digests:
                self.declared.hashes[f"{pkg}=={version}"] = digests
        # A package locked at one version per Python range (uv's resolution-markers: sphinx
        # 8.1 below 3.11, 9.0 on 3.11, 9.1 from 3.12) is left to pip, which knows the target's
        # Python; its hashes still hold whichever version pip picks.
        for pkg, found in versions.items():
            if len(found) == 1:
                self.declared.locked[pkg] = found.pop()

    def node(self) -> None:
        for lock in ("npm-shrinkwrap.json", "package-lock.json"):
            if (self.repo / "package.json").is_file() and (self.repo / lock).is_file():
                self._load(self.repo / "package.json")
                self._load(self.repo / lock)
                self.declared.node = lock
                return

    # -- result ----------------------------------------------------------------------------------

    def _check(self, spec: str, where: str) -> None:
        try:
            Req(spec)
        except InvalidRequirement as exc:
            raise InvalidDeclaration(f"{where}: not a requirement: {spec!r} ({exc})") from None

    def result(self) -> Declared:
        declared = self.declared
        project = declared.project
        chosen: list[tuple[str, str]] = list(self.own)
        extras = set(self.self_extras) | {g for g in self.groups if g in self.extras}
        todo = list(self.wanted)
        seen: set[tuple[str, str]] = set()
        while todo:
            spec, source = todo.pop(0)
            try:
                req = Req(spec)
            except InvalidRequirement as exc:
                raise InvalidDeclaration(f"{source}: not a requirement: {spec!r} ({exc})") from None
            if project and canonicalize_name(req.name) == project:
                extras |= {canonicalize_name(e) for e in req.extras}
                continue
            if (spec, source) not in seen:
                seen.add((spec, source))
                chosen.append((spec, source))
        for extra in sorted(extras):
            for spec, source in self.extras.get(extra, []):
                try:
                    req = Req(spec)
                except InvalidRequirement as exc:
                    raise InvalidDeclaration(
                        f"{source}: not a requirement: {spec!r} ({exc})"
                    ) from None
                if project and canonicalize_name(req.name) == project:
                    continue  # an extra that names the project again (all = [proj[a,b]])
                chosen.append((spec, source))
        for spec, source in chosen:
            req = Req(spec)
            name = canonicalize_name(req.name)
            pins = [
                s for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version
            ]
            declared.python.append(
                Requirement(spec=spec, source=source, pinned=bool(pins) or name in declared.locked)
            )
        if project:
            src = self.repo / "src"
            declared.paths = ["src"] if src.is_dir() and any(src.glob("*/__init__.py")) else ["."]
            declared.version = self._version()
        declared.sources = sorted(self.read)
        digest = hashlib.sha256()
        for rel in sorted(self.read):
            digest.update(rel.encode() + b"\0" + hashlib.sha256(self.read[rel]).digest())
        digest.update(",".join(self.groups).encode())
        digest.update((declared.version or "").encode())
        declared.inputs = digest.hexdigest()
        return declared


class _ignore_invalid:
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        return exc_type is not None and issubclass(exc_type, InvalidRequirement)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return _lines(value)
    if isinstance(value, list | tuple):
        return [v.strip() for v in value if isinstance(v, str) and v.strip()]
    return []


def _lines(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if line:
            out.append(line)
    return out


def _joined(text: str) -> list[str]:
    # Backslash continuations (hash lists) joined; line numbers kept for the first line.
    lines: list[str] = []
    pending = ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    if pending:
        lines.append(pending)
    return lines


def _extras(text: str) -> set[str]:
    return {canonicalize_name(e) for e in text.split(",") if e.strip()}


def _literal(node: ast.expr, names: dict[str, Any]) -> Any:
    if isinstance(node, ast.Name):
        return names.get(node.id)
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
