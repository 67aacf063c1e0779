"""The microVM's artifacts: what the initramfs carries, and that stale artifacts are not booted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hybrid.workstation.microvm import build


def _entries(cpio: bytes) -> dict[str, bytes]:
    """name -> data of a newc archive."""
    found: dict[str, bytes] = {}
    offset = 0
    while True:
        header = cpio[offset : offset + 110]
        assert header[:6] == b"070701"
        fields = [int(header[6 + 8 * i : 14 + 8 * i], 16) for i in range(13)]
        size, name_size = fields[6], fields[11]
        name = cpio[offset + 110 : offset + 110 + name_size - 1].decode()
        start = offset + 110 + name_size
        start += -start % 4
        if name == "TRAILER!!!":
            return found
        found[name] = cpio[start : start + size]
        offset = start + size
        offset += -offset % 4


@pytest.fixture
def artifacts(microvm: object) -> build.Artifacts:
    made = build.built()
    assert made is not None  # the microvm fixture stops the test otherwise
    return made


def test_the_initramfs_carries_its_modules_unsigned(artifacts: build.Artifacts) -> None:
    entries = _entries(artifacts.initramfs.read_bytes())
    modules = {name: data for name, data in entries.items() if name.endswith(".ko")}
    assert "lib/modules/ext4.ko" in modules
    for name, data in modules.items():
        assert data[:4] == b"\x7fELF", name
        assert not data.endswith(build.SIGNATURE_MAGIC), f"{name} still carries its signature"
    signed = next((artifacts.kernel.parent / "modules").glob("ext4.ko")).read_bytes()
    assert signed.endswith(build.SIGNATURE_MAGIC)  # what the kernel package shipped
    assert signed.startswith(modules["lib/modules/ext4.ko"])
    assert entries["init"][:4] == b"\x7fELF"  # the agent, compiled: no shell, no interpreter
    assert not any(name.startswith("bin/") for name in entries)


def test_artifacts_of_an_older_guest_agent_are_not_booted(
    artifacts: build.Artifacts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cache whose current artifacts came from other guest sources (an upgrade of hybrid):
    # the tier must ask for a rebuild, not boot an agent the host no longer speaks to.
    monkeypatch.setenv("HYBRID_MICROVM_CACHE", str(tmp_path))
    stale = tmp_path / "initramfs-0123456789abcdef"
    stale.mkdir()
    shutil.copy(artifacts.initramfs, stale / "initramfs.cpio")
    current = artifacts.model_copy(update={"initramfs": stale / "initramfs.cpio"})
    (tmp_path / "current.json").write_text(current.model_dump_json())
    assert build.built() is None
    (tmp_path / "current.json").write_text(artifacts.model_dump_json())
    assert build.built() == artifacts


def test_prune_removes_what_nothing_boots_and_keeps_the_rest(
    artifacts: build.Artifacts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Artifacts of an older agent, templates of older artifacts and a build a crash left go;
    the current artifacts, their templates and a build in progress stay."""
    import os
    import time

    monkeypatch.setenv("HYBRID_MICROVM_CACHE", str(tmp_path))
    (tmp_path / "current.json").write_text(artifacts.model_dump_json())
    current_dir = tmp_path / artifacts.initramfs.parent.name  # current: kept by name
    current_dir.mkdir()
    (current_dir / "initramfs.cpio").write_bytes(b"x" * 8192)
    old_agent = tmp_path / "initramfs-0123456789abcdef"
    old_agent.mkdir()
    (old_agent / "initramfs.cpio").write_bytes(b"x" * 8192)
    templates = tmp_path / "templates"
    templates.mkdir()
    mine = templates / f"{artifacts.key}-0c8b3013-m384-c1-s1.vmstate"
    older = templates / "0000000000000000-0c8b3013-m384-c1-s1.vmstate"
    for path in (mine, older):
        path.write_bytes(b"v" * 8192)
    crashed, building = templates / ".build-crashed", templates / ".build-now"
    crashed.mkdir()
    building.mkdir()
    an_hour_ago = time.time() - 7200
    os.utime(crashed, (an_hour_ago, an_hour_ago))

    usage = build.cache_usage()
    assert usage.templates == 1 and usage.templates_bytes >= 8192
    assert sorted(usage.stale) == sorted(
        [old_agent.name, f"templates/{older.name}", f"templates/{crashed.name}"]
    )
    removed = build.prune_cache()
    assert sorted(removed.stale) == sorted(usage.stale) and removed.stale_bytes >= 16384
    assert not old_agent.exists() and not older.exists() and not crashed.exists()
    assert mine.exists() and building.exists() and current_dir.exists()
    assert build.built() == artifacts
    assert build.cache_usage().stale == []
