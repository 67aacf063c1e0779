"""python-wasm runs per second: fan-out on a local two-node Ray cluster vs PythonPool, same cores.

The cluster is hybrid.raylocal.LocalCluster: a head and a second node, each a real `ray start`
process with one CPU, on loopback addresses. PythonPool gets as many worker processes as the
cluster has CPUs. Both run the same snippets (each a fresh CPython-in-WASM instance) and the
results are checked. The cluster's start-up is not counted; one warm-up batch runs first on
each side.

    python benchmarks/fanout.py [--runs 1000] [--nodes 2] [--chunk 25]

Target (issue 13): fan-out >= 90% of PythonPool's runs/s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hybrid.fanout import PythonJob, fan_out  # noqa: E402
from hybrid.raylocal import LocalCluster  # noqa: E402
from hybrid.wasm.python import PythonPool  # noqa: E402


def snippet(i: int) -> str:
    return f"total = sum(range({i}))\nprint(total)"


def check(outputs: list[str], runs: int) -> None:
    assert outputs == [f"{sum(range(i))}\n" for i in range(runs)], "wrong or reordered results"


def pool_rate(runs: int, processes: int) -> float:
    with PythonPool(processes) as pool:
        list(pool.map([{"source": snippet(i)} for i in range(processes * 8)]))  # warm
        start = time.perf_counter()
        outputs = [r.stdout for r in pool.map([{"source": snippet(i)} for i in range(runs)])]
        elapsed = time.perf_counter() - start
    check(outputs, runs)
    return runs / elapsed


def ray_rate(runs: int, nodes: int, chunk: int) -> float:
    import ray

    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with LocalCluster(nodes=nodes, cpus=1, env=env) as cluster:
        try:
            warm = [PythonJob(source=snippet(i)) for i in range(nodes * chunk * 2)]
            list(fan_out(warm, cluster.address, chunk=chunk))
            jobs = [PythonJob(source=snippet(i)) for i in range(runs)]
            start = time.perf_counter()
            outputs = [r.stdout for r in fan_out(jobs, cluster.address, chunk=chunk)]
            elapsed = time.perf_counter() - start
        finally:
            ray.shutdown()
    check(outputs, runs)
    return runs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=25)
    args = parser.parse_args()
    ray = ray_rate(args.runs, args.nodes, args.chunk)
    pool = pool_rate(args.runs, args.nodes)
    print(f"{args.runs} python-wasm runs, {args.nodes} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"PythonPool({args.nodes})                {pool:8.1f} runs/s")
    print(f"Ray fan-out, {args.nodes} nodes x 1 CPU     {ray:8.1f} runs/s  ({ray / pool:.0%})")


if __name__ == "__main__":
    main()
