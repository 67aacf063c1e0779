"""Which Debian mirror an image of a suite comes from, read from apt sources as a machine has
them, and the tag each suite's image gets (no engine: the build itself is in
tests/workstation/test_image_suites.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.errors import EngineUnavailable, InvalidInput
from hybrid.workstation import images

DEB822 = """\
Types: deb
# a comment line, which the reader skips
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://security.example/debian-security
Suites: bookworm-security
Components: main
"""


@pytest.fixture
def sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An apt sources directory of a bookworm machine, in place of /etc/apt."""
    monkeypatch.setattr(images, "_SOURCES_DIRS", (tmp_path,))
    monkeypatch.setattr(images, "_codename", lambda: "bookworm")
    return tmp_path


def test_the_release_comes_from_its_own_source(sources: Path) -> None:
    (sources / "debian.sources").write_text(DEB822)
    assert images.find_mirror() == "http://mirror.example/debian"
    assert images.find_mirror("bookworm-security") == "http://security.example/debian-security"


def test_a_suite_no_source_names_comes_from_the_releases_mirror(sources: Path) -> None:
    (sources / "debian.sources").write_text(DEB822)
    assert images.find_mirror("trixie") == "http://mirror.example/debian"
    (sources / "debian.sources").unlink()
    (sources / "sources.list").write_text(
        "deb [signed-by=/k.gpg] http://old.example/debian/ bookworm main\n"
        "deb http://newer.example/debian forky main\n"
    )
    assert images.find_mirror("trixie") == "http://old.example/debian"
    assert images.find_mirror("forky") == "http://newer.example/debian"


def test_no_source_at_all_says_how_to_name_one(sources: Path) -> None:
    with pytest.raises(EngineUnavailable, match="--mirror"):
        images.find_mirror("trixie")


def test_each_suite_and_profile_has_its_own_tag(sources: Path) -> None:
    repository = images.BASE_IMAGE.rsplit(":", 1)[0]
    assert images.profile_tag("python") == images.BASE_IMAGE
    assert images.profile_tag("python", "bookworm") == images.BASE_IMAGE
    assert images.profile_tag("node") == f"{images.BASE_IMAGE}-node"
    assert images.profile_tag("python", "trixie") == f"{repository}:trixie"
    assert images.profile_tag("build", "forky") == f"{repository}:forky-build"
    with pytest.raises(InvalidInput, match="unknown profile"):
        images.profile_tag("ruby", "trixie")
