"""Benchmark the built-in checks: warm in-process calls, first calls, whole `hybrid check` processes.

    python benchmarks/wasm_tier.py [--runs 300] [--procs 15]

Prints one table: per check the warm in-process p50/p95 (compiled module in memory), the time
spent inside the guest, the first call in a fresh process (cold compile with an empty cache,
and with the compiled-module disk cache warm), and the whole `hybrid check ...` process; then
the same csv check done by a fresh Python subprocess with the stdlib csv module, for comparison.
All numbers come from this one run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hybrid import checks, git

REPO = Path(__file__).resolve().parent.parent
# The console script next to this interpreter: a version-manager shim in front of it on PATH
# would add its own start-up cost to every whole-process number.
_SIBLING = Path(sys.executable).with_name("hybrid")
HYBRID = str(_SIBLING) if _SIBLING.exists() else (shutil.which("hybrid") or "hybrid")


def make_inputs(root: Path) -> dict[str, tuple[Callable[[], object], list[str]]]:
    """name -> (in-process call, `hybrid check` argv) on realistic inputs."""
    rng = random.Random(7)
    rows = ["weight,zone,cost_usd"] + [
        f"{rng.uniform(0.1, 30):.1f},zone_{rng.randint(1, 8)},{rng.uniform(2, 90):.2f}"
        for _ in range(100)
    ]
    csv_file = root / "rate_card_100.csv"
    csv_file.write_text("\n".join(rows) + "\n")
    doc = {"order": "A-1", "items": [{"sku": f"S{i}", "qty": i % 5 + 1} for i in range(100)]}
    schema = {
        "type": "object",
        "required": ["order", "items"],
        "properties": {
            "order": {"type": "string"},
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["sku", "qty"],
                    "properties": {"qty": {"type": "integer", "minimum": 1}},
                },
            },
        },
    }
    json_file = root / "order.json"
    json_file.write_text(json.dumps(doc))
    schema_file = root / "schema.json"
    schema_file.write_text(json.dumps(schema))
    log = root / "build.log"
    lines = [f"step {i}: compiling module_{i}.py ok" for i in range(300)]
    lines[50] = "export AWS_ACCESS_KEY_ID=AKIAZ7QW3ERT5YUI9OPA"
    lines[120] = "Authorization: Bearer tok_9f8e7d6c5b4a39281706"
    lines[200] = "DB_PASSWORD=hunter2-but-longer"
    log.write_text("\n".join(lines) + "\n")
    diff = git.run(["diff", "HEAD~3", "HEAD", "--", "hybrid", "tests"], REPO, text=True).stdout
    if not diff.strip():
        diff = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"
    diff_file = root / "change.diff"
    diff_file.write_text(diff)
    grep_dir = REPO / "hybrid"
    return {
        "csv": (
            lambda: checks.check_csv(
                csv_file,
                require=["weight", "zone", "cost_usd"],
                types={"weight": "float", "cost_usd": "float"},
            ),
            [
                "csv",
                str(csv_file),
                "--require",
                "weight,zone,cost_usd",
                "--types",
                "weight=float,cost_usd=float",
            ],
        ),
        "json": (
            lambda: checks.check_json(json_file, schema=schema),
            ["json", str(json_file), "--schema", str(schema_file)],
        ),
        "grep": (
            lambda: checks.grep(r"def \w+\(", grep_dir, globs=["*.py"]),
            ["grep", r"def \w+\(", str(grep_dir), "--glob", "*.py"],
        ),
        "redact": (lambda: checks.redact(log), ["redact", str(log)]),
        "scope": (
            lambda: checks.scope(diff_file, allow=["hybrid", "tests"]),
            ["scope", str(diff_file), "--allow", "hybrid", "--allow", "tests"],
        ),
    }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def first_call(name: str, cache: Path) -> float:
    """ms to load a built-in module in a fresh process: compile (empty cache) or deserialize."""
    code = (
        "import time,sys;sys.argv=['x'];"
        f"from hybrid.wasm import builtins;t=time.perf_counter();builtins.module({name!r});"
        "print((time.perf_counter()-t)*1000)"
    )
    env = dict(os.environ, HYBRID_CACHE_DIR=str(cache))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return float(out.stdout.strip())


def whole_process(argv: list[str], procs: int) -> float:
    times = []
    for _ in range(procs):
        start = time.perf_counter()
        subprocess.run([HYBRID, "check", *argv, "--json"], capture_output=True)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def python_csv_process(path: Path, procs: int) -> float:
    code = (
        "import csv,sys\n"
        "r=csv.reader(open(sys.argv[1],newline=''));h=next(r);need=['weight','zone','cost_usd']\n"
        "missing=[c for c in need if c not in h];n=0\n"
        "for row in r:\n n+=1;float(row[h.index('weight')]);float(row[h.index('cost_usd')])\n"
        "print(missing,n)\n"
    )
    times = []
    for _ in range(procs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, check=True)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300, help="warm in-process calls per check")
    parser.add_argument("--procs", type=int, default=15, help="whole processes per check")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hybrid-bench-") as tmp:
        root = Path(tmp)
        inputs = make_inputs(root)
        rows = []
        for name, (call, argv) in inputs.items():
            cold_cache = root / f"cache-{name}"
            cold = first_call(name, cold_cache)  # empty cache: compile + serialize
            warm_disk = statistics.median(first_call(name, cold_cache) for _ in range(5))
            call()
            times, guest = [], []
            for _ in range(args.runs):
                start = time.perf_counter()
                report = call()
                times.append((time.perf_counter() - start) * 1000)
                guest.append(report.usage.wall_ms)  # type: ignore[attr-defined]
            fuel = report.usage.fuel_used  # type: ignore[attr-defined]
            proc = whole_process(argv, args.procs)
            rows.append(
                (
                    name,
                    pct(times, 0.5),
                    pct(times, 0.95),
                    statistics.median(guest),
                    fuel,
                    cold,
                    warm_disk,
                    proc,
                )
            )
        baseline = python_csv_process(root / "rate_card_100.csv", args.procs)

    header = f"{'check':<7} {'warm p50':>9} {'warm p95':>9} {'in guest':>9} {'fuel':>11} {'cold compile':>13} {'load cached':>12} {'hybrid check':>13}"
    print(header)
    print("-" * len(header))
    for name, p50, p95, g, fuel, cold, warm_disk, proc in rows:
        print(
            f"{name:<7} {p50:>7.3f}ms {p95:>7.3f}ms {g:>7.3f}ms {fuel or 0:>11,} {cold:>11.1f}ms {warm_disk:>10.2f}ms {proc:>11.1f}ms"
        )
    csv_proc = rows[0][-1]
    print()
    print(f"{'csv check, 100 rows':<42} {'median':>9} {'vs warm in-process':>19}")
    print(
        f"{'hybrid check csv (whole process)':<42} {csv_proc:>7.1f}ms {csv_proc / rows[0][1]:>18.0f}x"
    )
    print(
        f"{'fresh python3 -c (stdlib csv, no sandbox)':<42} {baseline:>7.1f}ms {baseline / rows[0][1]:>18.0f}x"
    )
    print(f"{'in-process check_csv (warm, sandboxed)':<42} {rows[0][1]:>7.3f}ms {1:>18.0f}x")
    print()
    print(
        f"runs={args.runs} procs={args.procs} python={sys.version.split()[0]} cpus={os.cpu_count()}"
    )


if __name__ == "__main__":
    main()
