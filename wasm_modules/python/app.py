"""Guest side of the python-wasm tier: runs one snippet (and its tests) per fresh instance.

componentize-py snapshots this module after it is imported at build time, so everything
imported here is what a snippet can import; nothing else exists at run time (there is no
standard library on a file system inside the sandbox). The host sends one JSON request to
``run`` and gets one JSON response back; the snippet's own output goes to WASI stdout/stderr,
which the host captures through bounded pipes.
"""

import ast
import base64
import builtins
import contextlib
import gc
import importlib
import io
import itertools
import json
import linecache
import marshal
import math
import pkgutil
import select
import sys
import time
import traceback
import unittest

import wit_world

# --- Blocking host calls -------------------------------------------------------------------
# A sleep or a select is a host call, and the host's epoch deadline cannot interrupt a host
# call. Cap every timeout at the time left before the run's deadline (plus a margin), so the
# guest wakes up just after the deadline and the epoch check stops it at its next instruction.
# These patches are applied before the rest of the standard library is imported, so modules
# that bind ``select.poll``/``select.select`` at import time (selectors, asyncio) get them.

_DEADLINE_MARGIN = 0.05
_deadline = math.inf
_real_sleep = time.sleep
_real_select = select.select
_real_poll = select.poll


def _cap(seconds):
    """(timeout to use, whether it was cut short by the run's deadline)."""
    left = _deadline - time.monotonic()
    if seconds is None or seconds > left:
        return max(left, 0.0) + _DEADLINE_MARGIN, True
    return seconds, False


def _past_deadline():
    """The run is over: wait in short host calls until the host's epoch deadline stops it.

    Returning to the snippet instead would let it run on past its deadline whenever the
    epoch ticker lags behind the wall clock (a loaded host)."""
    while True:
        _real_sleep(0.01)


def _seconds(value):
    """``value`` as a float when it is a usable positive timeout, else None (let CPython judge)."""
    try:
        number = float(value)  # Decimal, Fraction, numpy-like: anything the real call accepts
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def _sleep(seconds):
    number = _seconds(seconds)
    if number is None:
        return _real_sleep(seconds)
    timeout, capped = _cap(number)
    _real_sleep(timeout)
    if capped:
        _past_deadline()


def _select(rlist, wlist, xlist, timeout=None):
    number = None if timeout is None else _seconds(timeout)
    if timeout is not None and number is None:
        return _real_select(rlist, wlist, xlist, timeout)
    limit, capped = _cap(number)
    ready = _real_select(rlist, wlist, xlist, limit)
    if capped and not any(ready):
        _past_deadline()
    return ready


class _Poll:
    """select.poll with its timeout (milliseconds) capped at the run's deadline."""

    def __init__(self):
        self._poll = _real_poll()

    def register(self, fd, eventmask=select.POLLIN | select.POLLPRI | select.POLLOUT):
        return self._poll.register(fd, eventmask)

    def modify(self, fd, eventmask):
        return self._poll.modify(fd, eventmask)

    def unregister(self, fd):
        return self._poll.unregister(fd)

    def poll(self, timeout=None):
        if timeout is None:
            number = None
        else:
            try:
                value = float(timeout)
            except (TypeError, ValueError):
                return self._poll.poll(timeout)  # let the real call raise
            if value == 0:
                return self._poll.poll(0)
            number = None if value < 0 else value / 1000  # negative: wait forever
        limit, capped = _cap(number)
        events = self._poll.poll(math.ceil(limit * 1000))
        if capped and not events:
            _past_deadline()
        return events


time.sleep = _sleep
select.select = _select
select.poll = _Poll  # type: ignore[misc,assignment]

# --- Output streams --------------------------------------------------------------------------
# This CPython's sys.stdout wraps an unbuffered FileIO, and a WASI write takes at most 64 KiB:
# the rest of a longer print was silently dropped. A BufferedWriter retries short writes.
# Line buffering keeps what a run printed before it hit its fuel or deadline (a trap never
# reaches the harness's final flush).


def _stream(fd, errors):
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(
        io.BufferedWriter(raw), encoding="utf-8", errors=errors, line_buffering=True
    )


_STDOUT = sys.stdout = sys.__stdout__ = _stream(1, "strict")  # type: ignore[misc]
_STDERR = sys.stderr = sys.__stderr__ = _stream(2, "backslashreplace")  # type: ignore[misc]

# --- The bundled standard library ----------------------------------------------------------
# Every standard library module this CPython build can import, with all submodules, except the
# ones that make no sense without a terminal, a GUI, processes or a network. Importing them all
# (not a hand-picked list) matters: the standard library imports helpers lazily at run time
# (datetime.strptime -> _strptime, ast.unparse -> _ast_unparse, big int -> _pylong), and a
# lazy import of a module that was not snapshotted fails.

_EXCLUDED = frozenset(
    (
        *("__hello__", "__phello__", "_pyrepl", "antigravity", "curses", "ensurepip", "idlelib"),
        *("lib2to3", "msvcrt", "nt", "pydoc", "pydoc_data", "readline", "test", "this"),
        *("tkinter", "turtle", "turtledemo", "venv", "webbrowser", "winreg", "winsound"),
        *("_tkinter", "_winapi", "_overlapped", "_msi", "_wmi", "_android_support"),
        *("_apple_support", "_ios_support", "_osx_support", "_aix_support"),
    )
)
_EXCLUDED_PARTS = frozenset(("test", "tests", "idle_test", "__main__"))


def _import_all():
    for name in sorted(sys.stdlib_module_names - _EXCLUDED):
        try:
            module = importlib.import_module(name)
        except Exception:
            continue
        path = getattr(module, "__path__", None)
        if not path:
            continue
        for info in pkgutil.walk_packages(path, name + ".", onerror=lambda _: None):
            if _EXCLUDED_PARTS.intersection(info.name.split(".")):
                continue
            with contextlib.suppress(Exception):
                importlib.import_module(info.name)


_import_all()

# What a snippet may import: everything loaded now (the snapshot), and nothing else.
AVAILABLE = frozenset(sys.modules)


def _probing():
    """True when the lookup comes from importlib.util.find_spec, not from an import."""
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return False
        if (
            frame.f_code.co_name == "find_spec"
            and frame.f_globals.get("__name__") == "importlib.util"
        ):
            return True
        frame = frame.f_back
    return False


class _Unavailable:
    """Last meta-path finder: a module that is not bundled gets a message naming the way out."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if _probing():
            return None  # importlib.util.find_spec("x") is None is how code tests for a module
        top = name.partition(".")[0]
        if top in sys.stdlib_module_names:
            what = f"the standard library module {name!r} is not bundled in the python-wasm tier"
        else:
            what = f"{name!r} is not installed in the python-wasm tier (standard library only)"
        error = ModuleNotFoundError(
            f"No module named {name!r}: {what}; run code that needs it in the container tier "
            "(tier=docker); `hybrid py modules` lists what is bundled",
            name=name,
        )
        raise error

    @staticmethod
    def invalidate_caches():
        pass


sys.meta_path.append(_Unavailable)

# --- Running a snippet ---------------------------------------------------------------------

_MAX_FRAMES = 30
_NAME_CHARS = 200


class _Exit(Exception):
    """The snippet called sys.exit(); carries the status."""

    def __init__(self, code):
        super().__init__(code)
        self.code = code


def _exit_status(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def _describe(exc):
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _user_traceback(exc, files, where=None):
    """The traceback of ``exc`` with the harness frames removed (only the user's files).

    ``where`` (filename, line) names the test line when the error was raised by the harness
    itself (a failed assert), which leaves no user frame of its own.
    """
    # Lines are looked up after the harness's frames are dropped: reading them for every frame
    # opened the harness's and the standard library's files on each failing run.
    te = traceback.TracebackException(
        type(exc), exc, exc.__traceback__, limit=None, lookup_lines=False
    )
    _keep_user_frames(te, files)
    if where is not None and not te.stack:
        te.stack = traceback.StackSummary.from_list(
            [traceback.FrameSummary(where[0], where[1], "<module>")]
        )
    lines = list(te.format())
    return "".join(lines)


def _keep_user_frames(te, files):
    frames = [f for f in te.stack if f.filename in files]
    for frame in frames:
        if frame.name == "<lambda>" and (frame.filename, frame.lineno) in _assert_lines:
            frame.name = "<module>"  # the thunk the harness made of a top-level assert
    if len(frames) > _MAX_FRAMES:
        frames = frames[:5] + frames[-(_MAX_FRAMES - 5) :]
    te.stack = traceback.StackSummary.from_list(frames)
    for chained in (te.__cause__, te.__context__):
        if chained is not None:
            _keep_user_frames(chained, files)


def _register(filename, source):
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)


_COMPARISONS = (
    (ast.Eq, "==", lambda a, b: a == b),
    (ast.NotEq, "!=", lambda a, b: a != b),
    (ast.Lt, "<", lambda a, b: a < b),
    (ast.LtE, "<=", lambda a, b: a <= b),
    (ast.Gt, ">", lambda a, b: a > b),
    (ast.GtE, ">=", lambda a, b: a >= b),
    (ast.Is, "is", lambda a, b: a is b),
    (ast.IsNot, "is not", lambda a, b: a is not b),
    (ast.In, "in", lambda a, b: a in b),
    (ast.NotIn, "not in", lambda a, b: a not in b),
)
_OP_INDEX = {op: i for i, (op, _, _) in enumerate(_COMPARISONS)}
_marks = None  # [(phase, ns)] when the request asks for a profile (the benchmark does)


def _mark(phase):
    if _marks is not None:
        _marks.append((phase, time.perf_counter_ns()))


_HOOK = "__hybrid_tests__"
# (filename, line) of the top-level asserts of the current run
_assert_lines: set[tuple[str, int]] = set()
_ERROR = "__hybrid_error__"


def _short_repr(value):
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _stmt_name(node, source_lines):
    """A test's name: its source text on one line, shortened."""
    # Slicing the lines ourselves: ast.get_source_segment costs ~0.5 ms per call in the guest.
    lines = source_lines[node.lineno - 1 : node.end_lineno]
    if lines:
        lines[-1] = lines[-1][: node.end_col_offset]
        lines[0] = lines[0][node.col_offset :]
    segment = " ".join(" ".join(lines).split())
    return segment if len(segment) <= _NAME_CHARS else segment[: _NAME_CHARS - 3] + "..."


def _is_test_function(node):
    return isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")


def _case_name(test):
    return f"{type(test).__name__}.{test._testMethodName}"


def _test_items(tree, source):
    source_lines = source.splitlines()
    for node in tree.body:
        if isinstance(node, ast.Assert):
            yield _stmt_name(node, source_lines)
        elif _is_test_function(node):
            yield node.name


def _loc(node, where):
    """Give a new node ``where``'s location (cheaper than ast.fix_missing_locations' walk)."""
    node.lineno = where.lineno
    node.col_offset = where.col_offset
    node.end_lineno = where.end_lineno
    node.end_col_offset = where.end_col_offset
    return node


def _thunk(expr):
    """``lambda: expr`` at the expression's own source location (tracebacks point at it)."""
    node = ast.Lambda(
        args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=expr,
    )
    return _loc(node, expr)


def _const(value, where):
    return _loc(ast.Constant(value), where)


def _name(identifier, where):
    return _loc(ast.Name(id=identifier, ctx=ast.Load()), where)


def _hook_call(method, args, where):
    func = _loc(ast.Attribute(value=_name(_HOOK, where), attr=method, ctx=ast.Load()), where)
    call = _loc(ast.Call(func=func, args=args, keywords=[]), where)
    return _loc(ast.Expr(value=call), where)


class _ExpectAsserts(ast.NodeTransformer):
    """Inside a test function, ``assert a OP b[, msg]`` becomes ``expect(OP, a, b, msg)``: the
    failure then shows both values (a plain assert keeps only its message). Both sides are
    evaluated once, left to right, as the comparison itself would; the message only on failure.
    Nested functions, lambdas and classes keep their asserts (they may run after the tests)."""

    def visit_body(self, func):
        func.body = [self.visit(stmt) for stmt in func.body]
        return func

    def visit_FunctionDef(self, node):
        return node

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_ClassDef = visit_FunctionDef
    visit_Lambda = visit_FunctionDef

    def visit_Assert(self, node):
        test = node.test
        if not (
            isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _OP_INDEX
        ):
            return node
        message = _thunk(node.msg) if node.msg is not None else _const(None, node)
        args = [_const(_OP_INDEX[type(test.ops[0])], node), test.left, test.comparators[0], message]
        return _hook_call("expect", args, node)


class _Tests:
    """Runs a test file as ONE compiled module: each top-level assert becomes a recorded check,
    every other statement runs guarded (a failing setup line is recorded, the rest still run),
    then each ``test*`` function is called. One compile keeps the run cheap."""

    def __init__(self, run, source, filename):
        self.run = run
        self.source = source
        self.filename = filename
        self.source_lines = source.splitlines()
        self.classes = []
        self.names = []
        self.texts = []
        self.lines = []
        self.functions = []
        self.items = []  # every test's name in file order (asserts and test functions)

    def compile(self):
        """The test file as one code object (SyntaxError as compile() raises it)."""
        tree = ast.parse(self.source, self.filename)
        _mark("parse tests")
        tree, self.functions = self.transform(tree)
        _mark("transform tests")
        code = compile(tree, self.filename, "exec")
        _mark("compile tests")
        return code

    def state(self, code):
        """Everything a later run needs instead of parsing and compiling again (marshal-able)."""
        lines = sorted(n for f, n in _assert_lines if f == self.filename)
        fields = (self.functions, self.classes, self.names, self.texts, self.lines, self.items)
        return (code, *fields, lines)

    @classmethod
    def restore(cls, run, source, filename, state):
        tests = cls(run, source, filename)
        code, tests.functions, tests.classes, tests.names, tests.texts, tests.lines = state[:6]
        tests.items, lines = state[6:]
        _assert_lines.update((filename, n) for n in lines)
        return tests, code

    def transform(self, tree):
        functions = []
        body = []
        for node in tree.body:
            if isinstance(node, ast.Assert):
                body.append(self._assert(node))
                self.items.append(self.names[-1])
            elif _is_test_function(node):
                body.append(_ExpectAsserts().visit_body(node))
                functions.append(node.name)
                self.items.append(node.name)
            else:
                if isinstance(node, ast.ClassDef):
                    self.classes.append(node.name)
                args = [_const(node.lineno, node), _name(_ERROR, node)]
                handler = ast.ExceptHandler(
                    type=_name("BaseException", node),
                    name=_ERROR,
                    body=[_hook_call("setup_failed", args, node)],
                )
                guarded = ast.Try(
                    body=[node], handlers=[_loc(handler, node)], orelse=[], finalbody=[]
                )
                body.append(_loc(guarded, node))
        tree.body = body
        return tree, functions

    def _assert(self, node):
        index = len(self.names)
        self.names.append(_stmt_name(node, self.source_lines))
        self.lines.append(node.lineno)
        _assert_lines.update((self.filename, n) for n in range(node.lineno, node.end_lineno + 1))
        test = node.test
        message = _thunk(node.msg) if node.msg is not None else _const(None, node)
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _OP_INDEX:
            self.texts.append("")
            args = [
                _const(index, node),
                _const(_OP_INDEX[type(test.ops[0])], node),
                _thunk(test.left),
                _thunk(test.comparators[0]),
                message,
            ]
        else:
            self.texts.append("assert " + ast.unparse(test))
            args = [
                _const(index, node),
                _const(-1, node),
                _thunk(test),
                _const(None, node),
                message,
            ]
        return _hook_call("check", args, node)

    def check(self, index, op, left, right, message):
        name = self.names[index]
        try:
            if op < 0:
                passed, text = left(), self.texts[index]
            else:
                _, symbol, compare = _COMPARISONS[op]
                a, b = left(), right()
                passed = compare(a, b)
                text = f"assert {_short_repr(a)} {symbol} {_short_repr(b)}"
            if not passed:
                if message is not None:
                    text = f"{message()}\n{text}"
                raise AssertionError(text)
        except BaseException as exc:  # every failure is a test outcome
            self.run.record(name, exc, (self.filename, self.lines[index]))
            return
        self.run.record(name, None)

    def expect(self, op, a, b, message):
        """An assert inside a test function: raise with both sides of the failed comparison."""
        _, symbol, compare = _COMPARISONS[op]
        if not compare(a, b):
            text = f"assert {_short_repr(a)} {symbol} {_short_repr(b)}"
            if message is not None:
                text = f"{message()}\n{text}"
            raise AssertionError(text)

    def setup_failed(self, lineno, exc):
        self.run.record(f"{self.filename}:{lineno}", exc)

    def run_case(self, cls):
        """Run a unittest.TestCase class: one outcome per test method."""
        run = self.run

        class Result(unittest.TestResult):
            def addSuccess(self, test):
                run.record(_case_name(test), None)

            def addError(self, test, err):
                run.record(_case_name(test), err[1])

            def addFailure(self, test, err):
                run.record(_case_name(test), err[1])

            def addSkip(self, test, reason):
                run.outcomes.append(
                    {"name": _case_name(test), "passed": True, "message": f"skipped: {reason}"}
                )

            def addExpectedFailure(self, test, err):
                run.record(_case_name(test), None)

            def addUnexpectedSuccess(self, test):
                run.record(_case_name(test), AssertionError("unexpected success"))

        unittest.defaultTestLoader.loadTestsFromTestCase(cls).run(Result())

    def call(self, name, func):
        try:
            result = func()
            if hasattr(result, "close") and hasattr(result, "__await__"):
                result.close()
                raise TypeError(
                    "async test functions need an event loop, which the python-wasm tier "
                    "does not have (no sockets); use the container tier"
                )
        except BaseException as exc:
            self.run.record(name, exc)
            return
        self.run.record(name, None)


class _Run:
    def __init__(self, request):
        self.source = request["source"]
        self.filename = request.get("filename") or "snippet.py"
        self.tests = request.get("tests")
        self.tests_filename = request.get("tests_filename") or "tests.py"
        state = request.get("tests_state")
        # The host caches what a compile-only run (no snippet) returned for these tests.
        self.tests_state = marshal.loads(base64.b64decode(state)) if state else None
        self.files = {self.filename, self.tests_filename}
        self.outcomes = []
        self.exit_code = 0
        self.error = None
        self.traceback = None
        self.memory_error = False

    def fail(self, exc, where=None):
        """Record an uncaught error as the run's error (the first one wins the traceback);
        return its description."""
        if isinstance(exc, MemoryError):
            self.memory_error = True
        if self.traceback is not None:
            return _describe(exc)
        self.error = _describe(exc)
        self.traceback = _user_traceback(exc, self.files, where)
        return self.error

    def record(self, name, exc, where=None):
        if exc is None:
            self.outcomes.append({"name": name, "passed": True, "message": ""})
            return
        if isinstance(exc, SystemExit):
            message = f"SystemExit: {exc.code}"
        else:
            message = self.fail(exc, where)
        self.outcomes.append({"name": name, "passed": False, "message": message})

    def execute(self):
        namespace = {"__name__": "__main__", "__builtins__": builtins, "__file__": self.filename}
        _register(self.filename, self.source)
        try:
            _mark("start")
            code = compile(self.source, self.filename, "exec")
            _mark("compile snippet")
            exec(code, namespace)
            _mark("exec snippet")
        except SystemExit as exc:
            self.exit_code = _exit_status(exc.code)
            self._skip_tests(f"not run: the snippet exited with status {self.exit_code}")
            if self.outcomes:
                self.exit_code = self.exit_code or 1  # tests that never ran did not pass
            return
        except BaseException as exc:  # the snippet's own errors are the evidence
            self.fail(exc)
            self.exit_code = 1
            self._skip_tests(f"not run: the snippet raised {self.error}")
            return
        if self.tests is not None:
            self._run_tests(namespace)
        if any(not o["passed"] for o in self.outcomes):
            self.exit_code = 1

    def _skip_tests(self, message):
        if not self.tests:
            return
        if self.tests_state is not None:
            items = _Tests.restore(self, self.tests, self.tests_filename, self.tests_state)[0].items
        else:
            try:
                items = list(_test_items(ast.parse(self.tests, self.tests_filename), self.tests))
            except (SyntaxError, ValueError):
                return
        for name in items:
            self.outcomes.append({"name": name, "passed": False, "message": message})

    def _compiled_tests(self):
        """(_Tests, code) from the request's cached state or compiled now; None after recording
        why the test file does not compile."""
        if self.tests_state is not None:
            return _Tests.restore(self, self.tests, self.tests_filename, self.tests_state)
        tests = _Tests(self, self.tests, self.tests_filename)
        try:
            return tests, tests.compile()
        except (SyntaxError, ValueError) as exc:  # also 'return' outside a function, NUL bytes
            self.record(self.tests_filename, exc)
            return None

    def _run_tests(self, namespace):
        _register(self.tests_filename, self.tests)
        compiled = self._compiled_tests()
        if compiled is None:
            return
        tests, code = compiled
        namespace[_HOOK] = tests
        try:
            exec(code, namespace)
            _mark("run tests")
            for name in tests.functions:
                func = namespace.get(name)
                if callable(func):
                    tests.call(name, func)
            for name in tests.classes:
                cls = namespace.get(name)
                if isinstance(cls, type) and issubclass(cls, unittest.TestCase):
                    tests.run_case(cls)
        finally:
            namespace.pop(_HOOK, None)
            namespace.pop(_ERROR, None)


def _tests_state(request):
    """A compile-only request: the test file's compiled state, for the host to cache.

    It runs in an instance of its own where no snippet runs, so nothing a snippet does can
    reach what later runs with the same tests will execute."""
    tests = _Tests(None, request["tests"], request.get("tests_filename") or "tests.py")
    try:
        code = tests.compile()
    except (SyntaxError, ValueError):
        return {"tests_state": None}
    return {"tests_state": base64.b64encode(marshal.dumps(tests.state(code))).decode()}


def _flush():
    broken = False
    for stream in (sys.stdout, sys.stderr, _STDOUT, _STDERR):
        try:
            stream.flush()
        except BaseException:  # a closed pipe (output cap) must not lose the result
            broken = True
    return broken


def _modules():
    names = sorted(name for name in AVAILABLE if not name.startswith("_") and "._" not in name)
    return {"modules": [n for n in names if n not in ("app", "wit_world", "site")]}


def _handle(request):
    global _deadline, _marks
    _marks = [] if request.get("profile") else None
    if request.get("op") == "modules":
        return _modules()
    _deadline = time.monotonic() + float(request.get("wall_seconds") or math.inf)
    _assert_lines.clear()
    if request.get("op") == "compile_tests":
        return _tests_state(request)
    run = _Run(request)
    try:
        run.execute()
    except MemoryError as exc:
        run.fail(exc)
        run.exit_code = 1
    except BaseException as exc:  # a harness bug must still produce a response
        run.exit_code = 1
        run.error = f"internal error in the python-wasm harness: {_describe(exc)}"
        run.traceback = "".join(traceback.format_exception(exc))
    broken = _flush()
    _mark("flush")
    profile = None
    if _marks:
        profile = {b[0]: (b[1] - a[1]) / 1e6 for a, b in itertools.pairwise(_marks)}
    return {
        "profile": profile,
        "exit_code": run.exit_code,
        "error": run.error,
        "traceback": run.traceback,
        "tests": run.outcomes,
        "memory_error": run.memory_error,
        "output_broken": broken,
    }


class WitWorld(wit_world.WitWorld):
    def run(self, request: str) -> str:
        if request == "noop":  # the floor of one call, for the benchmark
            return "{}"
        return json.dumps(_handle(json.loads(request)))


# --- Warm-up -------------------------------------------------------------------------------
# Run representative requests once at build time, so the snapshot every instance starts from
# already has the interpreter's specialised bytecode and lazily built caches (the parser, codec
# lookups, csv, json, traceback formatting) of the harness paths: the shipping case went from
# 5.1 to 4.3 ms per run (4.5M to 4.2M fuel).
# Nothing of it is visible to a snippet: the namespace and the line cache are dropped after.

_WARM_SNIPPET = """
import csv, io, json, re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal

CARD = "weight,zone,cost_usd\\n5.0,zone_3,12.50\\n"

def calculate_shipping(weight_kg, zone):
    for row in csv.DictReader(io.StringIO(CARD)):
        if float(row["weight"]) == weight_kg and row["zone"] == zone:
            return float(row["cost_usd"])
    raise KeyError(zone)

json.loads(json.dumps({"a": [1, 2.5, None]}))
re.sub(r"\\s+", " ", "a  b")
date(2024, 1, 1) + timedelta(days=1)
datetime.strptime("2024-01-02", "%Y-%m-%d")
Decimal("1.10") + Decimal("2.20")
"""
_WARM_TESTS = """
assert calculate_shipping(5.0, "zone_3") == 12.50
assert calculate_shipping(2.0, "zone_1") == 8.00, "no rate"
assert isinstance(calculate_shipping(5.0, "zone_3"), float)
def test_one():
    assert calculate_shipping(5.0, "zone_3") > 1
"""


def _warm_up():
    state = _handle({"op": "compile_tests", "tests": _WARM_TESTS})["tests_state"]
    run = {"op": "run", "source": _WARM_SNIPPET, "tests": _WARM_TESTS, "wall_seconds": 60}
    for _ in range(3):
        _handle(run)
        _handle({**run, "tests_state": state})  # the path of a run with cached tests
        _handle({"op": "run", "source": "print('x', end='')[0]", "wall_seconds": 60})
    _handle({"op": "modules"})
    linecache.clearcache()


class _Null(io.TextIOBase):
    def write(self, text):
        return len(text)


_saved_streams = sys.stdout, sys.stderr
sys.stdout = sys.stderr = _Null()
try:
    _warm_up()
finally:
    sys.stdout, sys.stderr = _saved_streams
    _deadline = math.inf

# Plug the allocator's free holes, then freeze. This CPython allocates objects with wasi-libc's
# dlmalloc (no pymalloc), and the build left megabytes of free chunks scattered over the whole
# snapshot heap. A run's allocations landed in them, so every run copied-on-write pages all over
# the 33 MB image: ~600 page faults, about 1.5 ms of the shipping case. With the holes held by
# filler objects (the smallest chunk each, ~4 MB in all), a run's objects come from the top of
# the heap instead, and the shipping case writes ~280 pages (4.0 ms per run instead of 5.2).


def _plug_heap_holes():
    top = max(map(id, gc.get_objects()))  # id() is the address: the highest object so far
    fillers = []
    while True:
        chunk = [object() for _ in range(4096)]
        fillers.append(chunk)
        if min(map(id, chunk)) > top:  # every new chunk comes from the top: no hole is left
            return fillers


gc.collect()
_FILLERS = _plug_heap_holes()
# Move everything built so far into the collector's permanent generation: a collection during a
# run then never walks (and page-faults in) the whole snapshot heap, only the run's own objects.
gc.freeze()
