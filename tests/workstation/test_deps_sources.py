"""Packages without a wheel (real engine, a real sdist-only package from the configured index):
the source archive is fetched on the host without being built, pip resolves around a stand-in,
and the package is built inside the sandbox with the network off. The project itself, run from
the workspace, answers importlib.metadata like an installed one."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

from hybrid import deps
from hybrid.deps import store
from hybrid.policy import SandboxSpec
from hybrid.workstation.base import Backend
from hybrid.workstation.docker import client

PYPROJECT = """[project]
name = "demo-proj"
version = "1.0"
dependencies = ["docopt==0.6.2"]
"""


def _probe(engine: Backend, repo: Path, code: str) -> list[str]:
    """What ``code`` prints in a workstation of ``repo`` with its dependencies installed (the
    workstation and its layer are removed afterwards)."""
    spec = SandboxSpec.model_validate(
        {"tier": "docker", "budget": {"wall_seconds": 300, "memory": "1G", "pids": 256}}
    )
    ws = deps.up(engine, repo, spec)
    layer = deps.installed(ws).layer
    try:
        ran = ws.exec(["python", "-B", "-c", code])
        assert ran.exit_code == 0, ran.stderr
        assert ws.diff() == ""
        return ran.stdout.split()
    finally:
        ws.remove()
        with contextlib.suppress(Exception):
            client().api.remove_image(layer, force=True)


def _checkout(root: Path, name: str, pyproject: str) -> Path:
    """A src-layout project ``name`` whose package says it is the checkout."""
    repo = root / name
    (repo / "src" / name).mkdir(parents=True)
    (repo / "pyproject.toml").write_text(pyproject)
    (repo / "src" / name / "__init__.py").write_text("FROM_CHECKOUT = True\n")
    return repo


def test_sdist_only_package_is_built_inside(engine, tmp_path: Path) -> None:
    repo = tmp_path / "demo"
    (repo / "src" / "demo_proj").mkdir(parents=True)
    (repo / "pyproject.toml").write_text(PYPROJECT)
    (repo / "src" / "demo_proj" / "__init__.py").write_text("VALUE = 42\n")
    manifest = deps.plan(repo)
    files = {a.filename for a in manifest.artifacts}
    # The source archive enters; the stand-in wheel used for resolving never does.
    assert "docopt-0.6.2.tar.gz" in files
    assert not any(f.startswith("docopt-") and f.endswith(".whl") for f in files)
    assert {"setuptools", "wheel"} <= {a.name for a in manifest.artifacts}  # its build needs
    probe = (
        "import docopt, demo_proj, importlib.metadata as m; "
        "print(docopt.__version__, demo_proj.VALUE, m.version('demo-proj'))"
    )
    assert _probe(engine, repo, probe) == ["0.6.2", "42", "1.0"]


def test_a_dependency_that_needs_the_project_does_not_shadow_the_checkout(
    engine, tmp_path: Path
) -> None:
    # python-dateutil needs six>=1.5, which a checkout at 0.1 is not, so the resolution falls
    # back to a released six; the tests must still import the checkout.
    repo = _checkout(
        tmp_path,
        "six",
        '[project]\nname = "six"\nversion = "0.1"\ndependencies = ["python-dateutil==2.9.0.post0"]\n',
    )
    manifest = deps.plan(repo)
    assert "six" in {a.name for a in manifest.artifacts}
    probe = (
        "import six, dateutil, importlib.metadata as m; "
        "print(six.__file__, six.FROM_CHECKOUT, m.version('six'))"
    )
    assert _probe(engine, repo, probe) == ["/workspace/src/six/__init__.py", "True", "0.1"]


def test_a_test_tool_that_needs_the_project_resolves_against_its_release(
    engine, tmp_path: Path
) -> None:
    # pytest needs pluggy, and today's pytest needs a newer pluggy than a checkout of 1.3.0:
    # resolved as `pip install -e .` would, the checkout gets a pytest that works with it.
    repo = _checkout(
        tmp_path,
        "pluggy",
        '[project]\nname = "pluggy"\ndynamic = ["version"]\n'
        '[project.optional-dependencies]\ntesting = ["pytest"]\n',
    )
    (repo / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: pluggy\nVersion: 1.3.0\n")
    manifest = deps.plan(repo)
    assert manifest.version == "1.3.0"
    found = {a.name: a for a in manifest.artifacts}
    assert "pluggy" not in found  # the stand-in never enters
    with zipfile.ZipFile(store.path_of(found["pytest"].sha256)) as wheel:
        metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        needs = [
            Requirement(line.split(":", 1)[1])
            for line in wheel.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist: pluggy")
        ]
    assert needs and needs[0].specifier.contains("1.3.0"), (found["pytest"].version, needs)
    probe = (
        "import pluggy, importlib.metadata as m; "
        "print(pluggy.FROM_CHECKOUT, m.version('pluggy'), m.version('pytest'))"
    )
    assert _probe(engine, repo, probe) == ["True", "1.3.0", found["pytest"].version]


def test_a_lockfile_pin_that_only_has_a_source_is_built_inside(engine, tmp_path: Path) -> None:
    # uv.lock pins docopt at a release with no wheel: with the pin as a constraint pip reports a
    # conflict (ResolutionImpossible), not a missing distribution (bidict's case).
    from hybrid.deps import sdist

    fetched = sdist.fetch("docopt==0.6.2", tmp_path)  # the index's archive, never built
    digest = store.add(fetched.path)[0]
    repo = tmp_path / "locked"
    (repo / "src" / "locked_proj").mkdir(parents=True)
    (repo / "src" / "locked_proj" / "__init__.py").write_text("VALUE = 7\n")
    (repo / "pyproject.toml").write_text(
        '[project]\nname = "locked-proj"\nversion = "1.0"\ndependencies = ["docopt"]\n'
    )
    (repo / "uv.lock").write_text(
        "version = 1\n\n"
        '[[package]]\nname = "docopt"\nversion = "0.6.2"\n'
        f'source = {{ registry = "{_pip_index()}" }}\n'
        f'sdist = {{ url = "https://example.invalid/docopt-0.6.2.tar.gz", hash = "sha256:{digest}" }}\n'
        '\n[[package]]\nname = "locked-proj"\nversion = "1.0"\nsource = { editable = "." }\n'
    )
    manifest = deps.plan(repo)
    assert "docopt-0.6.2.tar.gz" in {a.filename for a in manifest.artifacts}
    probe = "import docopt, locked_proj; print(docopt.__version__, locked_proj.VALUE)"
    assert _probe(engine, repo, probe) == ["0.6.2", "7"]


def _pip_index() -> str:
    """The index this machine's pip uses (its own configuration; no host written here)."""
    code = (
        "from pip._internal.commands import create_command\n"
        "options, _ = create_command('download').parse_args([])\n"
        "print(options.index_url)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.strip()
