"""When each release of a package was published, from the user's own package index.

Resolving "as of" a date (a commit's, to test it with the tools of its time) needs upload
times, which only the index knows (the JSON simple API, PEP 691, with PEP 700's
``upload-time``). The host's pip has no ``--exclude-newer``, and a newer pip's
``--uploaded-prior-to`` lets everything from a local file index through (those carry no
times), so the resolver bounds each package itself (``bounds``). The index, certificates,
proxies and credentials are pip's own configuration: the query runs through pip's session.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

from hybrid.errors import DependencyError

_QUERY = r"""
import json, sys
from pip._internal.commands import create_command

command = create_command("download")
options, _ = command.parse_args([])
indexes = [u for u in [options.index_url, *options.extra_index_urls] if u.startswith("http")]
found = {}
with command.main_context():
    session = command.get_default_session(options)
    for name in json.loads(sys.stdin.read()):
        times = {}
        for index in indexes:
            try:
                answer = session.get(
                    f"{index.rstrip('/')}/{name}/",
                    headers={"Accept": "application/vnd.pypi.simple.v1+json"},
                    timeout=60,
                )
            except Exception:
                continue
            if answer.status_code != 200 or "json" not in answer.headers.get("content-type", ""):
                continue
            for row in answer.json().get("files", []):
                if row.get("upload-time"):
                    times[row["filename"]] = row["upload-time"]
            if times:
                break
        found[name] = times
print(json.dumps(found))
"""

# name -> version -> when its first file was published; {} when the index gives no times.
_known: dict[str, dict[Version, datetime]] = {}


def published(names: list[str]) -> dict[str, dict[Version, datetime]]:
    """Each package's releases and when each was first published (empty when unknown)."""
    wanted = sorted({canonicalize_name(n) for n in names} - _known.keys())
    if wanted:
        done = subprocess.run(
            [sys.executable, "-c", _QUERY],
            input=json.dumps(wanted),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise DependencyError(f"could not read release dates from the package index: {last}")
        for name, files in json.loads(done.stdout).items():
            releases: dict[Version, datetime] = {}
            for filename, when in files.items():
                version = _version(filename)
                if version is None:
                    continue
                at = datetime.fromisoformat(when)
                releases[version] = min(at, releases.get(version, at))
            _known[name] = releases
    return {canonicalize_name(n): _known[canonicalize_name(n)] for n in names}


def too_new(resolved: dict[str, str], before: datetime) -> list[str]:
    """The packages of ``resolved`` (name -> version) at a release published after ``before``."""
    known = published(list(resolved))
    late = []
    for name, version in resolved.items():
        at = known[canonicalize_name(name)].get(Version(version))
        if at is not None and at > before:
            late.append(name)
    return late


def bound(name: str, before: datetime) -> str | None:
    """A specifier that leaves out ``name``'s releases published after ``before``, or None when
    none was published by then (the package did not exist: what needs it is what is too new)."""
    releases = published([name])[canonicalize_name(name)]
    kept = [v for v, at in releases.items() if at <= before]
    if not kept:
        return None
    # A pre-release named in a specifier lets pip choose pre-releases: bound by a final one.
    newest = max([v for v in kept if not v.is_prerelease] or kept)
    # Releases below the newest kept one published later are backports of an older line.
    later = sorted(v for v, at in releases.items() if at > before and v < newest)
    return ",".join([f"<={newest}", *(f"!={v}" for v in later)])


def _version(filename: str) -> Version | None:
    try:
        return parse_wheel_filename(filename)[1]
    except InvalidWheelFilename:
        pass
    try:
        return parse_sdist_filename(filename)[1]
    except InvalidSdistFilename:
        return None
