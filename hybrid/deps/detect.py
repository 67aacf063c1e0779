"""What a repository declares about its dependencies, read statically (no project code runs).

Python: ``pyproject.toml`` (dependencies, the test extras and dependency groups),
``requirements*.txt``, ``setup.cfg``, literal arguments of ``setup()`` in ``setup.py``, test
deps of ``tox.ini`` and ``noxfile.py``; pins from ``uv.lock`` / ``poetry.lock``. Node:
``package.json`` with ``package-lock.json`` or ``npm-shrinkwrap.json``.

Every file is read through ``hybrid.deps.files`` (a regular file inside the repository, reached
without following a link, bounded) and every entry through ``hybrid.deps.screen``: a link out of
the repository, an include outside it, a direct reference (URL, VCS, local path) or an index
option is refused (PolicyViolation listing each, by file and line, never quoting the file).
"""

from __future__ import annotations

import ast
import configparser
import contextlib
import fnmatch
import hashlib
import posixpath
import re
import subprocess
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement as Req
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from hybrid import git
from hybrid.deps import files, screen
from hybrid.deps.models import Declared, Requirement
from hybrid.errors import InvalidDeclaration, InvalidInput, PolicyViolation
from hybrid.paths import display

_TOX_FACTOR = re.compile(r"^!?[\w.-]+(,!?[\w.-]+)*:\s")  # "coverage: coverage", "py38,py39: x"
_TEST_FACTORS = {"unit", "test", "tests", "testing", "pytest"}
_LOCAL_SOURCE = {"path", "git", "url", "file", "workspace"}  # poetry's and uv's source keys
_SKIP_REQ = re.compile(r"(docs?|doc-|lint|typecheck|release|publish)", re.IGNORECASE)


def detect(repo: Path, groups: Iterable[str] = ("test", "tests", "testing", "dev")) -> Declared:
    """Everything ``repo`` declares; InvalidDeclaration names the file and line of a malformed
    entry, PolicyViolation every entry or file that may not be read or fetched."""
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
        for rel in reader.requirement_files():
            if not _SKIP_REQ.search(rel.rsplit("/", 1)[-1]):
                reader.requirements_file(rel)
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
        self.refused: list[str] = []  # every entry or file refused, one line each
        self.sourced: dict[str, str] = {}  # name -> where a path/git/url source is declared

    # -- files ---------------------------------------------------------------------------------

    def _load(self, rel: str) -> str | None:
        """The text of ``rel`` (None when absent, already read, or refused: see files.read)."""
        try:
            rel = files.inside(rel)
            if rel in self.read:
                return None  # each file once (a -r cycle ends here)
            data = files.read(self.repo, rel)
        except files.Unreadable as exc:
            self.refused.append(f"deps: {exc}: not read, refused")
            return None
        if data is None:
            return None
        self.read[rel] = data
        return data.decode("utf-8", errors="replace")

    def requirement_files(self) -> list[str]:
        """requirements*.txt, requirements/*.txt and *requirements*/*.txt, listed without
        following a link (a linked directory is refused, not listed)."""
        found: list[str] = []
        try:
            top = files.names(self.repo)
        except files.Unreadable as exc:
            self.refused.append(f"deps: {exc}: not read, refused")
            return []
        found += [n for n in top if fnmatch.fnmatchcase(n, "requirements*.txt")]
        directories = [n for n in top if fnmatch.fnmatchcase(n, "*requirements*")]
        # requirements/ first, as before: the order the requirements are listed in.
        directories.sort(key=lambda n: n != "requirements")
        for directory in directories:
            kind = files.kind(self.repo, directory)
            if kind == "link":
                self.refused.append(
                    f"deps: {files.shown(directory)} is a symbolic link: not read, refused"
                )
            elif kind == "dir":
                try:
                    inner = files.names(self.repo, directory)
                except files.Unreadable as exc:
                    self.refused.append(f"deps: {exc}: not read, refused")
                    continue
                found += [f"{directory}/{n}" for n in inner if n.endswith(".txt")]
        return found

    def _version(self) -> str | None:
        """The release the checkout is at: a version its files state, else an sdist's PKG-INFO,
        else its latest git tag (setuptools-scm and hatch-vcs projects)."""
        stated = list(self.versions)
        text = self._load("PKG-INFO") or ""
        stated += [line[8:].strip() for line in text.splitlines() if line.startswith("Version:")]
        if (self.repo / ".git").exists():
            stated.append(tag_release(self.repo) or "")
        for version in stated:
            # The release itself: what a dependent's specifier matches (1.4.0.dev3 and
            # 1.4.0+local are not, as pre and local releases).
            with contextlib.suppress(InvalidVersion, TypeError):
                return Version(version).base_version
        return None

    def pyproject(self) -> None:
        path = self.repo / "pyproject.toml"
        text = self._load("pyproject.toml")
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
            self._project(name, "pyproject.toml")
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
        tables = [poetry.get("dependencies"), poetry.get("dev-dependencies")]
        for group, body in (poetry.get("group") or {}).items():
            if canonicalize_name(group) in self.groups and isinstance(body, dict):
                tables.append(body.get("dependencies"))
        for table in tables:
            for dep, value in table.items() if isinstance(table, dict) else ():
                if dep.lower() != "python":
                    self.wanted.append((dep, "pyproject.toml"))
                    self._source(dep, value, "[tool.poetry] dependencies")
        # A name uv takes from a path, git, a URL or a workspace member: by name from the index
        # it would be some other package of that name, and from its source a build here.
        uv = ((data.get("tool") or {}).get("uv") or {}).get("sources") or {}
        for dep, value in uv.items() if isinstance(uv, dict) else ():
            self._source(str(dep), value, "[tool.uv.sources]")

    def _source(self, dep: str, value: Any, table: str) -> None:
        """Record ``dep`` as refused when ``table`` gives it a source other than an index."""
        entries = value if isinstance(value, list) else [value]
        for entry in entries:
            if isinstance(entry, dict) and _LOCAL_SOURCE & set(entry):
                kind = sorted(_LOCAL_SOURCE & set(entry))[0]
                self.sourced[canonicalize_name(dep)] = f"pyproject.toml {table}: {kind}"

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
        text = self._load("setup.cfg")
        if text is None:
            return
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(text)
        except configparser.Error as exc:
            # configparser's message quotes the offending line: name the line, never its text.
            line = getattr(exc, "lineno", None)
            where = f" (line {line})" if isinstance(line, int) else ""
            raise InvalidDeclaration(
                f"{display(self.repo / 'setup.cfg')}: not a valid setup.cfg{where}"
            ) from None
        if parser.has_option("metadata", "name") and not self.declared.project:
            self._project(parser.get("metadata", "name"), "setup.cfg")
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
        text = self._load("setup.py")
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
                    self._project(value, "setup.py")
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

    def requirements_file(self, rel: str) -> None:
        text = self._load(rel)
        if text is None:
            return
        rel = files.inside(rel)
        for number, line in enumerate(_joined(text), 1):
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            if line:
                self._requirement_line(line, f"{rel}:{number}", posixpath.dirname(rel))

    def _requirement_line(self, line: str, where: str, base: str) -> None:
        """One line of a requirements file (or of tox's deps): an include read inside the
        repository, the project itself, a requirement; anything else is refused."""
        if line.startswith("-"):
            name, value = _option(line)
            if name in ("-r", "--requirement", "-c", "--constraint"):
                self._include(value, where, base)
            elif name in ("-e", "--editable") and screen.is_self(value):
                self._self(value)
            elif problem := screen.option(name, where):
                self.refused.append(problem)
            return
        if screen.is_self(line):
            self._self(line)
            return
        spec = line.split(" --hash", 1)[0].split(" \\", 1)[0].strip()
        if not self._check(spec, where):
            return
        self.wanted.append((spec, where.rsplit(":", 1)[0]))
        digests = re.findall(r"--hash[= ]sha256:([0-9a-fA-F]{64})", line)
        if digests:
            req = Req(spec)
            pins = [s.version for s in req.specifier if s.operator in ("==", "===")]
            if pins:
                key = f"{canonicalize_name(req.name)}=={pins[0]}"
                self.declared.hashes.setdefault(key, []).extend(d.lower() for d in digests)

    def _include(self, value: str, where: str, base: str) -> str | None:
        """``-r FILE`` / ``-c FILE``: relative to the including file, inside the repository
        (what it names, or None when refused)."""
        if not value:
            self.refused.append(f"deps: {where}: an include without a file: refused")
            return None
        try:
            rel = files.inside(posixpath.join(base, value))  # an absolute value stays absolute
        except files.Unreadable as exc:
            self.refused.append(f"deps: {where}: {exc}: not read, refused")
            return None
        self.requirements_file(rel)
        return rel

    def _self(self, text: str) -> None:
        extras = re.search(r"\[([^\]]*)\]", text)
        self.self_extras.update(_extras(extras.group(1) if extras else ""))

    def tox_ini(self) -> bool:
        """Read tox's ``[testenv] deps``; True when they name a requirements file."""
        text = self._load("tox.ini")
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
            option, value = _option(line) if line.startswith("-") else ("", "")
            if option in ("-r", "--requirement", "-c", "--constraint"):
                rel = self._include(value, "tox.ini", "")
                named = named or (option in ("-r", "--requirement") and rel in self.read)
            elif option in ("-e", "--editable") and screen.is_self(value):
                continue  # the project itself, as tox installs it
            elif screen.is_self(line):
                continue
            else:
                self._requirement_line(line, "tox.ini", "")
        return named

    def noxfile(self) -> None:
        text = self._load("noxfile.py")
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
                        if not value or value.startswith("-") or screen.is_self(value):
                            continue
                        # nox passes these to pip as they are: a URL or path is refused,
                        # anything else that is no requirement is nox's own (a session name).
                        where = f"noxfile.py:{node.lineno}"
                        req, problem = screen.requirement(value, where)
                        if problem:
                            self.refused.append(problem)
                        elif req is not None:
                            self.wanted.append((value, "noxfile.py"))

    def uv_lock(self) -> None:
        text = self._load("uv.lock")
        if text is not None:
            self._lock(text, "uv.lock", lambda p: [p.get("sdist") or {}, *(p.get("wheels") or [])])

    def poetry_lock(self) -> None:
        text = self._load("poetry.lock")
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
            if not isinstance(package, dict):
                continue
            pkg, version = package.get("name"), package.get("version")
            if not (isinstance(pkg, str) and isinstance(version, str)):
                continue
            if not (screen.valid_name(pkg) and screen.valid_version(version)):
                # Pins are written into pip's constraints file: only a name and a version.
                self.refused.append(
                    f"deps: {name}: a package entry that is not a name and a version: refused"
                )
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
        if files.kind(self.repo, "package.json") is None:
            return
        for lock in ("npm-shrinkwrap.json", "package-lock.json"):
            if files.kind(self.repo, lock) is not None:
                # A link or a FIFO by either name is refused by _load, not skipped.
                if self._load("package.json") is not None and self._load(lock) is not None:
                    self.declared.node = lock
                return

    def _project(self, name: str, where: str) -> None:
        if screen.valid_name(name):
            self.declared.project = canonicalize_name(name)
        else:
            self.refused.append(f"deps: {where}: the project name is not a valid name: refused")

    # -- result ----------------------------------------------------------------------------------

    def _check(self, spec: str, where: str) -> bool:
        """Whether ``spec`` is a requirement that may be fetched (a refusal is recorded)."""
        req, problem = screen.requirement(spec, where)
        if problem:
            self.refused.append(problem)
            return False
        if req is None:
            # The text is the repository's, and may be a host file's through a hard link.
            raise InvalidDeclaration(f"{where}: not a requirement (PEP 508)")
        return True

    def _screened(self, specs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The specs that may be resolved (each refusal recorded; a malformed one raises)."""
        return [(spec, source) for spec, source in specs if self._check(spec, source)]

    def result(self) -> Declared:
        declared = self.declared
        project = declared.project
        chosen: list[tuple[str, str]] = self._screened(self.own)
        extras = set(self.self_extras) | {g for g in self.groups if g in self.extras}
        todo = self._screened(self.wanted)
        seen: set[tuple[str, str]] = set()
        while todo:
            spec, source = todo.pop(0)
            req = Req(spec)
            if project and canonicalize_name(req.name) == project:
                extras |= {canonicalize_name(e) for e in req.extras}
                continue
            if (spec, source) not in seen:
                seen.add((spec, source))
                chosen.append((spec, source))
        for extra in sorted(extras):
            for spec, source in self._screened(self.extras.get(extra, [])):
                req = Req(spec)
                if project and canonicalize_name(req.name) == project:
                    continue  # an extra that names the project again (all = [proj[a,b]])
                chosen.append((spec, source))
        for spec, source in chosen:
            req = Req(spec)
            name = canonicalize_name(req.name)
            if name in self.sourced:
                self.refused.append(
                    f"deps: {req.name} has a source that is not an index "
                    f"({self.sourced[name]}): refused, only packages from the configured index "
                    "are fetched"
                )
                continue
            pins = [
                s for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version
            ]
            declared.python.append(
                Requirement(spec=spec, source=source, pinned=bool(pins) or name in declared.locked)
            )
        if project:
            src = self.repo / "src"
            package = files.kind(self.repo, "src") == "dir" and any(src.glob("*/__init__.py"))
            declared.paths = ["src"] if package else ["."]
            declared.version = self._version()
        if self.refused:
            raise PolicyViolation(list(dict.fromkeys(self.refused)))
        declared.sources = sorted(self.read)
        digest = hashlib.sha256()
        for rel in sorted(self.read):
            digest.update(rel.encode() + b"\0" + hashlib.sha256(self.read[rel]).digest())
        digest.update(",".join(self.groups).encode())
        digest.update((declared.version or "").encode())
        declared.inputs = digest.hexdigest()
        return declared


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


def _option(line: str) -> tuple[str, str]:
    """(option, value) of an option line: ``-r x``, ``-rx``, ``--requirement=x``."""
    if line.startswith("--"):
        match = re.match(r"^(--[^=\s]+)(?:[=\s]\s*(.*))?$", line)
        return (match.group(1), (match.group(2) or "").strip()) if match else (line, "")
    return line[:2], line[2:].strip().lstrip("=").strip()


def _extras(text: str) -> set[str]:
    return {canonicalize_name(e) for e in text.split(",") if e.strip()}


def _literal(node: ast.expr, names: dict[str, Any]) -> Any:
    if isinstance(node, ast.Name):
        return names.get(node.id)
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
