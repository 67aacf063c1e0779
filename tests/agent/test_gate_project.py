"""The gate installs the project as validation does (real engine, real packages from the
configured index): a small project whose tests need a dependency (iniconfig) and the version
module hatch-vcs writes at build time (gitignored, so absent from the checkout) is ready with
a plain ``hybrid gate --test ...``; with ``--no-deps`` the same fix is blocked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hybrid.agent.gate import BLOCKED, READY, gate
from hybrid.agent.project import declares_dependencies, generated_files
from hybrid.policy import SandboxSpec

ENV = {
    "PATH": "/usr/bin:/bin",
    "GIT_AUTHOR_NAME": "hybrid",
    "GIT_AUTHOR_EMAIL": "test@hybrid.invalid",
    "GIT_COMMITTER_NAME": "hybrid",
    "GIT_COMMITTER_EMAIL": "test@hybrid.invalid",
}
PYPROJECT = """[build-system]
requires = ["hatchling", "hatch-vcs"]
build-backend = "hatchling.build"

[project]
name = "tally"
dynamic = ["version"]
dependencies = ["iniconfig"]
optional-dependencies.test = ["pytest"]

[tool.hatch.version]
source = "vcs"

[tool.hatch.build.hooks.vcs]
version-file = "src/tally/_version.py"
"""
INIT = """from iniconfig import IniConfig

from ._version import __version__


def count(path):
    \"\"\"The number of keys in an ini file's sections.\"\"\"
    ini = IniConfig(path)
    return sum(len(list(section)) for section in ini) - 1
"""
TEST = """from tally import __version__, count


def test_counts_every_key(tmp_path):
    path = tmp_path / "a.ini"
    path.write_text("[a]\\nx = 1\\ny = 2\\n[b]\\nz = 3\\n")
    assert count(str(path)) == 3


def test_has_a_version():
    assert __version__ == "1.2.0"
"""
FIX = """--- a/src/tally/__init__.py
+++ b/src/tally/__init__.py
@@ -7,4 +7,4 @@
 def count(path):
     \"\"\"The number of keys in an ini file's sections.\"\"\"
     ini = IniConfig(path)
-    return sum(len(list(section)) for section in ini) - 1
+    return sum(len(list(section)) for section in ini)
"""
COMMAND = "python3 -m pytest -q -p no:cacheprovider tests/test_tally.py"
SPEC = SandboxSpec.model_validate(
    {"tier": "docker", "budget": {"wall_seconds": 300, "memory": "1G", "pids": 256}}
)


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, env=ENV, capture_output=True, check=True)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gate-project") / "tally"
    (root / "src" / "tally").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / ".gitignore").write_text("src/tally/_version.py\n")
    (root / "src" / "tally" / "__init__.py").write_text(INIT)
    (root / "tests" / "test_tally.py").write_text(TEST)
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "tally")
    _git(root, "tag", "v1.2.0")
    return root


def test_the_version_module_a_build_writes_is_generated(project: Path) -> None:
    assert declares_dependencies(project)
    assert list(generated_files(project, "1.2.0")) == ["src/tally/_version.py"]
    assert not (project / "src" / "tally" / "_version.py").exists()  # the user's tree untouched


@pytest.mark.engine
def test_the_real_fix_is_ready_with_plain_flags(engine, project: Path) -> None:
    report = gate(FIX, project, test=COMMAND, spec=SPEC)
    assert report.disposition == READY, report.reasons
    assert "b/src/tally/_version.py" not in report.reviewed_diff  # generated, not the patch's
    assert not (project / "src" / "tally" / "_version.py").exists()


@pytest.mark.engine
def test_without_the_dependencies_the_fix_is_blocked(engine, project: Path) -> None:
    report = gate(FIX, project, test=COMMAND, spec=SPEC, deps=False)
    assert report.disposition == BLOCKED
    assert any("test" in r and "failed" in r for r in report.reasons), report.reasons


@pytest.mark.engine
def test_the_cli_installs_by_default_and_no_deps_turns_it_off(
    engine, project: Path, tmp_path: Path
) -> None:
    patch = tmp_path / "fix.diff"
    patch.write_text(FIX)
    base = [sys.executable, "-m", "hybrid", "gate", str(patch), "--repo", str(project)]
    base += ["--test", COMMAND, "--quiet", "--json"]
    ready = subprocess.run(base, capture_output=True, text=True, check=False)
    assert ready.returncode == 0, ready.stderr + ready.stdout
    assert json.loads(ready.stdout)["disposition"] == READY
    off = subprocess.run([*base, "--no-deps"], capture_output=True, text=True, check=False)
    assert off.returncode == 1, off.stderr
    assert json.loads(off.stdout)["disposition"] == BLOCKED


def test_deps_on_a_tier_without_images_is_bad_input(project: Path) -> None:
    from hybrid.errors import InvalidInput

    spec = SandboxSpec.model_validate({"tier": "bwrap"})
    with pytest.raises(InvalidInput, match="--deps"):
        gate(FIX, project, test=COMMAND, spec=spec, deps=True)


INDEX_JS = "exports.add = (a, b) => a - b;\n"
TEST_JS = """const { test } = require('uvu');
const assert = require('uvu/assert');
const { add } = require('../index.js');

test('adds', () => {
  assert.is(add(2, 2), 4);
});

test.run();
"""
FIX_JS = """--- a/index.js
+++ b/index.js
@@ -1 +1 @@
-exports.add = (a, b) => a - b;
+exports.add = (a, b) => a + b;
"""


@pytest.mark.engine
def test_a_node_projects_own_runner_is_found(engine, tmp_path: Path) -> None:
    # The runner (uvu, as jest, mocha or tap) is a devDependency: the gate finds it on PATH
    # from the installed node_modules/.bin, not from the image.
    import os
    import shutil

    from hybrid.workstation import images

    tag = images.profile_tag("node")
    if shutil.which("npm") is None or images.get(tag) is None:
        reason = f"needs npm on the host and the {tag} image"
        if os.environ.get("HYBRID_REQUIRE_ENGINE") == "1":
            pytest.fail(f"HYBRID_REQUIRE_ENGINE=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    repo = tmp_path / "adder"
    (repo / "test").mkdir(parents=True)
    (repo / "package.json").write_text(
        json.dumps(
            {
                "name": "adder",
                "version": "1.0.0",
                "private": True,
                "devDependencies": {"uvu": "0.5.6"},
            }
        )
    )
    (repo / "index.js").write_text(INDEX_JS)
    (repo / "test" / "add.test.js").write_text(TEST_JS)
    subprocess.run(
        ["npm", "install", "--package-lock-only", "--ignore-scripts", "--no-audit", "--no-fund"],
        cwd=repo,
        check=True,
        capture_output=True,
        timeout=300,
    )
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "adder")
    ready = gate(FIX_JS, repo, test="uvu test", spec=SPEC, image=tag)
    assert ready.disposition == READY, ready.reasons
    off = gate(FIX_JS, repo, test="uvu test", spec=SPEC, image=tag, deps=False)
    assert off.disposition == BLOCKED
    assert "uvu" in off.reasons[0], off.reasons
