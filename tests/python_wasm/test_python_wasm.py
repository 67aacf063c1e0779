"""The python-wasm tier, for real: CPython 3.14 in wasmtime, a fresh instance per run.

The first test in a session builds the guest with componentize-py and compiles it (~30 s).
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from hybrid.errors import InvalidInput, PolicyViolation
from hybrid.policy import SandboxSpec
from hybrid.results import Termination
from hybrid.wasm.python import DEFAULT_SPEC, available_modules, component, run_python

SHIPPING = Path(__file__).parent / "shipping"
DOCS = Path(__file__).parents[2] / "docs" / "python-stdlib.md"


def spec(**budget: object) -> SandboxSpec:
    values = DEFAULT_SPEC.budget.model_dump()
    values.update(budget)
    return SandboxSpec(tier="python-wasm", budget=values)


@pytest.fixture(scope="module", autouse=True)
def guest() -> None:
    component()  # build + compile once, outside any single test's timing


def shipping(attempt: str):
    return run_python(
        (SHIPPING / attempt).read_text(),
        (SHIPPING / "tests.py").read_text(),
        files=[SHIPPING / "rate_card.csv"],
    )


# --- the case that must work end to end ----------------------------------------------------


def test_shipping_first_attempt_fails_with_the_keyerror_evidence() -> None:
    result = shipping("attempt1.py")
    assert result.tier == "python-wasm"
    assert not result.ok
    assert result.termination is Termination.NONZERO_EXIT
    assert result.exit_code == 1
    assert [t.passed for t in result.tests] == [False, False]
    assert all(t.message == "KeyError: 'weight_kg'" for t in result.tests)
    assert result.tests[0].name == 'assert calculate_shipping(5.0, "zone_3") == 12.50'
    assert "KeyError: 'weight_kg'" in result.detail
    # The traceback shows the user's files only, down to the faulty line.
    assert result.traceback is not None
    assert 'File "snippet.py", line 7, in calculate_shipping' in result.traceback
    assert 'row["weight_kg"]' in result.traceback
    assert "app.py" not in result.traceback
    assert result.usage.fuel_used and result.usage.wall_ms > 0


def test_shipping_corrected_attempt_passes_both_tests() -> None:
    result = shipping("attempt2.py")
    assert result.ok, result
    assert result.termination is Termination.OK and result.exit_code == 0
    assert [t.passed for t in result.tests] == [True, True]
    assert result.traceback is None


# --- tests and evidence -----------------------------------------------------------------------


def test_an_assert_inside_a_test_function_shows_both_sides() -> None:
    # A plain assert in a function loses its values ("AssertionError: msg"); the model fixing
    # the code needs what was compared.
    tests = "\n".join(
        [
            "def test_values():",
            "    expected = 5",
            "    for x in [2]:",
            '        assert double(x) == expected, "doubling"',
            "def test_membership():",
            "    assert double(1) in [3, 4]",
            "def test_nested_helper_keeps_its_assert():",
            "    def check(v):",
            "        assert v == 2",
            "    check(double(1))",
            "def test_truthiness():",
            "    assert double(0)",
        ]
    )
    result = run_python("def double(x):\n    return x * 2\n", tests)
    outcomes = {t.name: t for t in result.tests}
    assert outcomes["test_values"].message == "AssertionError: doubling\nassert 4 == 5"
    assert outcomes["test_membership"].message == "AssertionError: assert 2 in [3, 4]"
    assert outcomes["test_nested_helper_keeps_its_assert"].passed
    assert outcomes["test_truthiness"].message == "AssertionError"
    assert result.traceback is not None
    assert 'File "tests.py", line 4, in test_values' in result.traceback
    assert "app.py" not in result.traceback


def test_assert_lines_and_test_functions_each_get_an_outcome() -> None:
    tests = "\n".join(
        [
            'assert double(2) == 5, "doubling"',
            "value = double(3)",
            "assert value",
            "undefined_helper()",
            "def test_ok():",
            "    assert double(1) == 2",
            "def test_raises():",
            "    raise ValueError('nope')",
            "assert [1, 2] == [1, 3]",
        ]
    )
    result = run_python("def double(x):\n    return x * 2\n", tests)
    outcomes = {t.name: t for t in result.tests}
    assert outcomes['assert double(2) == 5, "doubling"'].message == (
        "AssertionError: doubling\nassert 4 == 5"
    )
    assert outcomes["assert value"].passed
    assert outcomes["tests.py:4"].message == "NameError: name 'undefined_helper' is not defined"
    assert outcomes["assert [1, 2] == [1, 3]"].message == "AssertionError: assert [1, 2] == [1, 3]"
    assert outcomes["test_ok"].passed
    assert outcomes["test_raises"].message == "ValueError: nope"
    assert result.detail.startswith("4 of 6 tests failed")
    assert result.traceback is not None
    assert 'File "tests.py", line 1, in <module>' in result.traceback


def test_unittest_cases_get_one_outcome_per_method() -> None:
    tests = "\n".join(
        [
            "import unittest",
            "class TestDouble(unittest.TestCase):",
            "    def test_two(self):",
            "        self.assertEqual(double(2), 4)",
            "    def test_three(self):",
            "        self.assertEqual(double(3), 7)",
            "    @unittest.skip('later')",
            "    def test_later(self):",
            "        pass",
        ]
    )
    result = run_python("def double(x):\n    return x * 2\n", tests)
    outcomes = {t.name: t for t in result.tests}
    assert outcomes["TestDouble.test_two"].passed
    assert outcomes["TestDouble.test_later"].passed
    assert outcomes["TestDouble.test_later"].message == "skipped: later"
    assert not outcomes["TestDouble.test_three"].passed
    assert outcomes["TestDouble.test_three"].message == "AssertionError: 6 != 7"
    assert result.termination is Termination.NONZERO_EXIT


def test_a_snippet_that_raises_skips_its_tests_and_reports_the_error() -> None:
    result = run_python("x = 1 / 0", "assert True")
    assert result.termination is Termination.NONZERO_EXIT
    assert result.detail == "ZeroDivisionError: division by zero (tests not run)"
    assert result.tests[0].message.startswith("not run: the snippet raised ZeroDivisionError")
    assert result.traceback is not None and 'File "snippet.py", line 1' in result.traceback


DOUBLE = "def double(x):\n    return x * 2\n"
MIXED_TESTS = "\n".join(
    [
        'assert double(2) == 5, "doubling"',
        "undefined_helper()",
        "def test_ok():",
        "    assert double(1) == 2",
        "import unittest",
        "class TestDouble(unittest.TestCase):",
        "    def test_three(self):",
        "        self.assertEqual(double(3), 7)",
        "assert (double(1)\n        == 2)",
    ]
)


@pytest.mark.parametrize(
    ("source", "tests"),
    [
        (DOUBLE, MIXED_TESTS),
        ("x = 1 / 0", MIXED_TESTS),  # tests skipped: their names come from the cached state
        (DOUBLE, "assert double(2) ==\n"),  # a syntax error is never cached
        (DOUBLE, "return 1"),  # parses, but does not compile
    ],
    ids=["mixed", "snippet-raises", "syntax-error", "compile-error"],
)
def test_tests_compiled_once_give_the_same_outcomes(source: str, tests: str) -> None:
    # The first run compiles the tests; later runs with the same tests use the state a
    # compile-only instance cached. Nothing a user can see may differ.
    first, second, third = (run_python(source, tests) for _ in range(3))
    for later in (second, third):
        assert later.model_dump(exclude={"usage"}) == first.model_dump(exclude={"usage"})
    assert not first.ok


def test_a_snippet_cannot_forge_the_tests_later_runs_execute() -> None:
    tests = "assert double(2) == 5  # forge"
    # The first run with these tests swaps in an always-passing compiled state for its own
    # tests: it may lie about itself, but the state later runs use is compiled elsewhere.
    forge = (
        "import app, gc\n"
        "fake = app._Tests(None, 'assert True', 'tests.py')\n"
        "state = fake.state(fake.compile())\n"
        "for obj in gc.get_objects():\n"
        "    if type(obj).__name__ == '_Run':\n"
        "        obj.tests_state = state\n"
        "def double(x):\n    return 4\n"
    )
    assert run_python(forge, tests).ok
    for _ in range(2):
        honest = run_python(DOUBLE, tests)
        assert not honest.ok
        assert honest.tests[0].message == "AssertionError: assert 4 == 5"


def test_stdout_stderr_and_exit_status() -> None:
    result = run_python("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)
    assert result.termination is Termination.NONZERO_EXIT


def test_os_exit_ends_the_run_with_its_output() -> None:
    result = run_python("import os\nprint('before', flush=True)\nos._exit(3)")
    assert result.stdout == "before\n"
    assert result.termination is Termination.NONZERO_EXIT
    assert result.exit_code == 1  # WASI's exit carries success or failure only
    result = run_python("import os\nos._exit(0)")
    assert result.termination is Termination.OK and result.exit_code == 0
    result = run_python("import os\nos._exit(0)", "assert False")
    assert not result.ok and "before its tests ran" in result.detail


def test_syntax_error_is_reported_not_raised() -> None:
    result = run_python("def broken(:\n    pass")
    assert result.termination is Termination.NONZERO_EXIT
    # The exception line, which ends the error text (it starts with the file and the caret).
    assert result.detail.startswith("SyntaxError: "), result.detail


# --- containment ----------------------------------------------------------------------------


def test_infinite_loop_stops_on_fuel() -> None:
    code = "print('started')\nwhile True:\n    pass"
    result = run_python(code, spec=spec(fuel=300_000_000, wall_seconds=30))
    assert result.termination is Termination.OUT_OF_FUEL
    assert result.usage.fuel_used == 300_000_000
    assert result.stdout == "started\n"  # what it printed before the trap is kept


def test_infinite_loop_stops_on_the_deadline() -> None:
    start = time.monotonic()
    result = run_python("while True:\n    pass", spec=spec(fuel=10**13, wall_seconds=0.5))
    elapsed = time.monotonic() - start
    assert result.termination is Termination.TIMEOUT
    assert 0.45 < elapsed < 3.0


@pytest.mark.parametrize(
    "code",
    [
        "import time\ntime.sleep(60)",
        "import select\nselect.select([], [], [], 60)",
        "import select\np = select.poll()\np.poll(60_000)",
        "import select\np = select.poll()\np.poll(-1)",
        "import time\nfrom decimal import Decimal\ntime.sleep(Decimal(60))",
    ],
    ids=["time.sleep", "select.select", "select.poll", "poll-forever", "sleep-decimal"],
)
def test_sleeping_cannot_outlive_the_deadline(code: str) -> None:
    start = time.monotonic()
    result = run_python(code, spec=spec(wall_seconds=0.5))
    elapsed = time.monotonic() - start
    assert result.termination is Termination.TIMEOUT, result
    # 0.5 s deadline + 0.5 s backstop grace; the rest is slack for a loaded CI machine.
    assert elapsed < 4.0, (elapsed, result)


def test_a_host_call_that_bypasses_the_sleep_cap_still_returns_at_the_deadline() -> None:
    # The guest keeps the real sleep in its harness module; calling it directly blocks in a
    # host call that epochs cannot interrupt. The caller must still get its answer on time.
    start = time.monotonic()
    result = run_python("import app\napp._real_sleep(8)", spec=spec(wall_seconds=0.5))
    elapsed = time.monotonic() - start
    assert result.termination is Termination.TIMEOUT
    assert "host call" in result.detail
    assert elapsed < 3.0


def test_stdin_reads_cannot_block() -> None:
    result = run_python(
        "import sys\nprint(repr(sys.stdin.read()))\ninput()", spec=spec(wall_seconds=5)
    )
    assert result.stdout == "''\n"
    assert result.detail == "EOFError: EOF when reading a line"


def test_large_allocation_under_the_cap_is_memory_error() -> None:
    result = run_python("data = bytearray(300 * 1024 * 1024)", spec=spec(memory="128M"))
    assert result.termination is Termination.OUT_OF_MEMORY
    assert result.traceback is not None and "MemoryError" in result.traceback
    with pytest.raises(MemoryError):
        result.raise_for_termination()


def test_each_run_gets_its_own_memory_cap_whatever_ran_before() -> None:
    # Runs on a worker use an instance prepared after the previous run (under a 64 MiB cap):
    # the run's own cap must replace that one, in both directions.
    grow = "data = bytearray(100 * 1024 * 1024)\nprint(len(data) // 1024**2)"
    for _ in range(2):
        assert run_python(grow, spec=spec(memory="256M")).stdout == "100\n"
        assert run_python(grow, spec=spec(memory="96M")).termination is Termination.OUT_OF_MEMORY
    # A cap below the guest's own starting memory fails the run, not the caller.
    tiny = run_python("print(1)", spec=spec(memory="16M"))
    assert tiny.termination is Termination.OUT_OF_MEMORY, tiny
    assert run_python("print(1)").stdout == "1\n"


def test_host_files_are_not_readable() -> None:
    result = run_python("open('/etc/passwd').read()")
    assert result.termination is Termination.NONZERO_EXIT
    assert "FileNotFoundError" in result.detail
    result = run_python("open('../../../../etc/passwd').read()")
    assert "Error" in result.detail and result.exit_code == 1


def test_listing_the_root_shows_nothing_of_the_host() -> None:
    result = run_python("import os\nprint(sorted(os.listdir('/')), sorted(os.listdir('.')))")
    assert result.stdout == "[] []\n"
    result = run_python("import os\nprint(sorted(os.listdir('/')))", files={"a.txt": "x"})
    assert result.stdout == "['a.txt']\n"


def test_input_files_are_read_only() -> None:
    result = run_python(
        "print(open('data.txt').read())\nopen('data.txt', 'w').write('changed')",
        files={"data.txt": "original"},
    )
    assert result.stdout == "original\n"
    assert "PermissionError" in result.detail
    result = run_python("open('new.txt', 'w')", files={"data.txt": "original"})
    assert "PermissionError" in result.detail


def test_socket_connect_fails() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        for code in (
            f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))",
            f"import socket\nsocket.create_connection(('localhost', {port}), timeout=2)",
        ):
            result = run_python(code)
            assert result.termination is Termination.NONZERO_EXIT
            assert "connected" not in result.stdout
            assert "PermissionError" in result.detail or "gaierror" in result.detail
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing reached the host
    finally:
        server.close()


def test_no_state_leaks_between_runs() -> None:
    first = run_python(
        "import builtins, json, sys\nbuiltins.LEAK = 1\njson.LEAK = 2\nsys.path.append('/x')\n"
        "GLOBAL = 3\nprint('set')"
    )
    assert first.stdout == "set\n"
    second = run_python(
        "import builtins, json, sys\n"
        "print(hasattr(builtins, 'LEAK'), hasattr(json, 'LEAK'), '/x' in sys.path, 'GLOBAL' in globals())"
    )
    assert second.stdout == "False False False False\n"


def test_random_is_not_baked_into_the_snapshot() -> None:
    draws = {run_python("import random\nprint(random.random())").stdout for _ in range(3)}
    assert len(draws) == 3


@pytest.mark.parametrize(
    "code",
    [
        "def f():\n    return f()\nf()",
        "import json\njson.loads('[' * 200000)",
        "nested = []\nfor _ in range(300000):\n    nested = [nested]\nrepr(nested)",
    ],
    ids=["python-recursion", "json-nesting", "repr-nesting"],
)
def test_recursion_bombs_stop_cleanly(code: str) -> None:
    result = run_python(code)
    assert result.termination in (Termination.NONZERO_EXIT, Termination.TRAP)
    assert "Recursion" in result.detail or "call stack exhausted" in result.detail
    # The tier is fine afterwards.
    assert run_python("print(1)").stdout == "1\n"


def test_long_output_under_the_cap_arrives_whole() -> None:
    # A single WASI write takes at most 64 KiB; the rest of a long print must not be lost.
    code = "import sys\nprint('o' * 200_000)\nprint('e' * 100_000, file=sys.stderr)\nprint('end')"
    result = run_python(code)
    assert result.ok
    assert result.stdout == "o" * 200_000 + "\nend\n"
    assert result.stderr == "e" * 100_000 + "\n"


def test_huge_print_is_truncated_and_flagged() -> None:
    result = run_python("print('x' * 10_000_000)", spec=spec(output_bytes="64K"))
    assert result.termination is Termination.OUTPUT_LIMIT
    assert result.stdout_truncated and len(result.stdout) == 64 * 1024
    start = time.monotonic()
    result = run_python("while True:\n    print('y' * 1000)", spec=spec(output_bytes="64K"))
    assert result.termination is Termination.OUTPUT_LIMIT
    assert time.monotonic() - start < 5  # the closed pipe stops the flood at once


def test_traceback_is_bounded() -> None:
    code = "def f(n):\n    if n == 0:\n        raise ValueError('x' * 50000)\n    return f(n - 1)\nf(100)"
    result = run_python(code)
    assert result.traceback is not None and len(result.traceback) <= 8200
    assert "characters cut" in result.traceback


# --- the bundled standard library -----------------------------------------------------------


def test_the_stdlib_for_text_csv_json_date_math_tasks_is_there() -> None:
    code = """
import csv, json, re, dataclasses, typing, collections, itertools, functools, datetime
import decimal, fractions, statistics, math, heapq, bisect, string, textwrap, difflib
import unittest, enum, io, pathlib, sqlite3, zoneinfo, tomllib, uuid, hashlib
from datetime import datetime as dt
print(dt.strptime("2024-02-29", "%Y-%m-%d").date(), statistics.median([3, 1, 2]),
      decimal.Decimal("1.10") + decimal.Decimal("2.20"), fractions.Fraction(1, 3) * 3,
      json.dumps({"k": [1, 2]}), ast_ok := __import__("ast").unparse(__import__("ast").parse("x=1")),
      pathlib.PurePosixPath("a/b.csv").suffix, 10**5000 > 1, "é".encode("latin-1"))
"""
    result = run_python(code)
    assert result.ok, result
    assert result.stdout.startswith("2024-02-29 2 3.30 1 {\"k\": [1, 2]} x = 1 .csv True b'\\xe9'")


def test_a_missing_module_names_the_container_tier() -> None:
    result = run_python("import numpy")
    assert result.termination is Termination.NONZERO_EXIT
    assert "No module named 'numpy'" in result.detail
    assert "container tier" in result.detail
    assert "`hybrid py modules` lists what is bundled" in result.detail, result.detail


def test_probing_for_an_optional_module_still_works() -> None:
    code = "import importlib.util\nprint(importlib.util.find_spec('numpy'), bool(importlib.util.find_spec('csv')))"
    result = run_python(code)
    assert result.stdout == "None True\n", result


def test_documented_module_list_matches_the_guest() -> None:
    documented = set()
    for line in DOCS.read_text().splitlines():
        cells = line.split("|")
        if line.startswith("| ") and len(cells) == 4 and "`" in cells[2]:
            documented.update(name.strip("` ") for name in cells[2].split(","))
    documented.discard("")
    actual = {name.split(".")[0] for name in available_modules()}
    assert documented == actual, (
        f"docs/python-stdlib.md is out of date: missing {sorted(actual - documented)}, "
        f"extra {sorted(documented - actual)} (regenerate with `hybrid py modules`)"
    )


# --- policy and input validation ---------------------------------------------------------------


def test_policy_the_tier_cannot_honour_is_refused() -> None:
    egress = SandboxSpec(tier="python-wasm", network={"mode": "egress", "allow": ["example"]})
    with pytest.raises(PolicyViolation):
        run_python("pass", spec=egress)
    with pytest.raises(PolicyViolation):
        run_python("pass", spec=spec(memory="8G"))


def test_many_distinct_input_sets_each_read_their_own_files() -> None:
    for n in range(20):  # more sets than stay staged: old ones are evicted, never a live one
        result = run_python("print(open('n.txt').read())", files={"n.txt": f"set {n}"})
        assert result.stdout == f"set {n}\n"


def test_bad_input_files_are_refused() -> None:
    with pytest.raises(InvalidInput):
        run_python("pass", files={"../escape.txt": "x"})
    with pytest.raises(InvalidInput):
        run_python("pass", files=[Path("/definitely/not/here.csv")])


# --- parallel runs ------------------------------------------------------------------------------


def test_parallel_runs_share_one_component_and_stay_isolated() -> None:
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(5):
                r = run_python(
                    f"seen = globals().get('mine')\nmine = {n}\nprint(seen, {n} * 100 + {i})",
                    files={"n.txt": str(n)},
                )
                assert r.ok, r
                results[n * 100 + i] = r.stdout
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[0]
    assert len(results) == 40
    assert all(out == f"None {key}\n" for key, out in results.items())


def test_a_non_utf8_input_file_name_is_one_clear_error(tmp_path: Path) -> None:
    import os

    from hybrid.errors import InvalidInput

    path = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9.csv"))
    path.write_bytes(b"a\n1\n")
    with pytest.raises(InvalidInput, match="not UTF-8"):
        run_python("print(1)", files=[path])
    renamed = run_python("print(open('data.csv').read())", files={"data.csv": path})
    assert renamed.stdout == "a\n1\n\n", renamed
