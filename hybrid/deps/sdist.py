"""Packages published without a wheel: fetched as source on the host, built inside the sandbox.

pip refuses source distributions when it resolves for another interpreter and platform, and
building one's metadata on the host would run its setup code here. So a package with no wheel
is downloaded as-is through pip's own finder (the user's index, find-links and certificates;
nothing is built), its dependencies and build requirements are read from the archive without
running it (PKG-INFO, egg-info/requires.txt, pyproject.toml), and a metadata-only stand-in
wheel lets pip resolve the rest of the tree around it. The stand-in never enters the sandbox:
the source archive does, and ``pip install --no-index`` builds it there, offline.
"""

from __future__ import annotations

import email.parser
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from hybrid.errors import DependencyError

# pip's finder and downloader, driven by pip's own option parser (so its configuration applies).
_FETCH = r"""
import sys
from pip._internal.commands import create_command
from pip._internal.network.download import Downloader
from pip._internal.req.constructors import install_req_from_line

spec, dest = sys.argv[1], sys.argv[2]
command = create_command("download")
options, _ = command.parse_args(["--no-binary", ":all:", "--no-deps", "-d", dest, spec])
with command.main_context():
    session = command.get_default_session(options)
    finder = command._build_package_finder(options=options, session=session)
    req = install_req_from_line(spec)
    best = finder.find_best_candidate(req.name, req.specifier).best_candidate
    if best is None or not best.link.is_existing_dir() and best.link.is_wheel:
        sys.exit(f"no source distribution of {spec}")
    try:
        download = Downloader(session, progress_bar="off")
    except TypeError:
        download = Downloader(session, progress_bar="off", resume_retries=0)
    path, _ = download(best.link, dest)
    want = best.link.hash_name and best.link.hash
    if want:
        import hashlib
        with open(path, "rb") as f:
            if hashlib.new(best.link.hash_name, f.read()).hexdigest() != best.link.hash:
                sys.exit(f"{best.link.filename}: hash does not match the index's")
    print(path)
"""
_DEFAULT_BUILD = ["setuptools>=40.8.0", "wheel"]


class Source:
    """A downloaded source distribution and what it declares, read without running it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = ""
        self.version = ""
        self.requires: list[str] = []
        self.requires_python = ""
        self.build_requires: list[str] = list(_DEFAULT_BUILD)
        self._read()

    def _members(self) -> dict[str, bytes]:
        wanted = re.compile(r"^[^/]+/(PKG-INFO|pyproject\.toml|[^/]*\.egg-info/requires\.txt)$")
        found: dict[str, bytes] = {}
        name = self.path.name
        if name.endswith(".zip"):
            with zipfile.ZipFile(self.path) as archive:
                for item in archive.namelist():
                    if wanted.match(item) or re.match(r"^[^/]+/src/[^/]+\.egg-info/requires", item):
                        found[item.split("/", 1)[1]] = archive.read(item)
        else:
            with tarfile.open(self.path) as archive:
                for member in archive:
                    key = member.name.lstrip("./")
                    if member.isfile() and (
                        wanted.match(key) or re.match(r"^[^/]+/src/[^/]+\.egg-info/requires", key)
                    ):
                        data = archive.extractfile(member)
                        if data is not None:
                            found[key.split("/", 1)[1]] = data.read(1 << 20)
        return found

    def _read(self) -> None:
        members = self._members()
        info = members.get("PKG-INFO")
        if info is None:
            raise DependencyError(f"{self.path.name}: no PKG-INFO: not a source distribution")
        meta = email.parser.BytesParser().parsebytes(info)
        self.name = canonicalize_name(meta.get("Name", ""))
        self.version = meta.get("Version", "")
        self.requires_python = meta.get("Requires-Python", "")
        dynamic = {d.lower() for d in meta.get_all("Dynamic") or []}
        declared = meta.get_all("Requires-Dist") or []
        try:
            modern = Version(meta.get("Metadata-Version", "1.0")) >= Version("2.2")
        except InvalidVersion:
            modern = False
        static = modern and "requires-dist" not in dynamic
        if declared and static:
            self.requires = [r for r in declared if "extra ==" not in r]
        else:
            text = next((v for k, v in members.items() if k.endswith("egg-info/requires.txt")), b"")
            self.requires = _requires_txt(text.decode("utf-8", "replace")) or [
                r for r in declared if "extra ==" not in r
            ]
        if "pyproject.toml" in members:
            try:
                data = tomllib.loads(members["pyproject.toml"].decode("utf-8", "replace"))
            except tomllib.TOMLDecodeError:
                data = {}
            build = (data.get("build-system") or {}).get("requires")
            if isinstance(build, list):
                self.build_requires = [b for b in build if isinstance(b, str)]

    def stand_in(self, directory: Path) -> Path:
        """A metadata-only wheel carrying this package's name, version and requirements."""
        return stand_in(directory, self.name, self.version, self.requires, self.requires_python)


def stand_in(
    directory: Path,
    name: str,
    version: str,
    requires: list[str] | None = None,
    requires_python: str | None = None,
) -> Path:
    """A metadata-only wheel of ``name`` ``version`` in ``directory``: pip resolves around it
    (its requirements, and what other packages require of it) and it never enters."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = directory / f"{dist}-py3-none-any.whl"
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if requires_python:
        lines.append(f"Requires-Python: {requires_python}")
    lines += [f"Requires-Dist: {r}" for r in requires or []]
    wheel = "Wheel-Version: 1.0\nGenerator: hybrid\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{dist}.dist-info/METADATA", "\n".join(lines) + "\n")
        archive.writestr(f"{dist}.dist-info/WHEEL", wheel)
        archive.writestr(f"{dist}.dist-info/RECORD", "")
    return path


def _requires_txt(text: str) -> list[str]:
    out: list[str] = []
    marker = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            extra, _, cond = section.partition(":")
            marker = "skip" if extra else cond
            continue
        if marker == "skip":
            continue
        out.append(f"{line}; {marker}" if marker else line)
    return out


def fetch(spec: str, dest: Path, *, cwd: Path | None = None) -> Source:
    """The best source distribution for ``spec`` from the user's configured index, unbuilt."""
    try:
        req = Requirement(spec)
    except InvalidRequirement:
        raise DependencyError(f"{spec[:100]!r} is not a requirement") from None
    if req.url:
        # pip would build it to learn its metadata: never on the host.
        raise DependencyError(f"{req.name} is a direct reference: refused")
    done = subprocess.run(
        [sys.executable, "-c", _FETCH, str(req), str(dest)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        cwd=cwd or dest,
    )
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise DependencyError(f"{spec} has no wheel and its source could not be fetched: {why}")
    return Source(Path(done.stdout.strip().splitlines()[-1]))


def missing(stderr: str) -> str | None:
    """The requirement pip found no wheel for, from its error output."""
    match = re.search(r"No matching distribution found for (\S+)", stderr)
    return match.group(1) if match else None
