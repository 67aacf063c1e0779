"""PythonPool: isolated runs spread over worker processes, results in submission order."""

from __future__ import annotations

from hybrid import PythonPool, Termination


def test_pool_runs_in_order_and_isolated() -> None:
    jobs = [
        {"source": "x = 41\nprint(x + 1)"},
        {"source": "print(globals().get('x', 'fresh'))"},
        {"source": "raise ValueError('boom')"},
        {
            "source": "def f(a):\n    return a * 2\n",
            "tests": "assert f(2) == 4\nassert f(3) == 7\n",
        },
        {"source": "while True:\n    pass\n", "spec": None},
    ]
    from hybrid import Budget, SandboxSpec

    jobs[4]["spec"] = SandboxSpec(tier="python-wasm", budget=Budget(fuel=50_000_000))
    with PythonPool(2) as pool:
        results = list(pool.map(jobs))
        future = pool.submit("print('submitted')")
        assert future.result(timeout=120).stdout == "submitted\n"
    assert results[0].stdout == "42\n" and results[0].ok
    assert results[1].stdout == "fresh\n"
    assert results[2].termination is Termination.NONZERO_EXIT and "ValueError: boom" in (
        results[2].traceback or ""
    )
    assert [t.passed for t in results[3].tests] == [True, False]
    assert results[4].termination is Termination.OUT_OF_FUEL
    assert all(r.tier == "python-wasm" for r in results)
