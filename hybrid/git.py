"""Every ``git`` command hybrid runs goes through here: a repository's own files run nothing.

A repository that arrives with its ``.git`` (a tarball, a copied checkout) names programs git
would run as the calling user: ``core.fsmonitor`` on every status, hooks (``.git/hooks`` and
``core.hooksPath``) on checkout, clean/smudge/process filters on status, checkout and archive,
diff drivers and textconv, pagers, ssh and credential helpers, gpg, upload-pack, the lazy fetch
of a partial clone. A deny-list of such keys is never complete, so for a repository hybrid did
not make (``run``, ``popen``) git never reads that repository's configuration at all:

- the command runs with ``GIT_DIR`` at the repository's own git directory (HEAD, index) and
  ``GIT_COMMON_DIR`` at a *shadow* directory hybrid writes: its ``config`` holds only an
  allow-list of data keys copied from the repository's (format version, object format,
  filemode, symlinks, line endings, sparse checkout), its objects, refs and info are links to
  the repository's, and it has no ``hooks``;
- system and global configuration are off (``GIT_CONFIG_NOSYSTEM``, ``GIT_CONFIG_GLOBAL``),
  the environment is rebuilt from a short list (no ``GIT_*`` of the caller's, no pager, no
  prompt, no optional locks), and ``-c`` turns fsmonitor, hooks, pagers, protocols, submodule
  recursion and signature checks off for git and for any git it starts;
- ``status`` and ``diff`` ignore submodules (a submodule's status is a git process in that
  submodule's own, unshadowed directory).

The user's own global ignore file still applies (a ``.env`` they ignore everywhere stays out of
listings). ``run_own`` is for repositories hybrid made itself (the diff baseline, a fresh
``git init``): the same environment and switches, without the shadow.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hybrid.errors import InvalidInput

HARDENING = [
    "-c", "core.fsmonitor=false",
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.pager=cat",
    "-c", "protocol.allow=never",
    "-c", "submodule.recurse=false",
    "-c", "log.showSignature=false",
    "-c", "gpg.program=false",
    "-c", "gpg.ssh.program=false",
    "-c", "gpg.x509.program=false",
]  # fmt: skip
"""Global options every command gets; git hands ``-c`` values on to the git processes it starts."""

# Data-only keys a repository's config may keep; nothing here names a program or a path.
_KEPT = {
    "core.repositoryformatversion",
    "core.bare",
    "core.filemode",
    "core.symlinks",
    "core.ignorecase",
    "core.precomposeunicode",
    "core.autocrlf",
    "core.eol",
    "core.safecrlf",
    "core.checkroundtripencoding",
    "core.sparsecheckout",
    "core.sparsecheckoutcone",
    "core.commitgraph",
    "core.multipackindex",
    "index.sparse",
    "extensions.objectformat",
}
_VALUE = re.compile(r"[A-Za-z0-9._-]{0,64}")
# What a shadow links to in the repository's common directory (no hooks, no config, no
# worktrees), each only as the kind named: git quotes a line of a packed-refs it cannot parse,
# so a packed-refs that links to /etc/shadow would put a line of it in an error message.
_LINKED = {"objects": stat.S_ISDIR, "refs": stat.S_ISDIR, "packed-refs": stat.S_ISREG}
_LINKED |= {"shallow": stat.S_ISREG, "info/exclude": stat.S_ISREG}
_LINKED |= {"info/attributes": stat.S_ISREG}
_NO_SUBMODULES = {"status", "diff"}
_PROBE_TIMEOUT = 30.0
_PROBE = ["rev-parse", "--absolute-git-dir", "--git-common-dir", "--is-bare-repository"]
_PROBE += ["--show-toplevel"]
_EXCLUDES_QUERY = ["config", "--global", "--includes", "--path", "-z", "--get"]
_EXCLUDES_QUERY += ["core.excludesFile"]

_lock = threading.Lock()
_pins: dict[str, tuple[Path, int]] = {}  # common dir -> (its pinned shadow, how many pins)
_pinned: set[str] = set()  # the pinned shadows themselves (a worktree added in one uses it)
_kept: dict[tuple[str, tuple[int, ...]], dict[str, str]] = {}  # (config, its stat) -> kept keys
_excludes: dict[tuple[Any, ...], str | None] = {}


def run(
    args: Sequence[str],
    repo: str | Path,
    *,
    input: bytes | str | None = None,
    timeout: float | None = 600,
    text: bool = False,
    check: bool = False,
) -> subprocess.CompletedProcess[Any]:
    """``git -C repo ARGS`` on a repository hybrid did not make, captured; nothing the
    repository configures runs. A directory that is not (inside) a work tree or git directory
    gives git's own failure (exit 128), as ``git -C`` would; ``OSError`` when git is missing."""
    with _prepared(Path(repo)) as setting:
        if isinstance(setting, subprocess.CompletedProcess):
            if check:
                raise subprocess.CalledProcessError(128, ["git", *args], b"", setting.stderr)
            return _as_text(setting, text)
        env, cwd = setting
        return _run(_argv(args), env, cwd, input, timeout, text, check)


@contextmanager
def popen(args: Sequence[str], repo: str | Path, **options: Any) -> Iterator[subprocess.Popen[Any]]:
    """``git -C repo ARGS`` started (for output read as it comes), set up as ``run`` does; the
    process is waited for when the block ends. InvalidInput when ``repo`` is no repository."""
    with _prepared(Path(repo)) as setting:
        if isinstance(setting, subprocess.CompletedProcess):
            why = setting.stderr.decode(errors="replace").strip().splitlines()
            raise InvalidInput(f"{repo}: {why[-1] if why else 'not a git repository'}")
        env, cwd = setting
        argv = _argv(args)
        with subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, **options) as proc:
            yield proc


@contextmanager
def pinned(repo: str | Path) -> Iterator[None]:
    """One shadow for ``repo`` through the block, so what a command registers in it lasts: a
    worktree added inside the block is registered in the shadow (never in the repository's own
    ``.git``), and works until the block ends. Without a pin every command gets a fresh shadow,
    removed when it finishes."""
    probe = _probe(Path(repo))
    if isinstance(probe, subprocess.CompletedProcess):
        yield  # no repository: commands fail as they would anyway
        return
    common = probe[1]
    if str(common) in _pinned:
        yield  # a worktree registered in a pinned shadow: that pin holds it
        return
    with _lock:
        try:
            shadow, count = _pins.get(str(common)) or (_make_shadow(common), 0)
        except _Refused:
            shadow = None
        if shadow is not None:
            _pins[str(common)] = (shadow, count + 1)
            _pinned.add(str(shadow))
    if shadow is None:
        yield  # commands on it are refused one by one
        return
    try:
        yield
    finally:
        with _lock:
            shadow, count = _pins[str(common)]
            if count > 1:
                _pins[str(common)] = (shadow, count - 1)
            else:
                del _pins[str(common)]
                _pinned.discard(str(shadow))
                shutil.rmtree(shadow, ignore_errors=True)


def run_own(
    args: Sequence[str],
    *,
    cwd: str | Path,
    env: Mapping[str, str] | None = None,
    input: bytes | str | None = None,
    timeout: float | None = 600,
    text: bool = False,
    check: bool = False,
) -> subprocess.CompletedProcess[Any]:
    """``git ARGS`` in ``cwd`` on a repository hybrid made itself (or none), with the
    scrubbed environment plus ``env`` and the same switches as ``run``."""
    argv = ["git", *HARDENING, *args]
    return _run(argv, {**environment(), **(env or {})}, Path(cwd), input, timeout, text, check)


def environment() -> dict[str, str]:
    """The environment every git command gets: nothing of the caller's ``GIT_*``, no system or
    global configuration, no pager, no prompt, no optional locks."""
    kept = {k: os.environ[k] for k in ("PATH", "HOME", "XDG_CONFIG_HOME", "TZ") if k in os.environ}
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        **kept,
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_PAGER": "cat",
        "PAGER": "cat",
        "GIT_PROTOCOL_FROM_USER": "0",
        "GIT_NO_LAZY_FETCH": "1",
    }


def _argv(args: Sequence[str]) -> list[str]:
    extra = ["--ignore-submodules=all"] if args and args[0] in _NO_SUBMODULES else []
    return ["git", *HARDENING, *_user_excludes(), *args[:1], *extra, *args[1:]]


def _user_excludes() -> list[str]:
    """``-c core.excludesFile=...`` naming the ignore file the user's own global configuration
    names (read here, as the user's; the command itself reads no global configuration)."""
    home = os.environ.get("HOME", "")
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    files = [os.environ.get("GIT_CONFIG_GLOBAL") or os.path.join(home, ".gitconfig")]
    files.append(os.path.join(xdg, "git", "config"))
    key = tuple((f, _mtime(f)) for f in files)
    if key not in _excludes:
        if not any(mtime for _, mtime in key):
            found = None
        else:
            names = ("PATH", "HOME", "XDG_CONFIG_HOME", "GIT_CONFIG_GLOBAL")
            env = {k: os.environ[k] for k in names if k in os.environ}
            try:
                done = subprocess.run(
                    ["git", *_EXCLUDES_QUERY],
                    env={**env, "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"},
                    cwd="/",
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=_PROBE_TIMEOUT,
                )
                found = done.stdout.decode(errors="surrogateescape").rstrip("\0") or None
            except (OSError, subprocess.SubprocessError):
                found = None
        _excludes[key] = found
    found = _excludes[key]
    return ["-c", f"core.excludesFile={found}"] if found else []


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def _run(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    input: bytes | str | None,
    timeout: float | None,
    text: bool,
    check: bool,
) -> subprocess.CompletedProcess[Any]:
    options: dict[str, Any] = {"text": True, "errors": "replace"} if text else {}
    if input is None:
        options["stdin"] = subprocess.DEVNULL  # git never waits on the caller's terminal
    return subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        input=input,
        capture_output=True,
        timeout=timeout,
        check=check,
        **options,
    )


def _as_text(
    done: subprocess.CompletedProcess[bytes], text: bool
) -> subprocess.CompletedProcess[Any]:
    if not text:
        return done
    stderr = done.stderr.decode(errors="replace")
    return subprocess.CompletedProcess(done.args, done.returncode, "", stderr)


def _failed(why: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.CompletedProcess(["git"], 128, b"", f"fatal: {why}\n".encode())


_Probe = tuple[Path, Path, str | None]  # git dir, common dir, work tree (None: bare)


def _probe(root: Path) -> _Probe | subprocess.CompletedProcess[bytes]:
    """Where ``root``'s repository keeps its files, or why there is none."""
    if not root.is_dir():
        return _failed(f"cannot change to '{root}': Not a directory")
    # rev-parse reads the configuration (to check the format) and runs nothing it names.
    probe = subprocess.run(
        ["git", *HARDENING, *_PROBE],
        env=environment(),
        cwd=root,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=_PROBE_TIMEOUT,
    )
    lines = probe.stdout.decode(errors="surrogateescape").split("\n")
    if len(lines) < 4 or not lines[0].startswith("/"):
        return probe  # not a repository (or one git refuses): git's own message
    git_dir, common = Path(lines[0]), Path(os.path.realpath(root / lines[1]))
    if lines[2] == "true":
        return git_dir, common, None
    if probe.returncode != 0 or len(lines) < 5:
        # Inside a git directory: with GIT_DIR set, git would take the directory for a work tree.
        return _failed("this operation must be run in a work tree")
    top = lines[3]
    # core.worktree may point anywhere; a work tree is only ever one that holds ``root``.
    if not root.resolve().is_relative_to(Path(top).resolve()):
        return _failed(f"'{root}' is outside its repository's work tree '{top}'")
    return git_dir, common, top


@contextmanager
def _prepared(
    root: Path,
) -> Iterator[tuple[dict[str, str], Path] | subprocess.CompletedProcess[bytes]]:
    """The environment and directory a command on ``root`` runs with (or why there is none),
    its shadow kept until the block ends."""
    probe = _probe(root)
    if isinstance(probe, subprocess.CompletedProcess):
        yield probe
        return
    git_dir, common, top = probe
    env = environment()
    env["GIT_DIR"] = str(git_dir)
    env["GIT_OBJECT_DIRECTORY"] = os.path.realpath(common / "objects")
    if top is not None:
        env["GIT_WORK_TREE"] = top
    with _lock:
        # A pinned shadow, or a worktree registered in one (its common dir *is* the shadow).
        held = common if str(common) in _pinned else (_pins.get(str(common)) or (None,))[0]
    if held is not None:
        env["GIT_COMMON_DIR"] = str(held)
        yield env, root
        return
    try:
        shadow = _make_shadow(common)
    except _Refused as exc:
        yield _failed(str(exc))
        return
    try:
        env["GIT_COMMON_DIR"] = str(shadow)
        yield env, root
    finally:
        shutil.rmtree(shadow, ignore_errors=True)


class _Refused(Exception):
    """A repository whose git files are not what git keeps there (a link, a fifo)."""


def _make_shadow(common: Path) -> Path:
    """A common directory standing in for ``common``: links to its data, a config of its own."""
    shadow = Path(os.path.realpath(tempfile.mkdtemp(prefix="hybrid-git-")))
    (shadow / "info").mkdir()
    for name, is_kind in _LINKED.items():
        try:
            mode = os.lstat(common / name).st_mode
        except OSError:
            continue
        if not is_kind(mode):
            shutil.rmtree(shadow, ignore_errors=True)
            kind = "directory" if is_kind is stat.S_ISDIR else "regular file"
            raise _Refused(f"{common / name} is not a {kind} (a link?); the repository is not read")
        (shadow / name).symlink_to(common / name)
    kept = _kept_config(common / "config")
    (shadow / "config").write_text(
        "".join(f"[{k.split('.')[0]}]\n\t{k.split('.')[1]} = {v}\n" for k, v in kept.items())
    )
    return shadow


def _kept_config(config: Path) -> dict[str, str]:
    """The allow-listed keys of a repository's config file (a regular file, else none)."""
    try:
        st = os.lstat(config)
    except OSError:
        return {}
    if not stat.S_ISREG(st.st_mode):
        return {}
    key = (str(config), (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size))
    found = _kept.get(key)
    if found is None:
        if len(_kept) > 256:  # a long-lived server that has read many repositories
            _kept.clear()
        found = _kept[key] = _read_kept(config)
    return dict(found)


def _read_kept(config: Path) -> dict[str, str]:
    # Read as data by git itself (no includes: they could name any host file).
    listed = subprocess.run(
        ["git", *HARDENING, "config", "--file", str(config), "--no-includes", "--list", "-z"],
        env=environment(),
        cwd="/",
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=_PROBE_TIMEOUT,
    )
    kept: dict[str, str] = {}
    for entry in listed.stdout.decode(errors="replace").split("\0"):
        key, _, value = entry.partition("\n")
        key = key.lower()
        if key in _KEPT and _VALUE.fullmatch(value):
            kept[key] = value
    return kept


__all__ = ["HARDENING", "environment", "pinned", "popen", "run", "run_own"]
