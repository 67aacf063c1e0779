"""Release dates from the configured package index (real index, through pip's own session):
the bound that resolves a package as of a date."""

from __future__ import annotations

from datetime import UTC, datetime

from packaging.version import Version

from hybrid.deps import released

DAY = datetime(2021, 5, 20, tzinfo=UTC)


def test_a_bound_keeps_what_was_published_by_the_date() -> None:
    assert released.bound("pytest", DAY) == "<=6.2.4"
    assert released.too_new({"pytest": "6.2.4", "iniconfig": "2.0.0"}, DAY) == ["iniconfig"]
    times = released.published(["pytest"])["pytest"]
    assert times[Version("6.2.4")] < DAY < times[Version("6.2.5")]


def test_a_bound_never_names_a_pre_release() -> None:
    # pluggy 1.0.0.dev0 was out by then; naming it in a specifier would let pip choose it.
    assert released.bound("pluggy", DAY) == "<=0.13.1"


def test_a_package_published_later_has_no_bound() -> None:
    # Nothing of it existed then: what needs it is what was too new.
    assert released.bound("ruff", datetime(2020, 1, 1, tzinfo=UTC)) is None
