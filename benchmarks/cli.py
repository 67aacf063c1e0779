"""Whole-process command timings, side by side in one run: with the resident server warm and
without it, against `docker exec` into a warm container.

Every row is a separate process started from here, timed from spawn to exit, the way an agent
calls a tool. Rows are measured round-robin (one sample of each in turn), so a busy machine
slows them all alike. The client is started as the `hybrid` console script starts it (an
interpreter running ``hybrid.server.client:main``); the `-S` rows start the same client without
the site module, which on this machine runs .pth hooks (an editable install's finder, a CA
injector) that a wheel install does not have: they show what the client itself costs.

    python benchmarks/cli.py [--runs 30] [--no-engine]

Targets (issue 13): `py eval` and `check csv` with the server warm p50 <= 50 ms and faster than
`docker exec`; `run --tier docker` from the warm pool p50 <= 150 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CLIENT = "import sys; from hybrid.server.client import main; sys.exit(main())"
CONTAINER = "hybrid-bench-cli-exec"
POOL_SIZE = 2


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Bench:
    def __init__(self, runtime: Path) -> None:
        self.env = {
            **os.environ,
            "HYBRID_RUNTIME_DIR": str(runtime),
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        self.env.pop("HYBRID_NO_SERVER", None)
        self.csv = runtime / "rate_card.csv"
        self.csv.write_text("role,rate\nengineer,100\ndesigner,80\n")

    def hybrid(self, *args: str, server: bool, site: bool = True) -> list[str]:
        flags = [] if site else ["-S"]
        return [sys.executable, *flags, "-c", CLIENT, *([] if server else ["--no-server"]), *args]

    def run(self, argv: list[str], expect: str = "") -> float:
        started = time.perf_counter()
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True)
        elapsed = (time.perf_counter() - started) * 1000
        if done.returncode != 0 or expect not in done.stdout:
            raise SystemExit(f"{' '.join(argv[-6:])}: exit {done.returncode}: {done.stderr[-400:]}")
        return elapsed

    def serve(self, *options: str) -> dict[str, object]:
        done = subprocess.run(
            [sys.executable, "-m", "hybrid", "serve", "--detach", "--json", *options],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            raise SystemExit(f"hybrid serve: {done.stderr}")
        status: dict[str, object] = json.loads(done.stdout)
        return status

    def status(self) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-m", "hybrid", "serve", "--status", "--json"],
            env=self.env,
            capture_output=True,
            text=True,
        )
        return json.loads(done.stdout) if done.returncode == 0 else {}

    def stop(self) -> None:
        subprocess.run(
            [sys.executable, "-m", "hybrid", "serve", "--stop"], env=self.env, capture_output=True
        )

    def pool_settled(self, tier: str, size: int) -> bool:
        """``size`` sandboxes ready for ``tier`` and none being made or destroyed."""
        pool: dict[str, Any] = self.status().get("pool") or {}
        keys = [k for k in pool.get("keys", []) if k["tier"] == tier]
        return (
            sum(k["ready"] for k in keys) >= size
            and not any(k["making"] for k in keys)
            and not pool.get("destroying")
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--docker-runs", type=int, default=15)
    parser.add_argument("--no-engine", action="store_true", help="Skip the Docker rows.")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="hybrid-bench-cli-") as made:
        bench = Bench(Path(made))
        csv = str(bench.csv)
        engine = not args.no_engine and shutil.which("docker") is not None
        bench.serve("--pool-size", str(POOL_SIZE), *(["--pool-warm", "docker"] if engine else []))
        rows: dict[str, tuple[Callable[[], float], int]] = {
            "python3 -c pass (interpreter floor, with site)": (
                lambda: bench.run([sys.executable, "-c", "pass"]),
                args.runs,
            ),
            "python3 -S -c pass (interpreter floor)": (
                lambda: bench.run([sys.executable, "-S", "-c", "pass"]),
                args.runs,
            ),
            "hybrid py eval 'print(1)'  no server": (
                lambda: bench.run(bench.hybrid("py", "eval", "print(1)", server=False), "1"),
                args.runs,
            ),
            "hybrid py eval 'print(1)'  server warm": (
                lambda: bench.run(bench.hybrid("py", "eval", "print(1)", server=True), "1"),
                args.runs,
            ),
            "hybrid py eval 'print(1)'  server warm, -S": (
                lambda: bench.run(
                    bench.hybrid("py", "eval", "print(1)", server=True, site=False), "1"
                ),
                args.runs,
            ),
            "hybrid check csv FILE  no server": (
                lambda: bench.run(bench.hybrid("check", "csv", csv, server=False), "rows"),
                args.runs,
            ),
            "hybrid check csv FILE  server warm": (
                lambda: bench.run(bench.hybrid("check", "csv", csv, server=True), "rows"),
                args.runs,
            ),
            "hybrid check csv FILE  server warm, -S": (
                lambda: bench.run(
                    bench.hybrid("check", "csv", csv, server=True, site=False), "rows"
                ),
                args.runs,
            ),
        }
        pooled_hits: list[int] = []
        if engine:
            from hybrid.workstation.images import BASE_IMAGE

            subprocess.run(["docker", "rm", "-f", CONTAINER], capture_output=True)
            subprocess.run(
                [
                    "docker",
                    "run",
                    "-d",
                    "--rm",
                    "--name",
                    CONTAINER,
                    # The base image's labels say hybrid.managed=1, and a reaper would take a
                    # container without an owner for a dead client's leftover.
                    "--label",
                    "hybrid.managed=0",
                    "--network",
                    "none",
                    "--read-only",
                    "--cap-drop",
                    "ALL",
                    "--security-opt",
                    "no-new-privileges",
                    BASE_IMAGE,
                    "sleep",
                    "3600",
                ],
                check=True,
                capture_output=True,
            )
            run = ["run", "--tier", "docker", "--", "python3", "-c", "print(1)"]

            def pooled(site: bool = True, settle: bool = True) -> float:
                # A warm pool is a settled one: the last run's sandbox destroyed and its
                # replacement made, as between an agent's calls. The "refill under way" row
                # runs right after another run instead, beside that destroy and create.
                deadline = time.monotonic() + 120
                while settle and not bench.pool_settled("docker", POOL_SIZE):
                    if time.monotonic() > deadline:
                        raise SystemExit("the pool did not settle within 120 s")
                    time.sleep(0.2)
                before = bench.status().get("pool", {}).get("hits", 0)
                took = bench.run(bench.hybrid(*run, server=True, site=site), "1")
                after = bench.status().get("pool", {}).get("hits", 0)
                pooled_hits.append(int(after) - int(before))
                return took

            def back_to_back() -> float:
                pooled()
                return pooled(settle=False)

            rows |= {
                "docker exec WARM python3 -c 'print(1)'": (
                    lambda: bench.run(
                        ["docker", "exec", CONTAINER, "python3", "-c", "print(1)"], "1"
                    ),
                    args.runs,
                ),
                "hybrid run --tier docker  no server": (
                    lambda: bench.run(bench.hybrid(*run, server=False), "1"),
                    args.docker_runs,
                ),
                "hybrid run --tier docker  server, warm pool": (pooled, args.docker_runs),
                "hybrid run --tier docker  server, warm pool, -S": (
                    lambda: pooled(site=False),
                    args.docker_runs,
                ),
                "hybrid run --tier docker  server, refill under way": (
                    back_to_back,
                    args.docker_runs,
                ),
            }
        try:
            for measure, _ in rows.values():  # warm every path once
                measure()
            pooled_hits.clear()
            samples: dict[str, list[float]] = {name: [] for name in rows}
            for i in range(max(n for _, n in rows.values())):
                for name, (measure, n) in rows.items():
                    if i < n:
                        samples[name].append(measure())
        finally:
            bench.stop()
            if engine:
                subprocess.run(["docker", "rm", "-f", CONTAINER], capture_output=True)

    load = os.getloadavg()[0]
    print(f"\n{os.cpu_count()} cores, load average {load:.1f}; whole process, ms\n")
    exec_p50 = statistics.median(samples.get("docker exec WARM python3 -c 'print(1)'", [0.0]))
    print(f"{'command':50} {'n':>3} {'p50':>8} {'p95':>8} {'p50 / docker exec':>18}")
    for name, values in samples.items():
        p50 = statistics.median(values)
        ratio = f"{p50 / exec_p50:.2f}x" if exec_p50 else "-"
        print(f"{name:50} {len(values):>3} {p50:8.1f} {pct(values, 0.95):8.1f} {ratio:>18}")
    if pooled_hits:
        print(f"\npooled runs served from the pool: {sum(pooled_hits)}/{len(pooled_hits)}")


if __name__ == "__main__":
    main()
