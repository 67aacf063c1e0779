"""The built-in registry: modules load once, a missing module says how to build it."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.checks import check_csv
from hybrid.errors import EngineUnavailable, InvalidInput
from hybrid.wasm import builtins


def test_each_module_loads_once() -> None:
    for name in builtins.NAMES:
        assert builtins.module(name) is builtins.module(name)


def test_unknown_check() -> None:
    with pytest.raises(InvalidInput, match="no built-in check"):
        builtins.module("yaml")


def test_missing_module_says_to_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(builtins, "MODULES_DIR", tmp_path)
    monkeypatch.setattr(builtins, "_loaded", {})
    with pytest.raises(EngineUnavailable, match=r"python wasm_modules/build\.py"):
        check_csv("a\n1\n")
    with pytest.raises(EngineUnavailable, match=r"manifest\.json is missing"):
        builtins.manifest()


def test_concurrent_checks_share_nothing() -> None:
    from concurrent.futures import ThreadPoolExecutor

    data = ["a,b\n" + f"{i},x\n" * (i + 1) for i in range(16)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        reports = list(pool.map(lambda d: check_csv(d, types={"a": "int"}), data))
    assert [r.rows for r in reports] == [i + 1 for i in range(16)]
    assert all(r.ok for r in reports)
