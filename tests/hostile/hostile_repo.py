"""A hostile repository, built in a temporary directory, for the host-side entry points.

``Host`` makes what lives *outside* the repository: host secret files with unique markers, a
watched directory that every planted command writes into if it ever runs, a local sdist, package
directory and git repository whose ``setup.py`` writes a marker, and a loopback TCP listener that
records every connection (no entry point may make one). ``build_repo`` then makes a repository
from composable parts (``Parts``), so a test can ask for the variant it needs: a git checkout or
a plain directory (git ignores FIFOs), links to host secrets (tracked, untracked, behind a
tracked directory replaced by a link), a FIFO and a device node named like sources, a ``.git``
that runs commands (fsmonitor, hooks, hooksPath, filters, diff drivers, pager, ...), dependency
declarations in one format with direct, VCS, URL and path requirements, and file names carrying
terminal escapes and newlines.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import secrets
import socketserver
import stat
import subprocess
import tarfile
import textwrap
import threading
from dataclasses import dataclass, field
from pathlib import Path

ENV_SECRET_VAR = "HYBRID_HOSTILE_ENV_SECRET"
"""Set in every process that runs hybrid: its value must never come out of /proc/self/environ."""

ESCAPE_NAME = "\x1b]0;pwned-title\x07evil.py"
"""A source file whose name sets the terminal's title when printed raw."""
NEWLINE_NAME = "innocent.py\nFORGED-MAP-LINE.py"
"""A source file whose name forges an extra line when printed raw."""
FORGED = "FORGED-MAP-LINE"

DECL_FORMATS = (
    "requirements",
    "pyproject",
    "setup_cfg",
    "setup_py",
    "tox",
    "tox_etc",
    "nox",
    "npm",
    "npm_remote",
    "link_setup_cfg",
    "link_requirements",
    "link_pyproject",
)
"""Every declaration variant ``build_repo(decls=...)`` makes (one format per repository: a
malformed entry stops the reader at the first file, which would hide the others)."""

GIT_COMMANDS = (
    "fsmonitor",
    "hookspath",
    "hook",
    "filter-clean",
    "filter-smudge",
    "filter-process",
    "diff-external",
    "textconv",
    "pager",
    "ssh-command",
    "gpg-program",
    "editor",
    "credential-helper",
    "merge-driver",
    "askpass",
)
HOOKS = (
    "post-checkout",
    "pre-commit",
    "post-commit",
    "commit-msg",
    "prepare-commit-msg",
    "post-merge",
    "post-rewrite",
    "pre-auto-gc",
    "reference-transaction",
    "post-index-change",
    "pre-push",
    "pre-rebase",
    "fsmonitor-watchman",
)


class Recorder:
    """A loopback TCP listener that records every connection (and its first bytes); answers
    HTTP 404 so a client gives up at once."""

    def __init__(self) -> None:
        self.hits: list[tuple[str, bytes]] = []
        hits = self.hits

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.settimeout(2)
                data = b""
                with contextlib.suppress(OSError):
                    data = self.request.recv(4096)
                hits.append((f"{self.client_address[0]}:{self.client_address[1]}", data[:200]))
                with contextlib.suppress(OSError):
                    self.request.sendall(
                        b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    )

        class Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Host:
    """What the hostile repository points at, outside it: secrets, the watched directory, local
    packages, the loopback listener."""

    base: Path
    recorder: Recorder
    token: str = field(default_factory=lambda: secrets.token_hex(6))

    def __post_init__(self) -> None:
        t = self.token
        self.watch = self.base / "watch"
        self.watch.mkdir(parents=True)
        host = self.base / "host"
        host.mkdir()
        self.secret_file = host / "secret.txt"
        self.file_secret = f"HOSTFILESECRET-{t}"
        self.secret_file.write_text(f"API_TOKEN = '{self.file_secret}'\n")
        # A directory a tracked directory of the repository is replaced by a link to.
        self.secret_dir = host / "secretdir"
        (self.secret_dir / "inner").mkdir(parents=True)
        self.dir_secret = f"HOSTDIRSECRET-{t}"
        (self.secret_dir / "inner" / "helpers.py").write_text(
            f'def helper():\n    """{self.dir_secret}"""\n    return "{self.dir_secret}"\n'
        )
        self.env_secret = f"HOSTENVSECRET-{t}"
        # The content of ../outside.txt beside each repository (build_repo writes it).
        self.outside_secret = f"outsidesecret-{t}"
        # An npm file: dependency: a host directory with a .env.
        self.npm_dir = host / "npmdir"
        self.npm_dir.mkdir()
        (self.npm_dir / "package.json").write_text('{"name": "hostdir", "version": "1.0.0"}\n')
        self.npm_secret = f"HOSTNPMSECRET-{t}"
        (self.npm_dir / ".env").write_text(f"TOKEN={self.npm_secret}\n")
        # Command scripts a repository's .git/config names by absolute path.
        self.bin = self.base / "evil-bin"
        self.bin.mkdir()
        for name in GIT_COMMANDS:
            self.script(name)
        self._packages()
        self.shadow_lines = _lines_of("/etc/shadow")
        self.hostname = (
            Path("/etc/hostname").read_text().strip() if Path("/etc/hostname").is_file() else ""
        )

    # -- pieces ----------------------------------------------------------------------------------

    def marker_code(self, name: str) -> str:
        """Python that records ``name`` in the watched directory."""
        return f"open({str(self.watch / name)!r}, 'a').write('ran\\n')\n"

    def script(self, name: str) -> Path:
        """An executable under evil-bin/ that records ``name`` and passes its input through."""
        path = self.bin / name
        path.write_text(f"#!/bin/sh\necho ran >> '{self.watch / name}'\ncat 2>/dev/null\nexit 0\n")
        path.chmod(0o755)
        return path

    def _packages(self) -> None:
        t = self.token
        # A local sdist whose setup.py writes a marker.
        setup = (
            "import os\n"
            + self.marker_code("sdist-setup-py")
            + "from setuptools import setup\nsetup(name='evilpkg', version='1.0')\n"
        )
        self.sdist = self.base / "dist" / "evilpkg-1.0.tar.gz"
        self.sdist.parent.mkdir()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for rel, text in (
                ("evilpkg-1.0/setup.py", setup),
                ("evilpkg-1.0/PKG-INFO", "Metadata-Version: 2.1\nName: evilpkg\nVersion: 1.0\n"),
            ):
                data = text.encode()
                info = tarfile.TarInfo(rel)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        self.sdist.write_bytes(buf.getvalue())
        # A package directory (path and -e requirements).
        self.pkg_dir = self.base / "dirpkg"
        self.pkg_dir.mkdir()
        (self.pkg_dir / "setup.py").write_text(
            self.marker_code("dir-setup-py")
            + "from setuptools import setup\nsetup(name='dirpkg', version='1.0')\n"
        )
        # A git repository (git+file:).
        self.git_pkg = self.base / "gitpkg"
        self.git_pkg.mkdir()
        (self.git_pkg / "setup.py").write_text(
            self.marker_code("git-setup-py")
            + "from setuptools import setup\nsetup(name='gitpkg', version='1.0')\n"
        )
        _git(self.git_pkg, "init", "-q")
        _git(self.git_pkg, "add", "-A")
        _git(self.git_pkg, "commit", "-qm", "gitpkg")
        del t

    # -- what must never come out ------------------------------------------------------------------

    def secrets(self, *, hostname: bool = False) -> list[str]:
        """Strings that must appear in no output, error or prompt."""
        found = [
            self.file_secret,
            self.dir_secret,
            self.env_secret,
            self.outside_secret,
            self.npm_secret,
            *self.shadow_lines,
        ]
        if hostname and self.hostname:
            found.append(self.hostname)
        return found

    def leaked(self, text: str, *, hostname: bool = False) -> list[str]:
        return [s for s in self.secrets(hostname=hostname) if s in text]

    def markers(self) -> list[str]:
        """Every marker a planted command wrote (each name once)."""
        return sorted(p.name for p in self.watch.iterdir())

    def requirements(self) -> list[str]:
        """Direct, URL, VCS and path requirements (PEP 508)."""
        port = self.recorder.port
        # The sdist first: pip stops at the first requirement it cannot prepare. git+file:
        # names localhost because pip's own parser refuses an empty host there.
        return [
            f"evilpkg @ file://{self.sdist}",
            f"httppkg @ https://127.0.0.1:{port}/httppkg-1.0.tar.gz",
            f"plainhttp @ http://127.0.0.1:{port}/plainhttp-1.0.tar.gz",
            f"sshpkg @ git+ssh://git@127.0.0.1:{port}/evil.git",
            f"gitpkg @ git+file://localhost{self.git_pkg}",
            f"dirpkg @ file://{self.pkg_dir}",
        ]


def _lines_of(path: str) -> list[str]:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if len(line) >= 12]


def _git(cwd: Path, *args: str) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "h",
        "GIT_AUTHOR_EMAIL": "h@example.invalid",
        "GIT_COMMITTER_NAME": "h",
        "GIT_COMMITTER_EMAIL": "h@example.invalid",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


@dataclass(frozen=True)
class Parts:
    """Which hostile parts a repository gets."""

    git: bool = True
    """A git checkout (with history) rather than a plain directory."""
    links: bool = True
    """Links to host secrets: tracked, untracked, and a tracked directory replaced by a link."""
    special: bool = True
    """A FIFO (``fifo.py``) and a device node (``zero.py``, /dev/zero's 1,5)."""
    git_config: bool = True
    """A .git that runs commands: fsmonitor, hooks, hooksPath, filters, diff drivers, pager."""
    decls: str | None = "pyproject"
    """One of DECL_FORMATS, or None."""
    names: bool = True
    """File names with a terminal escape and a newline."""


SOURCES = {
    "app/__init__.py": "",
    "app/shipping.py": (
        '"""Shipping costs."""\n\n\ndef cost(weight: float) -> float:\n'
        '    """The cost of a parcel."""\n    return 5.0 + 2.0 * weight\n'
    ),
    "app/settings.py": "DEBUG = False\n",
    "tests/test_shipping.py": (
        "from app.shipping import cost\n\n\ndef test_cost():\n    assert cost(1) == 7.0\n"
    ),
    "libs/inner/helpers.py": 'def helper():\n    """A library helper."""\n    return 1\n',
}
TASK = (
    "fix the shipping cost; read settings, secrets, shadow, environ, helper, libs inner helpers, "
    "tracked_secret untracked_secret api token evil innocent forged zero fifo"
)
"""A task that ranks every planted file high."""


def build_repo(host: Host, dest: Path, parts: Parts = Parts()) -> Path:
    """The hostile repository at ``dest`` (made), from ``parts``."""
    dest.mkdir(parents=True)
    for rel, text in SOURCES.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(text)
    if parts.links:
        # Tracked links (committed below).
        os.symlink(host.secret_file, dest / "app" / "tracked_secret.py")
        os.symlink("/proc/self/environ", dest / "app" / "environ_tracked.py")
        os.symlink("/etc/shadow", dest / "app" / "shadow_tracked.py")
    if parts.names:
        (dest / "app" / ESCAPE_NAME).write_text("def evil_title():\n    return 1\n")
        (dest / "app" / NEWLINE_NAME).write_text("def innocent_forged():\n    return 2\n")
    if parts.decls is not None:
        # ../outside.txt from the repository: a host file a declaration must not read.
        (dest.parent / "outside.txt").write_text(f"{host.outside_secret}==1.0\n")
        _declarations(host, dest, parts.decls)
    if parts.git:
        _git(dest, "init", "-q")
        _git(dest, "add", "-A")
        _git(dest, "commit", "-qm", "initial import")
        # History for context eval: bug-fix commits touching sources.
        for n in range(3):
            with (dest / "app" / "shipping.py").open("a") as f:
                f.write(
                    f"\n\ndef surcharge_{n}(weight: float) -> float:\n    return weight * {n}\n"
                )
            (dest / "tests" / f"test_fix_{n}.py").write_text(
                f"from app.shipping import surcharge_{n}\n\n\ndef test_s():\n    assert surcharge_{n}(1) == {n}\n"
            )
            _git(dest, "add", "-A")
            _git(dest, "commit", "-qm", f"fix: surcharge {n} was wrong (fixes #{n})")
    if parts.links:
        # Untracked links.
        os.symlink(host.secret_file, dest / "app" / "untracked_secret.py")
        os.symlink("/proc/self/environ", dest / "app" / "environ.py")
        os.symlink("/etc/shadow", dest / "app" / "shadow.py")
        # A tracked directory's parent replaced by a link: libs/inner/helpers.py is in the
        # index, libs now leads to the host (not "vendor": context skips that name anyway).
        import shutil

        shutil.rmtree(dest / "libs")
        os.symlink(host.secret_dir, dest / "libs")
    if parts.special:
        os.mkfifo(dest / "app" / "fifo.py")
        os.mknod(dest / "app" / "zero.py", 0o644 | stat.S_IFCHR, os.makedev(1, 5))
    if parts.git and parts.git_config:
        _hostile_git(host, dest)
    return dest


def _hostile_git(host: Host, repo: Path) -> None:
    """A .git/config, .gitattributes and hooks that run commands (each writes its marker)."""
    b = host.bin
    hooks_path = host.base / f"hookspath-{secrets.token_hex(4)}"
    hooks_path.mkdir()
    for hook in HOOKS:
        for where, prefix in ((repo / ".git" / "hooks", "hook"), (hooks_path, "hookspath")):
            path = where / hook
            path.write_text(f"#!/bin/sh\necho ran >> '{host.watch / f'{prefix}-{hook}'}'\nexit 0\n")
            path.chmod(0o755)
    config = textwrap.dedent(
        f"""\
        [core]
        \tfsmonitor = {b / "fsmonitor"}
        \thooksPath = {hooks_path}
        \tpager = {b / "pager"}
        \tsshCommand = {b / "ssh-command"}
        \teditor = {b / "editor"}
        \taskPass = {b / "askpass"}
        [filter "evil"]
        \tclean = {b / "filter-clean"}
        \tsmudge = {b / "filter-smudge"}
        \tprocess = {b / "filter-process"}
        \trequired = false
        [diff]
        \texternal = {b / "diff-external"}
        [diff "evil"]
        \ttextconv = {b / "textconv"}
        [merge "evil"]
        \tdriver = {b / "merge-driver"} %O %A %B
        [pager]
        \tlog = {b / "pager"}
        \tdiff = {b / "pager"}
        \tstatus = {b / "pager"}
        [gpg]
        \tprogram = {b / "gpg-program"}
        [commit]
        \tgpgSign = true
        [tag]
        \tgpgSign = true
        [credential]
        \thelper = {b / "credential-helper"}
        [color]
        \tui = always
        """
    )
    with (repo / ".git" / "config").open("a") as f:
        f.write(config)
    # Attributes in the worktree (as a checkout ships them) and in info/ (as a copied .git does).
    attrs = "* filter=evil diff=evil merge=evil\n"
    (repo / ".gitattributes").write_text(attrs)
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "attributes").write_text(attrs)
    # The stat cache no longer matches, so the next status must consult filters and fsmonitor.
    with contextlib.suppress(FileNotFoundError):
        (repo / ".git" / "index").touch()


def _declarations(host: Host, repo: Path, fmt: str) -> None:
    reqs = host.requirements()
    port = host.recorder.port
    quoted = ",\n".join(f"    {json.dumps(r)}" for r in reqs)
    if fmt == "requirements":
        (repo / "requirements.txt").write_text(
            "\n".join(
                [
                    "-r ../outside.txt",
                    f"--find-links http://127.0.0.1:{port}/links/",
                    f"--extra-index-url http://127.0.0.1:{port}/simple/",
                    f"-e {host.pkg_dir}",
                    str(host.pkg_dir),
                    f"git+file://localhost{host.git_pkg}#egg=gitpkg",
                    *reqs,
                ]
            )
            + "\n"
        )
    elif fmt == "pyproject":
        (repo / "pyproject.toml").write_text(
            f'[project]\nname = "victim"\nversion = "1.0"\ndependencies = [\n{quoted}\n]\n'
            f"[project.optional-dependencies]\ntest = [\n{quoted}\n]\n"
        )
    elif fmt == "setup_cfg":
        lines = "\n".join(f"    {r}" for r in reqs)
        (repo / "setup.cfg").write_text(
            f"[metadata]\nname = victim\nversion = 1.0\n\n[options]\ninstall_requires =\n{lines}\n"
        )
    elif fmt == "setup_py":
        # Literal setup() arguments, and module code that writes a marker if setup.py is run.
        (repo / "setup.py").write_text(
            host.marker_code("project-setup-py")
            + f"from setuptools import setup\nsetup(\n    name='victim',\n    version='1.0',\n"
            f"    install_requires=[\n{quoted}\n    ],\n)\n"
        )
    elif fmt == "tox":
        lines = "\n".join(f"    {r}" for r in reqs)
        (repo / "tox.ini").write_text(
            f"[tox]\nenvlist = py\n\n[testenv]\ndeps =\n    -r../outside.txt\n{lines}\ncommands = pytest\n"
        )
    elif fmt == "tox_etc":
        (repo / "tox.ini").write_text(
            "[tox]\nenvlist = py\n\n[testenv]\ndeps =\n    -r/etc/hostname\n    pytest\ncommands = pytest\n"
        )
    elif fmt == "nox":
        calls = "\n".join(f"    session.install({r!r})" for r in reqs)
        (repo / "noxfile.py").write_text(
            "import nox\n\n\n@nox.session\ndef tests(session):\n" + calls + "\n"
        )
    elif fmt in ("npm", "npm_remote"):
        _npm(host, repo, remote=fmt == "npm_remote")
    elif fmt == "link_setup_cfg":
        os.symlink("/proc/self/environ", repo / "setup.cfg")
    elif fmt == "link_requirements":
        os.symlink("/etc/shadow", repo / "requirements.txt")
    elif fmt == "link_pyproject":
        os.symlink(host.secret_file, repo / "pyproject.toml")
    else:
        raise ValueError(f"unknown declaration format {fmt!r}")


def _npm(host: Host, repo: Path, remote: bool) -> None:
    """package.json and package-lock.json naming a host directory (``file:``, ``link:``) or,
    with ``remote``, a ``git+ssh:`` repository and a tarball URL on the loopback listener. The
    lockfile is the attacker's: its ``version`` fields hold the specs themselves."""
    port = host.recorder.port
    ssh = f"git+ssh://git@127.0.0.1:{port}/evil.git#0123456789abcdef"
    http = f"http://127.0.0.1:{port}/httpdep/-/httpdep-1.0.0.tgz"
    fake = "sha512-" + "A" * 86 + "=="
    deps: dict[str, str]
    if remote:
        deps = {"httpdep": http, "sshdep": ssh}
        entries = {
            "node_modules/httpdep": {"version": http, "resolved": http, "integrity": fake},
            "node_modules/sshdep": {"version": ssh, "resolved": ssh},
        }
    else:
        deps = {"hostdir": f"file:{host.npm_dir}", "linked": f"link:{host.npm_dir}"}
        entries = {
            "node_modules/hostdir": {
                "version": f"file:{host.npm_dir}",
                "resolved": f"file:{host.npm_dir}",
            },
            "node_modules/linked": {
                "version": f"link:{host.npm_dir}",
                "resolved": str(host.npm_dir),
                "link": True,
            },
        }
    (repo / "package.json").write_text(
        json.dumps({"name": "victim", "version": "1.0.0", "dependencies": deps}, indent=2)
    )
    lock = {
        "name": "victim",
        "version": "1.0.0",
        "lockfileVersion": 3,
        "requires": True,
        "packages": {"": {"name": "victim", "version": "1.0.0", "dependencies": deps}, **entries},
    }
    (repo / "package-lock.json").write_text(json.dumps(lock, indent=2))


def scan_for(root: Path, needles: list[str], since: float = 0.0) -> list[str]:
    """Files under ``root`` changed at or after ``since`` (gzip members read through) that hold
    any of ``needles``: ``path: needle`` lines."""
    found: list[str] = []
    if not root.exists():
        return found
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath, name)
            try:
                if path.is_symlink() or not path.is_file() or path.stat().st_mtime < since - 1:
                    continue
                data = path.read_bytes()[:50_000_000]
            except OSError:
                continue
            if data[:2] == b"\x1f\x8b":
                with contextlib.suppress(OSError, EOFError, gzip.BadGzipFile):
                    data += gzip.decompress(data)
            for needle in needles:
                if needle.encode() in data:
                    found.append(f"{path}: {needle[:40]}")
    return found
