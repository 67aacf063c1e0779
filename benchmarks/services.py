"""Services benchmark: how long a workstation with a service takes to be ready, and the metrics
overhead per exec.

Rows
  up (no service)        create a docker workstation, first exec, remove: the baseline
  up + postgres          the same with [[services]] postgres: create returns once pg_isready
                         answers and its user and database exist (target: ready <= 5 s)
  up + redis             the same with redis (redis-cli ping)
  postgres ready         create time minus the baseline's (what the service itself adds)
  snapshot (postgres)    commit workstation + service data
  start from snapshot    a new workstation with the snapshot's service data, ready
  exec true              one exec in a running workstation (cgroup metrics read around it)

Usage: python benchmarks/services.py [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hybrid.policy import Budget, SandboxSpec, Service
from hybrid.workstation import backend


def _spec(*services: Service) -> SandboxSpec:
    return SandboxSpec(tier="docker", budget=Budget(memory="256M"), services=list(services))


def _timed(runs: int, once: Callable[[], float]) -> list[float]:
    return [once() for _ in range(runs)]


def _up(spec: SandboxSpec) -> Callable[[], float]:
    def once() -> float:
        start = time.perf_counter()
        with backend().create(spec) as ws:
            ready = time.perf_counter() - start
            assert ws.exec("true").ok
        return ready

    return once


def _row(name: str, samples: list[float]) -> dict[str, object]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {
        "row": name,
        "runs": len(samples),
        "p50_s": round(statistics.median(samples), 3),
        "p95_s": round(p95, 3),
        "max_s": round(max(samples), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    base = _timed(args.runs, _up(_spec()))
    postgres = _timed(args.runs, _up(_spec(Service(kind="postgres"))))
    redis = _timed(args.runs, _up(_spec(Service(kind="redis"))))
    rows = [
        _row("up (no service)", base),
        _row("up + postgres", postgres),
        _row("up + redis", redis),
        _row("postgres ready (minus baseline)", [p - statistics.median(base) for p in postgres]),
    ]

    engine = backend()
    snap_times, start_times = [], []
    with engine.create(_spec(Service(kind="postgres"))) as ws:
        for _ in range(args.runs):
            name = f"bench-{secrets.token_hex(3)}"
            start = time.perf_counter()
            ws.snapshot(name)
            snap_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            with engine.start(name):
                start_times.append(time.perf_counter() - start)
            engine.remove_snapshot(name)
        execs = []
        for _ in range(args.runs * 10):
            result = ws.exec("true")
            execs.append(result.usage.wall_ms / 1000)
    rows += [
        _row("snapshot (postgres)", snap_times),
        _row("start from snapshot, ready", start_times),
        _row("exec true (with metrics)", execs),
    ]

    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return
    print(f"{'row':34} {'runs':>4} {'p50 s':>8} {'p95 s':>8} {'max s':>8}")
    for row in rows:
        print(
            f"{row['row']:34} {row['runs']:>4} {row['p50_s']:>8.3f} {row['p95_s']:>8.3f} "
            f"{row['max_s']:>8.3f}"
        )


if __name__ == "__main__":
    main()
