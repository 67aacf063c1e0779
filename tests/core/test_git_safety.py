"""hybrid.git: the one way hybrid runs git, and what it keeps from a repository's ``.git``.

The end-to-end attack (every host-side entry point on a repository whose ``.git`` runs a
marker from every hook and command key) is tests/hostile/test_host_git.py; here are the rule
that nothing else starts git, and the helper's edges: submodules, ``core.worktree``, bare and
linked checkouts, sha256 repositories, the user's own ignore file.
"""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path

import pytest

from hybrid import git

HYBRID = Path(__file__).resolve().parents[2] / "hybrid"
_IDENTITY = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost"]


def _git(cwd: Path, *args: str) -> str:
    """The test's own git: fixed identity, none of the host's configuration."""
    return subprocess.run(
        [*_IDENTITY, "-c", "protocol.file.allow=always", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull},
    ).stdout


def _repo(path: Path, *extra: str) -> Path:
    path.mkdir(parents=True)
    (path / "a.py").write_text("A = 1\n")
    _git(path, "init", "-q", *extra)
    _git(path, "add", "-A")
    _git(path, "commit", "-qm", "base")
    return path


def _arm(repo: Path, markers: Path, name: str) -> None:
    """fsmonitor and a clean filter on *.py that leave a marker named ``name``; a racy file."""
    markers.mkdir(exist_ok=True)
    _git(repo, "config", "core.fsmonitor", f"touch {markers}/{name}-fsmonitor; false")
    _git(repo, "config", "filter.evil.clean", f"touch {markers}/{name}-clean; cat")
    info = Path(_git(repo, "rev-parse", "--git-path", "info").strip())
    info = info if info.is_absolute() else repo / info
    info.mkdir(exist_ok=True)
    (info / "attributes").write_text("*.py filter=evil\n")
    if (repo / "a.py").exists():
        os.utime(repo / "a.py")


def test_nothing_but_hybrid_git_starts_git() -> None:
    """No argv literal under hybrid/ starts with git, except in the helper itself."""
    found = []
    for path in sorted(HYBRID.rglob("*.py")):
        if path == HYBRID / "git.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.List | ast.Tuple) and node.elts:
                first = node.elts[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    word = first.value.split(" ")[0]
                    if (word == "git" or word.endswith("/git")) and len(node.elts) > 1:
                        found.append(f"{path.relative_to(HYBRID.parent)}:{node.lineno}")
    assert not found, f"run git through hybrid.git (hybrid/git.py), not directly: {found}"


def test_status_does_not_enter_a_submodule_with_its_own_config(tmp_path: Path) -> None:
    sub = _repo(tmp_path / "sub")
    top = _repo(tmp_path / "top")
    _git(top, "submodule", "add", "-q", str(sub), "sub")
    _git(top, "commit", "-qm", "sub")
    markers = tmp_path / "markers"
    _arm(top, markers, "top")
    _arm(top / "sub", markers, "sub")
    (top / "sub" / "a.py").write_text("A = 2\n")  # a dirty submodule: status would look inside
    done = git.run(["status", "--porcelain"], top, text=True)
    assert done.returncode == 0, done.stderr
    assert not list(markers.iterdir())


def test_a_work_tree_elsewhere_is_refused(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _git(repo, "config", "core.worktree", str(elsewhere))
    done = git.run(["ls-files"], repo, text=True)
    assert done.returncode != 0 and done.stdout == ""


def test_bare_linked_and_sha256_repositories_read(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo", "--object-format=sha256")
    bare, linked = tmp_path / "bare.git", tmp_path / "linked"
    _git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    _git(repo, "worktree", "add", "-q", "--detach", str(linked))
    markers = tmp_path / "markers"
    for armed in (repo, bare, linked):
        _arm(armed, markers, armed.name)
    head = git.run(["rev-parse", "HEAD"], repo, text=True).stdout.strip()
    assert len(head) == 64  # extensions.objectFormat is one of the keys kept
    assert git.run(["log", "--format=%H"], bare, text=True).stdout.split() == [head]
    (linked / "b.py").write_text("B = 1\n")
    status = git.run(["status", "--porcelain", "--untracked-files=all"], linked, text=True)
    assert status.stdout.split() == ["??", "b.py"]
    assert git.run(["ls-files"], repo / ".git", text=True).returncode != 0  # no work tree
    assert not list(markers.iterdir())


def test_the_users_own_global_ignore_file_still_applies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "ignore").write_text(".env\n")
    (home / ".gitconfig").write_text(f"[core]\n\texcludesFile = {home / 'ignore'}\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    repo = _repo(tmp_path / "repo")
    (repo / ".env").write_text("TOKEN=x\n")
    (repo / "b.py").write_text("B = 1\n")
    listed = git.run(["ls-files", "--others", "--exclude-standard"], repo, text=True)
    assert listed.stdout.split() == ["b.py"]


def test_shadows_last_one_command_or_one_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _repo(tmp_path / "repo")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    assert git.run(["status", "--porcelain"], repo).returncode == 0
    with git.popen(["log", "--format=%H"], repo, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stdout.read()
    assert not list(scratch.iterdir())
    worktree = tmp_path / "wt"
    with git.pinned(repo):
        git.run(["worktree", "add", "-q", "--detach", str(worktree)], repo, check=True)
        (worktree / "b.py").write_text("B = 1\n")
        listed = git.run(["ls-files", "--others"], worktree, text=True, check=True)
        assert listed.stdout.split() == ["b.py"]
        git.run(["worktree", "remove", "--force", str(worktree)], repo, check=True)
    assert not list(scratch.iterdir())
    assert not (repo / ".git" / "worktrees").exists()  # registered in the shadow only


def test_git_files_that_link_out_are_not_read(tmp_path: Path) -> None:
    """git quotes a packed-refs line it cannot parse: one linked to a host file is refused."""
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$SECRETHASH:19000:0:99999:7:::\n")
    repo = _repo(tmp_path / "repo")
    (repo / ".git" / "packed-refs").symlink_to(secret)
    done = git.run(["log", "--oneline"], repo, text=True)
    assert done.returncode == 128 and "packed-refs is not a regular file" in done.stderr
    assert "SECRETHASH" not in done.stdout + done.stderr
