"""Dependency detection (static: no project code runs) and the workstation budget defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.deps import detect
from hybrid.errors import InvalidInput
from hybrid.policy import WORKSTATION_BUDGET, Budget, SandboxSpec, for_workstation


def test_pyproject_groups_extras_and_self_references(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "Demo_Pkg"\ndependencies = ["idna>=3"]\n'
        '[project.optional-dependencies]\nsocks = ["PySocks>=1.5"]\ntest = ["pytest>=8"]\ndocs = ["sphinx"]\n'
        '[dependency-groups]\ntest = ["demo-pkg[socks]", {include-group = "base"}]\nbase = ["trustme"]\n'
        'lint = ["ruff"]\n'
    )
    (tmp_path / "src" / "demo_pkg").mkdir(parents=True)
    (tmp_path / "src" / "demo_pkg" / "__init__.py").write_text("")
    declared = detect(tmp_path)
    specs = {r.spec for r in declared.python}
    assert specs == {"idna>=3", "PySocks>=1.5", "pytest>=8", "trustme"}
    assert declared.project == "demo-pkg"
    assert declared.paths == ["src"]


def test_requirements_includes_hashes_and_setup_py_never_runs(tmp_path: Path) -> None:
    (tmp_path / "requirements-dev.txt").write_text(
        "-r requirements/base.txt\n-e .[extra]\n--pre\n"
        "six==1.16.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"
    )
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "base.txt").write_text("attrs>=22  # comment\n")
    marker = tmp_path / "ran"
    (tmp_path / "setup.py").write_text(
        f"open({str(marker)!r}, 'w')\nfrom setuptools import setup\n"
        "DEPS = ['click>=8']\nsetup(name='demo', install_requires=DEPS, extras_require={'extra': ['rich']})\n"
    )
    declared = detect(tmp_path)
    assert not marker.exists()
    specs = {r.spec: r.pinned for r in declared.python}
    assert specs == {"click>=8": False, "rich": False, "attrs>=22": False, "six==1.16.0": True}
    assert declared.hashes == {"six==1.16.0": ["a" * 64]}


@pytest.mark.parametrize(
    ("name", "text"),
    [
        (
            "pyproject.toml",
            '[project]\nname = "demo"\n[project.scripts]\ndemo = "demo.cli:main"\n'
            '[project.entry-points.pytest11]\ndemo = "demo.plugin"\n',
        ),
        (
            "setup.cfg",
            "[metadata]\nname = demo\n[options.entry_points]\n"
            "console_scripts =\n    demo = demo.cli:main\npytest11 =\n    demo = demo.plugin\n",
        ),
        (
            "setup.py",
            "from setuptools import setup\nsetup(name='demo', entry_points={'console_scripts': "
            "['demo = demo.cli:main'], 'pytest11': ['demo = demo.plugin']})\n",
        ),
    ],
)
def test_the_projects_entry_points(tmp_path: Path, name: str, text: str) -> None:
    """What `pip install -e .` would make of them: commands and plugins the tests use."""
    (tmp_path / name).write_text(text)
    assert detect(tmp_path).entry_points == {
        "console_scripts": {"demo": "demo.cli:main"},
        "pytest11": {"demo": "demo.plugin"},
    }


def test_uv_lock_pins_and_a_changed_file_changes_the_inputs(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "demo"\ndependencies = ["idna"]\n')
    (tmp_path / "uv.lock").write_text(
        '[[package]]\nname = "demo"\nversion = "0.1"\nsource = { editable = "." }\n'
        '[[package]]\nname = "idna"\nversion = "3.7"\n'
        'wheels = [{ url = "x", hash = "sha256:' + "b" * 64 + '" }]\n'
    )
    first = detect(tmp_path)
    assert first.locked == {"idna": "3.7"}
    assert first.hashes == {"idna==3.7": ["b" * 64]}
    assert all(r.pinned for r in first.python)
    (tmp_path / "uv.lock").write_text((tmp_path / "uv.lock").read_text().replace("3.7", "3.8"))
    assert detect(tmp_path).inputs != first.inputs


def test_a_malformed_requirement_names_its_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("ok==1\nnot a requirement!!\n")
    with pytest.raises(InvalidInput, match=r"requirements.txt:2: not a requirement"):
        detect(tmp_path)


def test_workstation_budgets_fill_only_what_the_spec_leaves_unset() -> None:
    filled = for_workstation(SandboxSpec(tier="docker"))
    assert filled.budget.wall_seconds == WORKSTATION_BUDGET["wall_seconds"]
    assert filled.budget.memory == WORKSTATION_BUDGET["memory"]
    mine = SandboxSpec(tier="docker", budget=Budget(wall_seconds=5))
    kept = for_workstation(mine)
    assert kept.budget.wall_seconds == 5
    assert kept.budget.memory == WORKSTATION_BUDGET["memory"]
    # A policy file read back from TOML keeps what it says.
    spec = SandboxSpec.from_dict({"tier": "docker", "budget": {"memory": "1G"}})
    assert for_workstation(spec).budget.memory == 1024**3


def test_a_deps_policy_round_trips_through_toml(tmp_path: Path) -> None:
    spec = SandboxSpec.from_dict(
        {
            "tier": "docker",
            "deps": {
                "deny": ["evil*"],
                "max_bytes": "500M",
                "require_pins": True,
                "exclude_newer": "2021-05-20",
            },
        }
    )
    path = tmp_path / "p.toml"
    path.write_text(spec.to_toml())
    assert SandboxSpec.from_toml(path) == spec
    assert "[deps]" not in SandboxSpec(tier="docker").to_toml()


def test_the_unit_test_environments_own_dependencies_are_read(tmp_path: Path) -> None:
    # pyparsing's shape: tox installs pytest only for its "unit" factor, and sphinx only for
    # "doctest"; without the first the tests have nothing to run them.
    (tmp_path / "tox.ini").write_text(
        "[testenv]\ndeps =\n  unit: pytest\n  unit: matplotlib; python_version < '3.15'\n"
        "  doctest: sphinx\n  coverage: coverage\n  !pypy: trio\n  unit,docs: furo\n"
    )
    specs = {r.spec for r in detect(tmp_path).python}
    assert specs == {"pytest", "matplotlib; python_version < '3.15'"}


def test_the_files_tox_installs_are_read_and_not_their_siblings(tmp_path: Path) -> None:
    # jinja's shape: pip-compiled sets for several environments, whose pins conflict; a
    # factor's own dependencies (pluggy's "coverage: coverage") are tox's to choose.
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "tests.txt").write_text("packaging==24.1\npytest==8.3.3\n")
    (tmp_path / "requirements" / "tests37.txt").write_text("packaging==24.0\npytest==7.4.4\n")
    (tmp_path / "tox.ini").write_text(
        "[testenv]\ndeps =\n  -r requirements/tests.txt\n  coverage: coverage\n  !pypy,py3: trio\n"
    )
    assert {r.spec for r in detect(tmp_path).python} == {"packaging==24.1", "pytest==8.3.3"}
    # Without tox naming them, every set is read (there is no better evidence).
    (tmp_path / "tox.ini").unlink()
    assert len(detect(tmp_path).python) == 4


def test_a_package_locked_per_python_range_is_left_to_pip(tmp_path: Path) -> None:
    # sqlparse's uv.lock: sphinx 8.1.3 below 3.11 and 9.1.0 from 3.12; pinning either one
    # for every target made pip's resolution impossible on 3.11.
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "demo"\n[dependency-groups]\ndev = ["sphinx", "idna"]\n'
    )
    rows = [("sphinx", "8.1.3", "c"), ("sphinx", "9.1.0", "d"), ("idna", "3.7", "e")]
    (tmp_path / "uv.lock").write_text(
        "".join(
            f'[[package]]\nname = "{n}"\nversion = "{v}"\n'
            f'wheels = [{{ url = "x", hash = "sha256:{h * 64}" }}]\n'
            for n, v, h in rows
        )
    )
    declared = detect(tmp_path)
    assert declared.locked == {"idna": "3.7"}
    assert set(declared.hashes) == {"sphinx==8.1.3", "sphinx==9.1.0", "idna==3.7"}
    assert {r.spec: r.pinned for r in declared.python} == {"sphinx": False, "idna": True}


def test_the_release_a_checkout_is_at(tmp_path: Path) -> None:
    """Stated in its files first, then an sdist's PKG-INFO, then its latest git tag; a pre or
    local release counts as its release, and nothing readable is None."""
    import subprocess

    repo = tmp_path / "proj"
    repo.mkdir()
    (repo / "pyproject.toml").write_text('[project]\nname = "proj"\nversion = "2.1.0.dev3"\n')
    assert detect(repo).version == "2.1.0"
    (repo / "pyproject.toml").write_text('[project]\nname = "proj"\ndynamic = ["version"]\n')
    assert detect(repo).version is None
    (repo / "setup.cfg").write_text("[metadata]\nversion = attr: proj.__version__\n")
    assert detect(repo).version is None
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    subprocess.run([*git, "tag", "v1.4.2"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "two"], check=True)
    first = detect(repo)
    assert first.version == "1.4.2"
    (repo / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: proj\nVersion: 1.5.0+local\n")
    second = detect(repo)
    assert second.version == "1.5.0"
    assert second.inputs != first.inputs  # a new release resolves again


def test_ordinary_requirements_pass_the_screen(tmp_path: Path) -> None:
    """What the hostile screen must not refuse: dotted names, extras, markers, pins, the project
    itself with its extras, a harmless option, an include inside the repository."""
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "base.txt").write_text("-r ../requirements-pins.txt\n")
    (tmp_path / "requirements-pins.txt").write_text("attrs==23.1.0\n")
    (tmp_path / "requirements.txt").write_text(
        "--pre\n-e .[test]\n.\nzope.interface>=5\nbackports.zoneinfo; python_version < '3.9'\n"
        "pytest[testing]==8.0 ; sys_platform != 'win32'\n-r requirements/base.txt\n"
    )
    (tmp_path / "tox.ini").write_text("[testenv]\ndeps =\n    -e .\n    coverage: coverage\n")
    specs = {r.spec for r in detect(tmp_path).python}
    assert specs == {
        "attrs==23.1.0",
        "zope.interface>=5",
        "backports.zoneinfo; python_version < '3.9'",
        "pytest[testing]==8.0 ; sys_platform != 'win32'",
    }
