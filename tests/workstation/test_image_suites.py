"""An image of a newer Debian release, for a newer Python, built with this machine's own
debootstrap and mirror (real engine, real Debian packages): a release the machine's apt sources
and debootstrap do not know (forky, Python 3.14, on bookworm) still builds, and a project's
dependencies resolve for its interpreter and install offline."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from hybrid import deps
from hybrid.deps.layers import target
from hybrid.policy import SandboxSpec
from hybrid.workstation import images
from hybrid.workstation.docker import client

SUITE, PYTHON = "forky", "3.14"


def test_a_newer_release_builds_and_installs_for_its_python(engine, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("debootstrap needs root")
    tag = f"hybrid-test/base:{SUITE}-{os.getpid()}"
    repo = tmp_path / "proj"
    repo.mkdir()
    (repo / "requirements.txt").write_text("six==1.16.0\n")
    spec = SandboxSpec.model_validate(
        {"tier": "docker", "budget": {"wall_seconds": 120, "memory": "512M", "pids": 128}}
    )
    layer = None
    try:
        info = images.bootstrap(tag, suite=SUITE, force=True)
        assert info.built
        assert target(tag).python == PYTHON
        with deps.up(engine, repo, spec, image=tag) as ws:
            layer = deps.installed(ws).layer
            ran = ws.exec(
                "python -c 'import six, sys; print(six.__version__, *sys.version_info[:2])'"
            )
            assert ran.ok, ran.stderr
            assert ran.stdout.split() == ["1.16.0", *PYTHON.split(".")]
            assert ws.spec.network.mode == "none"
    finally:
        from docker import errors

        for ref in (layer, tag):
            if ref:
                with contextlib.suppress(errors.NotFound):
                    client().api.remove_image(ref, force=True)
