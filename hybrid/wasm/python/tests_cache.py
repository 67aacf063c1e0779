"""Compiled test files, shared by the runs of one process."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import wasmtime

from hybrid.policy import Budget
from hybrid.wasm.python import instances


class TestsCache:
    """Compiled test files, so the runs of an agent's loop (new snippet, same tests) skip
    parsing, transforming and compiling them (~0.4 ms of each run).

    Each entry comes from a compile-only request in an instance of its own, made after the
    run that first saw the tests: a snippet never runs where an entry is made, so it cannot
    forge what later runs execute.
    """

    __test__ = False  # not a pytest class

    SIZE = 64

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[str, str], tuple[Any, str]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, compiled: Any, tests: str, filename: str) -> str | None:
        """The compiled state of ``tests`` for this component, if cached."""
        with self._lock:
            entry = self._entries.get((filename, tests))
            if entry is None or entry[0] is not compiled:
                return None
            self._entries.move_to_end((filename, tests))
            return entry[1]

    def fill(self, compiled: Any, tests: str, filename: str, budget: Budget) -> None:
        """Compile ``tests`` in an instance of their own (under ``budget``) and keep the state."""
        if self.get(compiled, tests, filename) is not None:
            return
        try:
            state = instances.call(
                compiled,
                {"op": "compile_tests", "tests": tests, "tests_filename": filename},
                budget,
            )
        except (wasmtime.WasmtimeError, wasmtime.Trap, ValueError):
            return  # runs with these tests keep compiling them
        if not isinstance(state.get("tests_state"), str):
            return  # the tests do not compile: each run reports why
        with self._lock:
            self._entries[(filename, tests)] = (compiled, state["tests_state"])
            while len(self._entries) > self.SIZE:
                self._entries.popitem(last=False)


TESTS = TestsCache()
"""The process's compiled test files."""
