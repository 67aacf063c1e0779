"""python-wasm runs per second: fan-out on a local two-node Ray cluster vs PythonPool, same cores.

The cluster is hybrid.raylocal.LocalCluster: a head and a second node, each a real `ray start`
process with one CPU, on loopback addresses. PythonPool gets as many worker processes as the
cluster has CPUs. Both run the same snippets (each a fresh CPython-in-WASM instance) and the
results are checked. The cluster's start-up is not counted; one warm-up batch runs first on
each side.

    python benchmarks/fanout.py [--runs 1000] [--nodes 2] [--chunk 25] [--rounds 5]

Target (issue 13): fan-out >= 90% of PythonPool's runs/s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hybrid.fanout import PythonJob, fan_out  # noqa: E402
from hybrid.raylocal import LocalCluster  # noqa: E402
from hybrid.wasm.python import PythonPool  # noqa: E402


def snippet(i: int) -> str:
    return f"total = sum(range({i}))\nprint(total)"


def check(outputs: list[str], runs: int) -> None:
    assert outputs == [f"{sum(range(i))}\n" for i in range(runs)], "wrong or reordered results"


def timed(run: Callable[[list[Any]], list[str]], jobs: list[Any]) -> float:
    """Runs per second of one batch, its results checked."""
    start = time.perf_counter()
    outputs = run(jobs)
    elapsed = time.perf_counter() - start
    check(outputs, len(jobs))
    return len(jobs) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=5, help="Batches on each side, alternating.")
    args = parser.parse_args()
    import ray

    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    pool_rates: list[float] = []
    ray_rates: list[float] = []
    with PythonPool(args.nodes) as pool, LocalCluster(nodes=args.nodes, cpus=1, env=env) as cluster:

        def on_pool(jobs: list[Any]) -> list[str]:
            return [r.stdout for r in pool.map([{"source": j.source} for j in jobs])]

        def on_ray(jobs: list[Any]) -> list[str]:
            return [r.stdout for r in fan_out(jobs, cluster.address, chunk=args.chunk)]

        try:
            warm = [PythonJob(source=snippet(i)) for i in range(args.nodes * args.chunk * 2)]
            on_pool(warm)
            on_ray(warm)
            jobs = [PythonJob(source=snippet(i)) for i in range(args.runs)]
            # Alternating rounds: whatever else the machine does slows both sides alike.
            for _ in range(args.rounds):
                pool_rates.append(timed(on_pool, jobs))
                ray_rates.append(timed(on_ray, jobs))
        finally:
            ray.shutdown()
    pool_rate, ray_rate = statistics.median(pool_rates), statistics.median(ray_rates)
    print(
        f"{args.runs} python-wasm runs x {args.rounds} rounds, {args.nodes} CPUs, "
        f"load {os.getloadavg()[0]:.1f}; median runs/s (min-max)"
    )
    print(
        f"PythonPool({args.nodes})                {pool_rate:8.1f}  "
        f"({min(pool_rates):.0f}-{max(pool_rates):.0f})"
    )
    print(
        f"Ray fan-out, {args.nodes} nodes x 1 CPU     {ray_rate:8.1f}  "
        f"({min(ray_rates):.0f}-{max(ray_rates):.0f})  {ray_rate / pool_rate:.0%} of PythonPool"
    )


if __name__ == "__main__":
    main()
