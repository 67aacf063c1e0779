"""Dependencies admitted on the host and installed offline (real engine, real packages from
the user's configured index): admission refuses before anything enters, tampering is caught,
layers are reused while the lockfile is unchanged, and nothing is left behind on any path."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybrid import deps
from hybrid.deps import layers, store
from hybrid.errors import DependencyError, PolicyViolation
from hybrid.policy import DepsPolicy, SandboxSpec
from hybrid.workstation.docker import LABEL_KIND, LABEL_MANAGED, LABEL_OWNER, client
from hybrid.workstation.docker.labels import _owner
from hybrid.workstation.images import BASE_IMAGE

SMALL = "six==1.16.0\niniconfig==2.0.0\n"


def _spec(tier: str, **policy: object) -> SandboxSpec:
    return SandboxSpec.model_validate(
        {"tier": tier, "budget": {"wall_seconds": 120, "memory": "512M", "pids": 128}}
        | ({"deps": policy} if policy else {})
    )


def _project(root: Path, requirements: str) -> Path:
    repo = root / f"proj-{secrets.token_hex(3)}"
    repo.mkdir()
    (repo / "requirements.txt").write_text(requirements)
    (repo / "test_it.py").write_text("import six\n\ndef test_six():\n    assert six.PY3\n")
    return repo


def _layer_ref(repo: Path, spec: SandboxSpec) -> str:
    manifest = deps.plan(repo, spec)
    image_id = client().api.inspect_image(BASE_IMAGE)["Id"]
    return f"{layers.REPOSITORY}:{layers.key_of(image_id, manifest)[:32]}"


def _drop(ref: str) -> None:
    from docker import errors

    with contextlib.suppress(errors.NotFound):
        client().api.remove_image(ref, force=True)


def _leftovers() -> list[str]:
    """Build containers this process made and staging directories still on disk."""
    api = client().api
    builders = api.containers(
        all=True,
        filters={
            "label": [
                f"{LABEL_MANAGED}=1",
                f"{LABEL_KIND}=deps-builder",
                f"{LABEL_OWNER}={_owner()}",
            ]
        },
    )
    staging = Path(os.environ["HYBRID_CACHE_DIR"], "deps", "staging")
    return [row["Id"][:12] for row in builders] + [p.name for p in staging.glob("build-*")]


@pytest.fixture
def made_refs() -> Iterator[list[str]]:
    """Layer refs a test makes; removed afterwards whatever happened."""
    refs: list[str] = []
    yield refs
    for ref in refs:
        _drop(ref)


def test_offline_install_with_network_none(engine, tier, tmp_path, made_refs) -> None:
    repo = _project(tmp_path, SMALL)
    spec = _spec(tier)
    made_refs.append(_layer_ref(repo, spec))
    _drop(made_refs[0])  # a crashed earlier run must not turn this into a cache hit
    with deps.up(engine, repo, spec) as ws:
        attrs = client().api.inspect_container(ws.id)
        assert attrs["HostConfig"]["NetworkMode"] == "none"
        assert attrs["Config"]["Image"] == made_refs[0]
        result = ws.exec(
            "python -c 'import six, iniconfig, sys; print(six.__version__, sys.prefix)'"
        )
        assert result.ok, result.stderr
        assert result.stdout.split() == ["1.16.0", "/opt/hybrid/venv"]
        assert ws.diff() == ""  # installed files live outside the workspace
        tests = ws.exec(["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_it.py"])
        assert tests.ok, tests.stdout + tests.stderr
        # Nothing reaches out, and the installed files are not workspace changes.
        probe = ws.exec(
            "python -c \"import socket; socket.create_connection(('198.51.100.1', 80), timeout=3)\""
        )
        assert not probe.ok
        assert "six" not in ws.diff()  # only the test run's own __pycache__
        record = deps.installed(ws)
        assert record.cache_hit is False
        entered = {(a.name, a.version) for a in record.manifest.artifacts}
        assert entered == {("six", "1.16.0"), ("iniconfig", "2.0.0")}
        assert all(len(a.sha256) == 64 for a in record.manifest.artifacts)
    assert _leftovers() == []


def test_outside_the_approved_manifest_is_refused_before_anything_enters(
    engine, tmp_path, made_refs
) -> None:
    approved_repo = _project(tmp_path, "six==1.16.0\n")
    approved = tmp_path / "approved.json"
    approved.write_text(deps.plan(approved_repo).model_dump_json())
    repo = _project(tmp_path, SMALL)
    spec = _spec("docker", approved=str(approved))
    name = f"deps-refused-{secrets.token_hex(3)}"
    before = {row["Id"] for row in client().api.images(name=layers.REPOSITORY)}
    with pytest.raises(PolicyViolation) as refused:
        deps.up(engine, repo, spec, name=name)
    assert any(
        "iniconfig 2.0.0" in v and "approved manifest" in v for v in refused.value.violations
    )
    assert not any("six" in v for v in refused.value.violations)
    assert client().api.containers(all=True, filters={"name": f"hybrid-{name}"}) == []
    assert {row["Id"] for row in client().api.images(name=layers.REPOSITORY)} == before
    assert _leftovers() == []


def test_deny_allow_pins_and_size_are_all_reported(engine, tmp_path) -> None:
    repo = _project(tmp_path, "six==1.16.0\niniconfig>=2\n")
    manifest = deps.plan(repo)
    violations = deps.admit(
        manifest,
        DepsPolicy(deny=["six"], allow=["six", "pytest*"], require_pins=True, max_bytes=1024),
    )
    text = "\n".join(violations)
    assert "six 1.16.0 is denied" in text
    assert "iniconfig" in text and "not on the allow-list" in text
    assert "'iniconfig>=2' in requirements.txt is not pinned" in text
    assert "over deps.max_bytes" in text


def test_a_tampered_artifact_is_refused(engine, tmp_path, made_refs) -> None:
    repo = _project(tmp_path, "six==1.16.0\n")
    manifest = deps.plan(repo)
    six = next(a for a in manifest.artifacts if a.name == "six")
    stored = store.path_of(six.sha256)
    original = stored.read_bytes()
    stored.chmod(0o644)
    stored.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    try:
        name = f"deps-tampered-{secrets.token_hex(3)}"
        with pytest.raises(PolicyViolation, match="sha256 mismatch"):
            deps.up(engine, repo, _spec("docker"), name=name)
        assert client().api.containers(all=True, filters={"name": f"hybrid-{name}"}) == []
    finally:
        stored.write_bytes(original)
        stored.chmod(0o444)
    assert _leftovers() == []


def test_a_lockfile_hash_mismatch_is_refused(engine, tmp_path) -> None:
    repo = _project(tmp_path, "six==1.16.0 --hash=sha256:" + "0" * 64 + "\n")
    with pytest.raises(
        (DependencyError, PolicyViolation), match=r"sha256 .* not one the lockfile pins"
    ):
        deps.plan(repo)


def test_a_cache_hit_is_used_and_a_lockfile_change_misses(engine, tmp_path, made_refs) -> None:
    repo = _project(tmp_path, "six==1.16.0\n")
    spec = _spec("docker")
    made_refs.append(_layer_ref(repo, spec))
    _drop(made_refs[0])
    with deps.up(engine, repo, spec) as first:
        assert deps.installed(first).cache_hit is False
    with deps.up(engine, repo, spec) as second:
        record = deps.installed(second)
        assert record.cache_hit is True
        assert record.layer == made_refs[0]
        assert record.seconds["install"] < 5
    (repo / "requirements.txt").write_text("six==1.17.0\n")
    made_refs.append(_layer_ref(repo, spec))
    _drop(made_refs[1])
    with deps.up(engine, repo, spec) as third:
        record = deps.installed(third)
        assert record.cache_hit is False
        assert record.layer == made_refs[1] != made_refs[0]
        assert (
            third.exec("python -c 'import six; print(six.__version__)'").stdout.strip() == "1.17.0"
        )
    listed = {layer.ref for layer in deps.list_layers()}
    assert set(made_refs) <= listed
    assert _leftovers() == []


def test_a_failed_install_leaves_nothing(engine, tmp_path) -> None:
    repo = _project(tmp_path, "six==1.16.0\n")
    manifest = deps.plan(repo)
    manifest = manifest.model_copy(update={"paths": [f"x-{secrets.token_hex(4)}"]})  # a fresh key
    image_id = client().api.inspect_image(BASE_IMAGE)["Id"]
    ref = f"{layers.REPOSITORY}:{layers.key_of(image_id, manifest)[:32]}"
    with pytest.raises(DependencyError, match="took over"):
        layers.ensure(manifest, BASE_IMAGE, timeout=0.01)
    assert client().api.images(name=ref) == []
    assert _leftovers() == []


def test_prune_evicts_unused_layers_and_keeps_used_ones(engine, tmp_path, made_refs) -> None:
    repo = _project(tmp_path, "iniconfig==2.0.0\n")
    spec = _spec("docker")
    made_refs.append(_layer_ref(repo, spec))
    with deps.up(engine, repo, spec) as ws:
        kept = deps.prune(0, keep={x.key for x in deps.list_layers() if x.ref not in made_refs})
        assert made_refs[0] in kept.kept_in_use
        assert made_refs[0] in {layer.ref for layer in deps.list_layers()}
        assert ws.exec("python -c 'import iniconfig'").ok
    report = deps.prune(0, keep={x.key for x in deps.list_layers() if x.ref not in made_refs})
    assert made_refs[0] in report.layers
    assert made_refs[0] not in {layer.ref for layer in deps.list_layers()}


def test_cli_up_deps_exec_and_ws_deps(engine, hybrid_cli, tmp_path, made_refs) -> None:
    repo = _project(tmp_path, "six==1.16.0\n")
    made_refs.append(_layer_ref(repo, _spec("docker")))
    name = f"deps-cli-{secrets.token_hex(3)}"
    code, out, err = hybrid_cli("ws", "up", name, "--repo", str(repo), "--deps", "--json")
    try:
        assert code == 0, err
        code, out, err = hybrid_cli(
            "ws", "exec", name, "--", "python", "-m", "pytest", "-q", "-p", "no:cacheprovider"
        )
        assert code == 0, out + err
        assert "1 passed" in out
        code, out, err = hybrid_cli("ws", "deps", name, "--json")
        assert code == 0, err
        shown = json.loads(out)
        assert [(a["name"], a["version"]) for a in shown["manifest"]["artifacts"]] == [
            ("six", "1.16.0")
        ]
    finally:
        hybrid_cli("ws", "down", name)


def test_a_timeout_says_how_to_raise_it(ws) -> None:
    result = ws.exec("sleep 10", timeout=1)
    assert result.termination.value == "timeout"
    assert "ws exec --timeout SECONDS" in result.detail
    assert "budget.wall_seconds" in result.detail
