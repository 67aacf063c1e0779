"""A Node project's lockfile installed offline inside (real engine, real npm packages from the
user's npm configuration, the node profile image): the tarballs are packed on the host, checked
against the lockfile's integrity, and ``npm ci --offline`` installs them with the network off."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hybrid import deps
from hybrid.policy import SandboxSpec
from hybrid.workstation import images
from hybrid.workstation.docker import client

TEST_JS = """const ms = require('ms');
if (ms('2h') !== 7200000) { console.error('wrong'); process.exit(1); }
console.log('ok ' + ms(60000));
"""


def _need_node_image() -> str:
    tag = images.profile_tag("node")
    reason = None
    if shutil.which("npm") is None:
        reason = "npm is not installed on the host (apt-get install npm)"
    elif images.get(tag) is None:
        reason = f"no {tag} image (run scripts/engine.sh or hybrid image bootstrap --profile node)"
    if reason:
        if os.environ.get("HYBRID_REQUIRE_ENGINE") == "1":
            pytest.fail(f"HYBRID_REQUIRE_ENGINE=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    return tag


def test_node_lockfile_installs_offline(engine, tmp_path: Path) -> None:
    image = _need_node_image()
    repo = tmp_path / "node-proj"
    repo.mkdir()
    (repo / "package.json").write_text(
        json.dumps(
            {
                "name": "node-proj",
                "version": "1.0.0",
                "private": True,
                "dependencies": {"ms": "2.1.3"},
            }
        )
    )
    (repo / "test.js").write_text(TEST_JS)
    # The lockfile the way a user makes one, through the host's own npm configuration.
    subprocess.run(
        ["npm", "install", "--package-lock-only", "--ignore-scripts", "--no-audit", "--no-fund"],
        cwd=repo,
        check=True,
        capture_output=True,
        timeout=300,
    )
    spec = SandboxSpec.model_validate(
        {"tier": "docker", "budget": {"wall_seconds": 300, "memory": "1G", "pids": 256}}
    )
    ws = deps.up(engine, repo, spec, image=image)
    layer = deps.installed(ws).layer
    try:
        assert ws.spec.network.mode == "none"
        interfaces = ws.exec(["cat", "/proc/net/dev"]).stdout
        assert [line.split(":")[0].strip() for line in interfaces.splitlines()[2:]] == ["lo"]
        ran = ws.exec(["node", "test.js"])
        assert ran.exit_code == 0, ran.stderr
        assert ran.stdout.strip() == "ok 1m"
        record = deps.installed(ws)
        entered = {(a.ecosystem, a.name, a.version) for a in record.manifest.artifacts}
        assert ("node", "ms", "2.1.3") in entered
        assert all(len(a.sha256) == 64 for a in record.manifest.artifacts)
        # Installed outside the workspace: nothing of it shows in the diff.
        assert "node_modules" not in ws.diff()
    finally:
        ws.remove()
        with contextlib.suppress(Exception):
            client().api.remove_image(layer, force=True)


def _node_project(
    root: Path, scripts: dict[str, str] | None = None, extra: dict[str, str] | None = None
) -> Path:
    """A project needing ms 2.1.3 (and ``extra``), its lockfile made by the host's npm (v3)."""
    repo = root / "node-proj"
    repo.mkdir()
    manifest: dict[str, object] = {
        "name": "node-proj",
        "version": "1.0.0",
        "private": True,
        "dependencies": {"ms": "2.1.3", **(extra or {})},
    }
    if scripts:
        manifest["scripts"] = scripts
    (repo / "package.json").write_text(json.dumps(manifest))
    (repo / "test.js").write_text(TEST_JS)
    subprocess.run(
        ["npm", "install", "--package-lock-only", "--ignore-scripts", "--no-audit", "--no-fund"],
        cwd=repo,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return repo


def _runs_test_js(  # type: ignore[no-untyped-def]
    engine, repo: Path, image: str, also: tuple[list[str], str] | None = None
) -> None:
    spec = SandboxSpec.model_validate(
        {"tier": "docker", "budget": {"wall_seconds": 300, "memory": "1G", "pids": 256}}
    )
    ws = deps.up(engine, repo, spec, image=image)
    layer = deps.installed(ws).layer
    try:
        ran = ws.exec(["node", "test.js"])
        assert ran.exit_code == 0, ran.stderr
        assert ran.stdout.strip() == "ok 1m"
        if also:
            command, expected = also
            ran = ws.exec(command)
            assert ran.exit_code == 0, ran.stderr
            assert ran.stdout.strip() == expected
    finally:
        ws.remove()
        with contextlib.suppress(Exception):
            client().api.remove_image(layer, force=True)


def test_a_v1_lockfile_installs_its_tree(engine, tmp_path: Path) -> None:
    # npm 5-6 wrote only the nested "dependencies" tree (json5's lockfile): read for "packages"
    # it named nothing, and the install silently installed nothing. Its packages' commands
    # (semver's bin) are linked as npm would link them from a lockfile that names them.
    image = _need_node_image()
    repo = _node_project(tmp_path, extra={"semver": "7.6.0"})
    v3 = json.loads((repo / "package-lock.json").read_text())
    tree: dict[str, object] = {}
    for where, entry in sorted(v3["packages"].items()):
        if not where:
            continue
        *parents, name = where.removeprefix("node_modules/").split("/node_modules/")
        level = tree
        for parent in parents:
            level = level[parent].setdefault("dependencies", {})  # type: ignore[index,attr-defined]
        level[name] = {k: entry[k] for k in ("version", "resolved", "integrity") if k in entry}
        if entry.get("dependencies"):
            level[name]["requires"] = entry["dependencies"]  # type: ignore[index]
    v1 = {"name": "node-proj", "version": "1.0.0", "lockfileVersion": 1, "requires": True}
    (repo / "package-lock.json").write_text(json.dumps({**v1, "dependencies": tree}, indent=2))
    manifest = deps.plan(repo, image=image)
    assert ("ms", "2.1.3") in {(a.name, a.version) for a in manifest.artifacts}
    _runs_test_js(engine, repo, image, also=(["semver", "1.2.3"], "1.2.3"))


def test_the_projects_own_install_scripts_do_not_run_where_it_is_not(
    engine, tmp_path: Path
) -> None:
    # minimatch's `prepare` (tshy) builds its src/, which the install directory (package.json
    # and the lockfile only) does not hold: npm ci failed, and the whole install with it.
    image = _need_node_image()
    repo = _node_project(tmp_path, {"prepare": "node build.js", "postinstall": "exit 3"})
    (repo / "build.js").write_text("process.exit(0)\n")  # in the workspace, not the install dir
    _runs_test_js(engine, repo, image)
