"""A repository's own ``.git`` runs nothing on the host (issue 29, item 3).

The repository arrives with its ``.git`` (a tarball, a copied checkout) configured to run a
marker script from every place git can be told to run one: ``core.fsmonitor``, hooks in
``.git/hooks`` or under ``core.hooksPath``, clean/smudge/process filters and a diff driver
named by ``.gitattributes``, ``diff.external``, pagers, editors, ``gpg.program`` with
``log.showSignature`` on a commit that carries a signature, ssh and credential helpers. Every
host-side entry point that runs git on it (``map``, ``context``, ``skeleton``, the MCP tools,
``context eval``, the host side of ``validate`` and ``gate``, copy-in to a workstation) then
runs, and no marker may exist afterwards. Before hybrid.git: map and context ran fsmonitor,
the smudge, clean and process filters, textconv, gpg and the post-index-change hook; context
eval ran fsmonitor, gpg, the reference-transaction hook and the process filter (without a
process filter, also post-checkout and smudge); the gate's related tests ran fsmonitor and the
process filter, validate's export the process filter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from mcp import Client, StdioServerParameters

from hybrid.cli import cli

ROOT = Path(__file__).resolve().parents[2]

HOOKS = [
    "applypatch-msg",
    "pre-applypatch",
    "post-applypatch",
    "pre-commit",
    "pre-merge-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "pre-rebase",
    "post-checkout",
    "post-merge",
    "pre-push",
    "pre-receive",
    "update",
    "proc-receive",
    "post-receive",
    "post-update",
    "reference-transaction",
    "push-to-checkout",
    "pre-auto-gc",
    "post-rewrite",
    "post-index-change",
    "fsmonitor-watchman",
]

# The marker script: records its first argument, and passes data through where git expects it.
SCRIPT = """#!/bin/sh
name=$1; shift
touch "{markers}/$name"
case $name in
  clean|smudge) exec cat ;;
  textconv) exec cat "$1" ;;
esac
exit 1
"""


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """These cases run no tier (the hostile suite's leftover check is per tier): what they
    must not leave is the markers, checked by each case."""
    yield


def _git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    # The fixture's own git: a fixed identity, none of the host's configuration.
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            **(env or {}),
        },
    )
    return done.stdout


def make_git_hostile(root: Path, *, hooks_path: bool) -> tuple[Path, Path]:
    """A small Python project with bug-fix history, then a ``.git`` that runs a marker script
    from every hook and command key; (repository, directory the markers go to)."""
    repo, markers, hooks = root / "repo", root / "markers", root / "hooks"
    markers.mkdir()
    (repo / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "pricing.py").write_text(
        "def apply_discount(amount, rate):\n    return amount * (1 - rate)\n"
    )
    (repo / "pkg" / "cart.py").write_text(
        "from pkg.pricing import apply_discount\n\n\ndef total(items, rate):\n"
        "    return apply_discount(sum(items), rate)\n"
    )
    (repo / "pkg" / "version.py").write_text('VERSION = "$Format:%H %G?$"\n')
    (repo / "tests" / "test_cart.py").write_text(
        "from pkg.cart import total\n\n\ndef test_total():\n    assert total([1, 2], 0) == 3\n"
    )
    (repo / "notes.txt").write_text("discount notes\n")
    # Committed, so archive (validate's export) reads it too; it names drivers only .git defines.
    (repo / ".gitattributes").write_text(
        "*.py filter=evil diff=evil export-subst\n*.txt filter=proc diff=evil\n"
    )
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "shop: prices and a cart")
    _git(repo, "tag", "v1.2.0")
    (repo / "pkg" / "pricing.py").write_text(
        "def apply_discount(amount, rate):\n    return round(amount * (1 - rate), 2)\n"
    )
    (repo / "tests" / "test_pricing.py").write_text(
        "from pkg.pricing import apply_discount\n\n\n"
        "def test_round():\n    assert apply_discount(10, 0.333) == 6.67\n"
    )
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "Fix rounding in apply_discount")
    cart = repo / "pkg" / "cart.py"
    cart.write_text(cart.read_text().replace("sum(items)", "sum(items or [])"))
    _git(repo, "commit", "-qam", "fix cart total for an empty cart")
    # The newest commit carries a (fake) signature: log.showSignature would hand it to gpg.
    raw = _git(repo, "cat-file", "commit", "HEAD")
    head, _, message = raw.partition("\n\n")
    signature = (
        "gpgsig -----BEGIN PGP SIGNATURE-----\n \n iQEzBAABCAAdFiEE\n -----END PGP SIGNATURE-----"
    )
    signed = subprocess.run(
        ["git", "hash-object", "-t", "commit", "-w", "--stdin"],
        input=f"{head}\n{signature}\n\n{message}",
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    _git(repo, "update-ref", "refs/heads/main", signed)

    # Now the hostile part: nothing above ran any of it.
    script = root / "mark.sh"
    script.write_text(SCRIPT.format(markers=markers))
    script.chmod(0o755)
    for hook_dir in (repo / ".git" / "hooks", hooks):
        hook_dir.mkdir(exist_ok=True)
        for name in HOOKS:
            hook = hook_dir / name
            hook.write_text(f"#!/bin/sh\ntouch {markers}/hook-{name}\n")
            hook.chmod(0o755)
    gpg = root / "gpg"
    gpg.write_text(f"#!/bin/sh\ntouch {markers}/gpg\nexit 1\n")
    gpg.chmod(0o755)
    run = f"{script} "
    config = {
        "core.fsmonitor": run + "fsmonitor",
        "core.pager": run + "pager",
        "pager.log": run + "pager-log",
        "core.editor": run + "editor",
        "sequence.editor": run + "sequence-editor",
        "core.askPass": run + "askpass",
        "core.sshCommand": run + "ssh",
        "core.alternateRefsCommand": run + "alternate-refs",
        "credential.helper": "!" + run + "credential",
        "filter.evil.clean": run + "clean",
        "filter.evil.smudge": run + "smudge",
        "filter.proc.process": run + "process",
        "diff.evil.command": run + "diff-driver",
        "diff.evil.textconv": run + "textconv",
        "diff.external": run + "diff-external",
        "log.showSignature": "true",
        "gpg.program": str(gpg),  # run as a program, not through the shell
        "status.showUntrackedFiles": "all",
    }
    if hooks_path:
        config["core.hooksPath"] = str(hooks)
    for key, value in config.items():
        _git(repo, "config", key, value)
    # Racy and changed files: a status must hash them (through the clean filter).
    (repo / "pkg" / "cart.py").write_text(cart.read_text() + "# touched\n")
    (repo / "pkg" / "new.py").write_text("def fresh():\n    return 1\n")
    for path in repo.rglob("*.py"):
        os.utime(path)
    return repo, markers


@pytest.fixture(params=["hooksPath", ".git/hooks"])
def hostile(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path]:
    return make_git_hostile(tmp_path, hooks_path=request.param == "hooksPath")


def ran(markers: Path) -> list[str]:
    return sorted(p.name for p in markers.iterdir())


def _ok(args: list[str]) -> Any:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, (args, result.output, result.exception)
    return result


def test_map_context_skeleton_run_nothing(hostile: tuple[Path, Path]) -> None:
    repo, markers = hostile
    mapped = _ok(["map", str(repo), "--task", "apply_discount rounding", "--json"])
    assert "pkg/pricing.py" in mapped.output
    _ok(["context", "pack", str(repo), "--task", "fix the cart total", "--json"])
    _ok(["context", str(repo), "--task", "discount notes"])
    _ok(["skeleton", str(repo / "pkg" / "cart.py")])
    assert ran(markers) == []


def test_mcp_tools_run_nothing(tmp_path: Path) -> None:
    repo, markers = make_git_hostile(tmp_path, hooks_path=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "hybrid", "mcp", "--root", str(repo)], env=env
    )

    async def session() -> None:
        async with Client(server) as client:
            for tool, arguments in (
                ("repo_map", {"task": "apply_discount rounding"}),
                ("context_pack", {"task": "fix the cart total"}),
                ("skeleton", {"path": "pkg/cart.py"}),
            ):
                result = await client.call_tool(tool, arguments)
                assert not result.is_error, (tool, result.content)

    anyio.run(session)
    assert ran(markers) == []


def test_context_eval_runs_nothing(hostile: tuple[Path, Path]) -> None:
    repo, markers = hostile
    result = CliRunner().invoke(cli, ["context", "eval", str(repo), "--limit", "5", "--json"])
    assert ran(markers) == []
    assert result.exit_code == 0, (result.output, result.exception)
    assert json.loads(result.stdout)["cases"] == 2  # both fixes were checked out and scored
    # The temporary worktree never touched the repository's own .git.
    assert not (repo / ".git" / "worktrees").exists()


def test_validate_and_gate_host_side_run_nothing(
    hostile: tuple[Path, Path], tmp_path: Path
) -> None:
    from hybrid.agent.gate import related_tests
    from hybrid.deps.detect import tag_release
    from hybrid.validate import change_of, export
    from hybrid.workstation.archive import repo_selection

    repo, markers = hostile
    change = change_of(repo, "HEAD~1")
    assert change.tests == ["tests/test_pricing.py"] and change.source == ["pkg/pricing.py"]
    export(repo, change.commit, tmp_path / "export")
    assert "round(" in (tmp_path / "export" / "pkg" / "pricing.py").read_text()
    assert tag_release(repo) == "1.2.0"
    assert "tests/test_cart.py" in related_tests(repo, ["pkg/cart.py"])
    selection = repo_selection(repo)
    assert selection.take("pkg/new.py", False)
    assert ran(markers) == []


@pytest.mark.engine
def test_gate_runs_nothing_on_the_host(engine: Any, tmp_path: Path) -> None:
    """`hybrid gate` end to end: related tests on the host, copy-in, the review diff."""
    repo, markers = make_git_hostile(tmp_path, hooks_path=True)
    patch = tmp_path / "fix.diff"
    patch.write_text(
        "--- a/pkg/pricing.py\n+++ b/pkg/pricing.py\n@@ -1,2 +1,3 @@\n"
        " def apply_discount(amount, rate):\n"
        "+    # checked\n"
        "     return round(amount * (1 - rate), 2)\n"
    )
    result = CliRunner().invoke(
        cli,
        ["gate", str(patch), "--repo", str(repo), "--test", "true", "--related", "true", "-q"],
    )
    assert ran(markers) == []
    assert result.exit_code == 0, (result.output, result.exception)
    assert "related tests: passed (tests/test_pricing.py)" in result.output
