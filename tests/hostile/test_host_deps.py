"""Hostile dependency declarations against the host (issue 29, items 4-6).

A repository's declarations and lockfiles must never run project code on the host, read a host
file, or point the host's pip or npm anywhere. Each attack is a real repository in tmp_path:

- direct references (``file://`` directory, an sdist on a loopback HTTP server, ``git+file://``)
  in every declaration format; the package's setup.py writes a marker file if it ever runs;
- options in requirements files that would point pip at the loopback server;
- declaration files that are links out of the repository (a host file with a unique marker,
  ``/proc/self/environ`` with a marker variable, ``/etc/shadow``), a directory replaced by a
  link, a hard link, a FIFO, and ``-r`` includes outside the repository;
- npm lockfile entries that are ``file:``, ``link:``, ``git+ssh:``, loopback URLs or have no
  integrity.

Run through ``hybrid deps show``, ``hybrid deps lock`` (with and without ``--approved``) and the
library calls ``ws up --deps`` and ``validate`` make (``detect`` then ``lock``; with the engine,
``deps.up`` and ``validate`` themselves). After each: no marker, no request to the loopback
servers, no host content in any output, one line, a non-zero exit, no traceback.
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import io
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hybrid import deps
from hybrid.deps import store
from hybrid.deps.models import Declared, Requirement, Target
from hybrid.errors import HybridError, PolicyViolation

pytestmark = pytest.mark.timeout(300)

TARGET = Target(python="3.11", glibc="2.36", machine="x86_64")
"""The base image's interpreter and platform: what ``ws up --deps`` resolves for, without asking
the engine (``lock`` is the call that would fetch)."""

ROOT = Path(deps.__file__).resolve().parents[2]
"""The checkout whose hybrid this session imports (the CLI children run the same code)."""


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """This module attacks the host side only: no tier, so none of the suite's per-tier drivers
    (this replaces the suite's autouse fixture of the same name, which needs one)."""
    yield


# -- the attacker's material ------------------------------------------------------------------


class Recorder:
    """A loopback HTTP server serving one sdist, and a raw TCP port for git+ssh; both record
    every connection."""

    def __init__(self, root: Path) -> None:
        self.requests: list[str] = []
        self.connections = 0
        recorder = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

            def log_message(self, *args: object) -> None:
                recorder.requests.append(self.path)

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.raw = socket.create_server(("127.0.0.1", 0))
        self.raw_port = self.raw.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.raw.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.raw.close()

    def untouched(self) -> bool:
        return not self.requests and not self.connections


class Attack:
    """Everything one case needs: the evil package in three forms, the servers, the markers."""

    def __init__(self, tmp: Path, recorder: Recorder) -> None:
        self.tmp = tmp
        self.recorder = recorder
        self.token = "h3host" + secrets.token_hex(6)
        self.markers = tmp / "markers"
        self.markers.mkdir()
        setup = (
            f"open({str(self.markers / 'ran')!r}, 'w').write('setup.py ran')\n"
            "from setuptools import setup\nsetup(name='evilpkg', version='1.0')\n"
        )
        self.package = tmp / "evilpkg"
        self.package.mkdir()
        (self.package / "setup.py").write_text(setup)
        self.git = tmp / "evilgit"
        self.git.mkdir()
        (self.git / "setup.py").write_text(setup)
        git = ["git", "-C", str(self.git), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", "evil"], check=True)
        served = tmp / "served"
        served.mkdir(exist_ok=True)
        with tarfile.open(served / "evilpkg-1.0.tar.gz", "w:gz") as tar:
            tar.add(self.package / "setup.py", "evilpkg-1.0/setup.py")
            info = b"Metadata-Version: 2.1\nName: evilpkg\nVersion: 1.0\n"
            member = tarfile.TarInfo("evilpkg-1.0/PKG-INFO")
            member.size = len(info)
            tar.addfile(member, io.BytesIO(info))
        # A host file outside the repository, its content a valid requirement carrying the token.
        self.outside = tmp / "outside.txt"
        self.outside.write_text(f"{self.token}-req==1.0\n")
        self.outside_dir = tmp / "outside-dir"
        self.outside_dir.mkdir()
        (self.outside_dir / "base.txt").write_text(f"{self.token}-dir==1.0\n")
        self.repo = tmp / "repo"
        self.repo.mkdir()
        self.approved = tmp / "approved.json"
        self.approved.write_text(json.dumps({"artifacts": []}))

    def url(self, kind: str) -> str:
        return {
            "file": f"file://{self.package}",
            "http": f"http://127.0.0.1:{self.recorder.port}/evilpkg-1.0.tar.gz",
            "git": f"git+file://{self.git}",
        }[kind]

    def write(self, files: dict[str, str]) -> None:
        for rel, text in files.items():
            path = self.repo / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def ran(self) -> list[str]:
        return sorted(p.name for p in self.markers.iterdir())


@pytest.fixture
def attack(tmp_path: Path) -> Iterator[Attack]:
    (tmp_path / "served").mkdir()
    recorder = Recorder(tmp_path / "served")
    made = Attack(tmp_path, recorder)
    yield made
    recorder.close()


def _one_clear_line(code: int, out: str, err: str, *secrets_: str) -> None:
    text = out + err
    assert code != 0, f"exit 0: {text[-2000:]}"
    assert "Traceback" not in text, text[-2000:]
    assert "refused" in err, err
    assert len(err.strip().splitlines()) == 1, err
    for secret in secrets_:
        assert secret not in text, f"host content in the output: {text[-2000:]}"


def _every_entry_point(
    attack: Attack, hybrid_cli: Callable[..., tuple[int, str, str]], *secrets_: str
) -> None:
    """deps show, deps lock (with and without --approved) and the library's detect + lock."""
    repo = str(attack.repo)
    for args in (
        ("deps", "show", repo),
        ("deps", "lock", repo),
        ("deps", "lock", repo, "--approved", str(attack.approved)),
    ):
        _one_clear_line(*hybrid_cli(*args), *secrets_)
    with pytest.raises(HybridError) as refused:
        deps.lock(attack.repo, deps.detect(attack.repo), TARGET)
    assert "refused" in str(refused.value)
    for secret in secrets_:
        assert secret not in str(refused.value)
    assert attack.ran() == [], "the package's setup.py ran on the host"
    assert attack.recorder.untouched(), (
        f"the host fetched from the repository's server: {attack.recorder.requests}"
    )


# -- item 4: direct references never reach pip --------------------------------------------------

FORMATS: dict[str, Callable[[str], dict[str, str]]] = {
    "requirements.txt": lambda spec: {"requirements.txt": f"six\n{spec}\n"},
    "requirements -r": lambda spec: {
        "requirements.txt": "-r more/dev.txt\n",
        "more/dev.txt": f"{spec}\n",
    },
    "pyproject dependencies": lambda spec: {
        "pyproject.toml": f'[project]\nname = "demo"\nversion = "0.1"\n'
        f"dependencies = [{json.dumps(spec)}]\n"
    },
    "pyproject optional-dependencies": lambda spec: {
        "pyproject.toml": f'[project]\nname = "demo"\nversion = "0.1"\n'
        f"[project.optional-dependencies]\ntest = [{json.dumps(spec)}]\n"
    },
    "setup.cfg": lambda spec: {
        "setup.cfg": f"[metadata]\nname = demo\n[options]\ninstall_requires =\n    {spec}\n"
    },
    "setup.py": lambda spec: {
        "setup.py": f"from setuptools import setup\nsetup(name='demo', install_requires=[{spec!r}])\n"
    },
    "tox.ini": lambda spec: {"tox.ini": f"[testenv]\ndeps =\n    pytest\n    {spec}\n"},
    "noxfile.py": lambda spec: {
        "noxfile.py": f"import nox\n\n@nox.session\ndef tests(session):\n    session.install({spec!r})\n"
    },
}


@pytest.mark.parametrize("kind", ["file", "http", "git"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_direct_reference_is_refused_before_anything_is_fetched(
    attack: Attack, hybrid_cli: Callable[..., tuple[int, str, str]], fmt: str, kind: str
) -> None:
    attack.write(FORMATS[fmt](f"evilpkg @ {attack.url(kind)}"))
    _every_entry_point(attack, hybrid_cli)


@pytest.mark.parametrize(
    "line",
    [
        "git+file://{git}#egg=evilpkg",
        "http://127.0.0.1:{port}/evilpkg-1.0.tar.gz",
        "{package}",
        "-e {package}",
        "-e git+file://{git}#egg=evilpkg",
        "./vendored",
        "evilpkg-1.0.tar.gz",
    ],
)
@pytest.mark.parametrize("fmt", ["requirements.txt", "tox.ini"])
def test_a_url_path_or_vcs_line_is_refused(
    attack: Attack, hybrid_cli: Callable[..., tuple[int, str, str]], fmt: str, line: str
) -> None:
    (attack.repo / "vendored").mkdir()
    (attack.repo / "vendored" / "setup.py").write_text((attack.package / "setup.py").read_text())
    (attack.repo / "evilpkg-1.0.tar.gz").write_bytes(
        (attack.tmp / "served" / "evilpkg-1.0.tar.gz").read_bytes()
    )
    text = line.format(git=attack.git, port=attack.recorder.port, package=attack.package)
    attack.write(FORMATS[fmt](text))
    _every_entry_point(attack, hybrid_cli)


@pytest.mark.parametrize(
    "option",
    [
        "--index-url http://127.0.0.1:{port}/simple",
        "-i http://127.0.0.1:{port}/simple",
        "--extra-index-url=http://127.0.0.1:{port}/simple",
        "-f http://127.0.0.1:{port}/",
        "--find-links {served}",
        "--trusted-host 127.0.0.1",
        "--no-index",
    ],
)
def test_an_index_or_link_option_in_a_requirements_file_is_refused(
    attack: Attack, hybrid_cli: Callable[..., tuple[int, str, str]], option: str
) -> None:
    text = option.format(port=attack.recorder.port, served=attack.tmp / "served")
    attack.write({"requirements.txt": f"{text}\nevilpkg\n"})
    _every_entry_point(attack, hybrid_cli)


@pytest.mark.parametrize(
    "table",
    [
        '[tool.poetry]\nname = "demo"\n[tool.poetry.dependencies]\nevilpkg = {{ path = "{package}" }}\n',
        '[tool.poetry]\nname = "demo"\n[tool.poetry.group.test.dependencies]\n'
        'evilpkg = {{ git = "file://{git}" }}\n',
        '[project]\nname = "demo"\ndependencies = ["evilpkg"]\n'
        '[tool.uv.sources]\nevilpkg = {{ path = "{package}" }}\n',
        '[project]\nname = "demo"\ndependencies = ["evilpkg"]\n'
        '[tool.uv.sources]\nevilpkg = {{ url = "http://127.0.0.1:{port}/evilpkg-1.0.tar.gz" }}\n',
    ],
    ids=["poetry path", "poetry git", "uv path", "uv url"],
)
def test_a_path_git_or_url_source_table_is_refused(
    attack: Attack, hybrid_cli: Callable[..., tuple[int, str, str]], table: str
) -> None:
    """Poetry's and uv's source tables: the name is neither built from its source here nor
    taken from the index as whatever else bears it."""
    text = table.format(package=attack.package, git=attack.git, port=attack.recorder.port)
    attack.write({"pyproject.toml": text})
    _every_entry_point(attack, hybrid_cli)


def test_lock_refuses_a_direct_reference_it_is_handed(attack: Attack) -> None:
    """``lock`` is public: a Declared built by a caller is screened again before pip runs."""
    declared = Declared(
        python=[Requirement(spec=f"evilpkg @ {attack.url('file')}", source="x", pinned=False)]
    )
    with pytest.raises(PolicyViolation, match="direct reference"):
        deps.lock(attack.repo, declared, TARGET)
    injected = Declared(project="demo\n--index-url http://127.0.0.1:1/", version="1.0")
    with pytest.raises(PolicyViolation, match="project name"):
        deps.lock(attack.repo, injected, TARGET)
    assert attack.ran() == []


def test_a_lockfile_pin_cannot_carry_an_option_into_pip(
    attack: Attack, hybrid_cli: Callable[..., tuple[int, str, str]]
) -> None:
    url = f"http://127.0.0.1:{attack.recorder.port}/simple"
    attack.write(
        {
            "pyproject.toml": '[project]\nname = "demo"\ndependencies = ["six"]\n',
            "uv.lock": f'[[package]]\nname = "six"\nversion = "1.16.0\\n--index-url {url}"\n',
        }
    )
    _every_entry_point(attack, hybrid_cli, url)


# -- item 5: no host file is read through a declaration ------------------------------------------


def _shadow_line() -> str | None:
    with contextlib.suppress(OSError):
        first = Path("/etc/shadow").read_text().splitlines()[0]
        return first if len(first) > 8 else None
    return None


@pytest.mark.parametrize(
    "case",
    [
        "tox -r outside",
        "tox -r absolute",
        "tox -r /etc/hostname",
        "requirements -r outside",
        "requirements.txt link",
        "requirements.txt link to /etc/shadow",
        "pyproject.toml link",
        "linked requirements directory",
        "include through a linked directory",
        "hard link",
        "package.json link",
        "package-lock.json link",
        "PKG-INFO link",
    ],
)
def test_a_declaration_never_reads_a_host_file(
    attack: Attack, hybrid_cli: Callable[..., tuple[int, str, str]], case: str
) -> None:
    repo, outside = attack.repo, attack.outside
    secrets_ = [attack.token]
    if case == "tox -r outside":
        attack.write({"tox.ini": "[testenv]\ndeps =\n    -r../outside.txt\n"})
    elif case == "tox -r absolute":
        attack.write({"tox.ini": f"[testenv]\ndeps =\n    -r{outside}\n"})
    elif case == "tox -r /etc/hostname":
        attack.write({"tox.ini": "[testenv]\ndeps =\n    -r/etc/hostname\n"})
        hostname = Path("/etc/hostname").read_text().strip()
        secrets_ += [hostname] if len(hostname) >= 6 else []
    elif case == "requirements -r outside":
        attack.write({"requirements.txt": "six\n-r ../outside.txt\n"})
    elif case == "requirements.txt link":
        (repo / "requirements.txt").symlink_to(outside)
    elif case == "requirements.txt link to /etc/shadow":
        (repo / "requirements.txt").symlink_to("/etc/shadow")
        secrets_ += [s for s in [_shadow_line()] if s]
    elif case == "pyproject.toml link":
        target = attack.tmp / "outside.toml"
        target.write_text(
            f'[project]\nname = "{attack.token}"\ndependencies = ["{attack.token}"]\n'
        )
        (repo / "pyproject.toml").symlink_to(target)
    elif case == "linked requirements directory":
        (repo / "requirements").symlink_to(attack.outside_dir)
    elif case == "include through a linked directory":
        (repo / "sub").symlink_to(attack.outside_dir)
        attack.write({"tox.ini": "[testenv]\ndeps =\n    -r sub/base.txt\n"})
    elif case == "hard link":
        os.link(outside, repo / "requirements.txt")
    elif case == "package.json link":
        (repo / "package.json").symlink_to(outside)
        attack.write({"package-lock.json": '{"lockfileVersion": 3, "packages": {"": {}}}'})
    elif case == "package-lock.json link":
        attack.write({"package.json": '{"name": "demo", "version": "1.0.0"}'})
        (repo / "package-lock.json").symlink_to(outside)
    elif case == "PKG-INFO link":
        attack.write({"pyproject.toml": '[project]\nname = "demo"\n'})
        (attack.tmp / "PKG-INFO").write_text(f"Version: 1.0\nSummary: {attack.token}\n")
        (repo / "PKG-INFO").symlink_to(attack.tmp / "PKG-INFO")
    _every_entry_point(attack, hybrid_cli, *secrets_)


def test_setup_cfg_linked_to_the_environment_never_prints_it(attack: Attack) -> None:
    """``setup.cfg -> /proc/self/environ``: the CLI, as its own process with a marker variable."""
    (attack.repo / "setup.cfg").symlink_to("/proc/self/environ")
    env = {**os.environ, "H3_HOST_SECRET": attack.token, "PYTHONPATH": str(ROOT)}
    for args in (["deps", "show"], ["deps", "lock"]):
        done = subprocess.run(
            [sys.executable, "-m", "hybrid", *args, str(attack.repo)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        _one_clear_line(done.returncode, done.stdout, done.stderr, attack.token)


def test_a_fifo_declaration_does_not_hang(attack: Attack) -> None:
    os.mkfifo(attack.repo / "requirements.txt")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "hybrid", "deps", "show", str(attack.repo)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    _one_clear_line(done.returncode, done.stdout, done.stderr)
    assert "FIFO" in done.stderr


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("requirements.txt", "six\n{token} !! not a requirement\n"),
        ("setup.cfg", "{token}\n[metadata]\nname = demo\n"),
        ("pyproject.toml", '[project]\nname = "demo"\ndependencies = ["{token} !!"]\n'),
    ],
)
def test_an_error_never_quotes_the_file(
    attack: Attack, hybrid_cli: Callable[..., tuple[int, str, str]], name: str, text: str
) -> None:
    """A malformed declaration is named by file (and line), never shown."""
    attack.write({name: text.format(token=attack.token)})
    code, out, err = hybrid_cli("deps", "show", str(attack.repo))
    assert code != 0 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert name in err
    assert attack.token not in out + err


# -- item 6: only registry tarballs with an integrity hash are fetched ---------------------------


def _need_npm() -> None:
    """npm on the host (scripts/engine.sh installs it): a failure under HYBRID_REQUIRE_ENGINE=1."""
    if shutil.which("npm") is None:
        if os.environ.get("HYBRID_REQUIRE_ENGINE") == "1":
            pytest.fail(
                "HYBRID_REQUIRE_ENGINE=1 but npm is not installed on the host", pytrace=False
            )
        pytest.skip("npm is not installed on the host")


def _lockfile(attack: Attack, entry: dict[str, object]) -> None:
    attack.write(
        {
            "package.json": json.dumps(
                {"name": "demo", "version": "1.0.0", "dependencies": {"hostpkg": "*"}}
            ),
            "package-lock.json": json.dumps(
                {
                    "name": "demo",
                    "lockfileVersion": 3,
                    "packages": {
                        "": {"name": "demo", "version": "1.0.0"},
                        "node_modules/hostpkg": entry,
                    },
                }
            ),
        }
    )


def _stored() -> set[str]:
    return {str(p) for p in store.root().rglob("*") if p.is_file()}


def _store_holds(token: str) -> bool:
    for path in store.root().rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            with contextlib.suppress(OSError, EOFError, gzip.BadGzipFile):
                data += gzip.decompress(data)
            if token.encode() in data:
                return True
    return False


_SHA = "sha512-" + "A" * 86 + "=="


@pytest.mark.parametrize(
    "case",
    [
        "file:",
        "link: spec",
        "linked entry",
        "git+ssh:",
        "http loopback",
        "resolved loopback",
        "no integrity",
    ],
)
def test_a_lockfile_entry_off_the_registry_is_refused(attack: Attack, case: str) -> None:
    _need_npm()
    host = attack.tmp / "hostdir"
    host.mkdir()
    (host / "package.json").write_text(json.dumps({"name": "hostpkg", "version": "1.0.0"}))
    (host / ".env").write_text(f"API_TOKEN={attack.token}\n")
    port, raw = attack.recorder.port, attack.recorder.raw_port
    entry: dict[str, object] = {
        "file:": {"version": f"file:{host}", "resolved": f"file:{host}"},
        "link: spec": {"version": f"link:{host}"},
        "linked entry": {"resolved": str(host), "link": True},
        "git+ssh:": {
            "version": f"git+ssh://git@127.0.0.1:{raw}/x.git#0123456789abcdef",
            "resolved": f"git+ssh://git@127.0.0.1:{raw}/x.git#0123456789abcdef",
        },
        "http loopback": {"version": f"http://127.0.0.1:{port}/hostpkg-1.0.0.tgz"},
        "resolved loopback": {
            "version": "1.0.0",
            "resolved": f"http://127.0.0.1:{port}/hostpkg-1.0.0.tgz",
            "integrity": _SHA,
        },
        "no integrity": {"name": "ms", "version": "2.1.3"},
    }[case]
    _lockfile(attack, entry)
    before = _stored()
    with pytest.raises(PolicyViolation) as refused:
        deps.lock(attack.repo, deps.detect(attack.repo), TARGET)
    message = str(refused.value)
    assert "node_modules/hostpkg" in message and "refused" in message, message
    assert "\n" not in message
    assert _stored() == before, "something entered the artifact store"
    assert not _store_holds(attack.token)
    assert attack.recorder.untouched(), attack.recorder.requests


def test_a_registry_lockfile_still_locks_and_repository_configs_are_not_read(
    attack: Attack,
) -> None:
    """The control (it passes before the fix too): a lockfile npm made from the user's registry
    packs and passes its integrity, and pip resolves a plain pin through the user's index. The
    repository's own ``.npmrc`` and ``pip.conf`` pointing at the loopback server take no part."""
    _need_npm()
    repo = attack.repo
    loopback = f"http://127.0.0.1:{attack.recorder.port}/"
    (repo / "package.json").write_text(
        json.dumps({"name": "demo", "version": "1.0.0", "dependencies": {"ms": "2.1.3"}})
    )
    subprocess.run(
        ["npm", "install", "--package-lock-only", "--ignore-scripts", "--no-audit", "--no-fund"],
        cwd=repo,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (repo / ".npmrc").write_text(f"registry={loopback}\n")
    (repo / "pip.conf").write_text(f"[global]\nindex-url = {loopback}simple\n")
    (repo / "requirements.txt").write_text("six==1.16.0\n")
    manifest = deps.lock(repo, deps.detect(repo), TARGET)
    found = {(a.ecosystem, a.name, a.version) for a in manifest.artifacts}
    assert {("node", "ms", "2.1.3"), ("python", "six", "1.16.0")} <= found
    assert attack.recorder.untouched(), attack.recorder.requests


# -- with the engine: ws up --deps and validate take the same refusal ---------------------------


@pytest.mark.engine
def test_ws_up_deps_and_validate_refuse_before_anything_is_fetched(
    engine, attack: Attack, hybrid_cli: Callable[..., tuple[int, str, str]]
) -> None:  # type: ignore[no-untyped-def]
    from hybrid.validate import validate

    repo = attack.repo
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    attack.write(FORMATS["pyproject dependencies"](f"evilpkg @ {attack.url('http')}"))
    (repo / "tox.ini").write_text("[testenv]\ndeps =\n    -r../outside.txt\n")
    (repo / "demo.py").write_text("def answer():\n    return 41\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    (repo / "demo.py").write_text("def answer():\n    return 42\n")
    (repo / "test_demo.py").write_text(
        "from demo import answer\n\ndef test_it():\n    assert answer() == 42\n"
    )
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "add a test"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    with pytest.raises(PolicyViolation, match="refused"):
        deps.up(engine, repo)
    code, out, err = hybrid_cli("ws", "up", "--repo", str(repo), "--deps")
    _one_clear_line(code, out, err, attack.token)
    result = validate(repo, head.strip(), backend=engine)
    assert not result.validated and result.failure == "dependency"
    assert "refused" in result.reason and attack.token not in result.reason
    assert attack.ran() == [] and attack.recorder.untouched()
