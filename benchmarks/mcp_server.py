"""MCP round trips over stdio, side by side with the same library call in process.

A real `hybrid mcp` process spawned by the official SDK's client (as an agent client does);
each call is timed from the client's send to its parsed result. Rows: `run_python` with a
one-line snippet, `run_python` with tests, a call that fails fast (an isError result: the
protocol and tool-dispatch cost alone), and `run_python` in process for comparison.

    python benchmarks/mcp_server.py [--calls 200] [--mode auto|legacy]

Target (issue 13): MCP run_python round trip over stdio p50 <= 10 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hybrid.wasm.python import run_python  # noqa: E402

SNIPPET = {"source": "print(1)"}
WITH_TESTS = {
    "source": "def double(x):\n    return 2 * x\n",
    "tests": "assert double(2) == 4\n\ndef test_zero():\n    assert double(0) == 0\n",
}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def mcp_rows(calls: int, mode: str) -> list[tuple[str, list[float]]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "hybrid", "mcp", "--root", str(ROOT)], env=env
    )
    rows = []
    async with Client(server, mode=mode) as client:
        for name, tool, args in [
            ("mcp run_python print(1)", "run_python", SNIPPET),
            ("mcp run_python + 2 tests", "run_python", WITH_TESTS),
            ("mcp isError (unknown workstation)", "ws_diff", {"workstation": "none"}),
        ]:
            for _ in range(10):  # warm: the server's guest worker, the client's caches
                await client.call_tool(tool, args)
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                result = await client.call_tool(tool, args)
                times.append((time.perf_counter() - start) * 1000)
                assert result.is_error == (tool == "ws_diff"), result
            rows.append((name, times))
    return rows


def in_process(calls: int) -> list[tuple[str, list[float]]]:
    for _ in range(10):
        run_python(**SNIPPET)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        run_python(**SNIPPET)
        times.append((time.perf_counter() - start) * 1000)
    return [("in process run_python print(1)", times)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--mode", default="auto", help="auto (2026 protocol) or legacy")
    args = parser.parse_args()
    rows = anyio.run(mcp_rows, args.calls, args.mode) + in_process(args.calls)
    load = os.getloadavg()[0]
    print(f"{args.calls} calls each, protocol mode {args.mode}, load average {load:.1f}")
    print(f"{'':38} {'p50 ms':>8} {'p90 ms':>8} {'mean ms':>8}")
    for name, times in rows:
        print(
            f"{name:38} {pct(times, 0.5):8.2f} {pct(times, 0.9):8.2f} {statistics.mean(times):8.2f}"
        )


if __name__ == "__main__":
    main()
