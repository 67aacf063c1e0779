"""Tier benchmark: the same jobs through every tier this host can run, cold and warm, one table.

Jobs
  csv      check a 5,000-row CSV (required columns, int/float/date types)
  func     a Python function and five asserts
  pytest   `pytest -q` on a small real project (the more-itertools sdist from PyPI, ~660 tests)

Tiers (each job runs where it can): wasm (built-in check), python-wasm (CPython in WASM),
bwrap (bubblewrap sandbox), docker (runc workstation), gvisor (runsc workstation), microvm (QEMU;
csv and func only), and host: the same command with the
same interpreter and pytest (the base image's root filesystem, entered with chroot) and no
sandbox, the baseline the ratios divide by.

Cold and warm
  wasm, python-wasm   cold: first run in a fresh process (module loaded from the on-disk cache);
                      warm: later runs in the same process
  bwrap, docker,      cold: create a hardened workstation, copy inputs in, run, remove;
  gvisor              warm: run in a workstation that is already up
  host                a new process each time (cold = warm)

A second table checks the workstation targets (create+exec+remove, exec, snapshot, start from
a snapshot, pytest in a workstation vs the host).

Usage: python benchmarks/tiers.py [--runs 10] [--pytest-runs 5] [--project DIR] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from hybrid.errors import HybridError
from hybrid.paths import cache_dir
from hybrid.policy import Budget, SandboxSpec
from hybrid.router import availability
from hybrid.workstation import Snapshots

PROJECT = ("more-itertools", "10.5.0")
PYTEST = "python3 -m pytest -q -p no:cacheprovider"
COLUMNS = "id,name,price,day\n"

CSV_SCRIPT = textwrap.dedent(
    """
    import csv, datetime
    with open("data.csv", newline="") as f:
        rows = csv.DictReader(f)
        assert {"id", "name", "price", "day"} <= set(rows.fieldnames)
        n = 0
        for row in rows:
            int(row["id"]); float(row["price"]); datetime.date.fromisoformat(row["day"])
            n += 1
    print("ok", n)
    """
)

FUNC_SOURCE = textwrap.dedent(
    """
    import re

    def slugify(text):
        text = re.sub(r"[^a-z0-9]+", "-", text.lower())
        return text.strip("-")
    """
)
FUNC_TESTS = textwrap.dedent(
    """
    assert slugify("Hello World") == "hello-world"
    assert slugify("  many   spaces ") == "many-spaces"
    assert slugify("Already-slugged") == "already-slugged"
    assert slugify("Ünïcödé!") == "n-c-d"
    assert slugify("") == ""
    """
)

console = Console(stderr=True)


def csv_data(rows: int = 5000) -> bytes:
    lines = [COLUMNS]
    for i in range(rows):
        lines.append(f"{i},item-{i},{i * 1.25:.2f},2024-{1 + i % 12:02d}-{1 + i % 28:02d}\n")
    return "".join(lines).encode()


def stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50": statistics.median(ordered), "p95": p95, "n": len(ordered)}


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"benchmark job failed: {what}")


# -- inputs -----------------------------------------------------------------------------------


def project(path: Path | None) -> Path:
    """The small real project: --project, or the more-itertools sdist (downloaded once with pip)."""
    if path is not None:
        return path.resolve()
    name, version = PROJECT
    # Not under the cache directory: the toolkit's own state is a secret path no repository
    # may be read from, and this one goes into every tier as a repository.
    root = Path(tempfile.gettempdir()) / "hybrid-bench" / f"{name}-{version}"
    if (root / "tests").is_dir():
        return root
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"{name}=={version}",
                "-d",
                tmp,
            ],
            check=True,
        )
        archive = next(Path(tmp).glob("*.tar.gz"))
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        extracted = next(p for p in Path(tmp).iterdir() if p.is_dir())
        shutil.copytree(extracted, root)
    return root


def host_rootfs() -> Path | None:
    """The base image's root filesystem on the host (exported once), for the no-sandbox baseline."""
    from hybrid.workstation.docker import client
    from hybrid.workstation.images import BASE_IMAGE, get

    info = get(BASE_IMAGE)
    if info is None or os.geteuid() != 0:
        return None
    root = cache_dir("bench") / f"rootfs-{info.id[7:19]}"
    if (root / "usr/bin/python3").exists():
        return root
    api = client().api
    container = api.create_container(
        BASE_IMAGE, command=["true"], labels={"hybrid.managed": "1", "hybrid.kind": "bench"}
    )
    try:
        with tempfile.TemporaryFile() as archive:
            for chunk in api.export(container["Id"]):
                archive.write(chunk)
            archive.seek(0)
            partial = root.with_suffix(".partial")
            shutil.rmtree(partial, ignore_errors=True)
            with tarfile.open(fileobj=archive) as tar:
                tar.extractall(partial, filter="fully_trusted")
            partial.rename(root)
    finally:
        api.remove_container(container["Id"], force=True)
    return root


class Host:
    """Runs a command in the base image's root filesystem with chroot: same binaries, no sandbox."""

    def __init__(self, rootfs: Path | None) -> None:
        self.rootfs = rootfs
        self.work = Path(tempfile.mkdtemp(prefix="bench-", dir=rootfs / "tmp" if rootfs else None))

    def put(self, data: bytes | Path, name: str) -> None:
        dest = self.work / name
        if isinstance(data, Path):
            shutil.copytree(data, dest, symlinks=True)
        else:
            dest.write_bytes(data)

    def run(self, command: str, cwd: str = ".") -> subprocess.CompletedProcess[bytes]:
        workdir = self.work / cwd
        if self.rootfs is None:
            return subprocess.run(
                command.replace("python3", sys.executable, 1),
                shell=True,
                cwd=workdir,
                capture_output=True,
            )
        inside = "/" + str(workdir.relative_to(self.rootfs))
        argv = ["chroot", str(self.rootfs), "/bin/sh", "-c", f"cd {inside} && HOME=/tmp {command}"]
        return subprocess.run(argv, capture_output=True)

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


# -- measurements -------------------------------------------------------------------------------


def in_fresh_process(code: str) -> float:
    """Milliseconds the snippet's first run took inside a new Python process (imports excluded)."""
    script = (
        "import json, time\n"
        + code
        + "\nstart = time.perf_counter()\njob()\n"
        + "print(json.dumps((time.perf_counter() - start) * 1000))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


WASM_CSV_COLD = """
from pathlib import Path
from hybrid.checks import check_csv
data = Path({path!r})
def job():
    assert check_csv(data, require=["id", "name", "price", "day"], types={{"id": "int", "price": "float", "day": "date"}}).ok
"""

PYWASM_CSV = """
from hybrid.wasm.python import run_python
data = open({path!r}, "rb").read()
def job():
    r = run_python({source!r}, files={{"data.csv": data}})
    assert r.ok and r.stdout.startswith("ok"), r
"""

PYWASM_FUNC = """
from hybrid.wasm.python import run_python
def job():
    r = run_python({source!r}, {tests!r})
    assert r.ok, r
"""


def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from hybrid.workstation import backend

    tiers = availability()
    rows: list[dict[str, Any]] = []
    targets: list[dict[str, Any]] = []
    runs, pyruns = args.runs, args.pytest_runs
    data = csv_data()
    workdir = Path(tempfile.mkdtemp(prefix="hybrid-bench-"))
    csv_path = workdir / "data.csv"
    csv_path.write_bytes(data)
    project_dir = project(args.project)
    rootfs = host_rootfs() if tiers.get("docker", (False, ""))[0] else None
    host = Host(rootfs)
    host.put(data, "data.csv")
    host.put(CSV_SCRIPT.encode(), "check.py")
    host.put((FUNC_SOURCE + FUNC_TESTS).encode(), "func.py")
    host.put(project_dir, "project")

    def add(job: str, tier: str, cold: list[float], warm: list[float]) -> None:
        rows.append({"job": job, "tier": tier, "cold": stats(cold), "warm": stats(warm)})

    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("host baseline", total=None)

        def loop(n: int, fn: Callable[[], Any]) -> list[float]:
            return [timed(fn) for _ in range(n)]

        # host: same interpreter and pytest, no sandbox
        def host_run(command: str, cwd: str = ".", check: str = "") -> Callable[[], None]:
            def go() -> None:
                done = host.run(command, cwd)
                expect(
                    done.returncode == 0 and check.encode() in done.stdout,
                    f"host: {command}: {done.stderr[-300:]!r}",
                )

            return go

        samples = loop(runs, host_run("python3 check.py", check="ok 5000"))
        add("csv", "host", samples, samples)
        samples = loop(runs, host_run("python3 func.py"))
        add("func", "host", samples, samples)
        samples = loop(pyruns, host_run(PYTEST, "project", "passed"))
        add("pytest", "host", samples, samples)
        host_pytest = stats(samples)["p50"]

        if tiers.get("wasm", (False, ""))[0]:
            progress.update(task, description="wasm: csv check")
            from hybrid.checks import check_csv

            cold = [
                in_fresh_process(WASM_CSV_COLD.format(path=str(csv_path)))
                for _ in range(max(3, runs // 2))
            ]

            def wasm_csv() -> None:
                expect(
                    check_csv(
                        csv_path,
                        require=["id", "name", "price", "day"],
                        types={"id": "int", "price": "float", "day": "date"},
                    ).ok,
                    "wasm csv",
                )

            wasm_csv()
            add("csv", "wasm", cold, loop(runs, wasm_csv))

        if tiers.get("python-wasm", (False, ""))[0]:
            progress.update(task, description="python-wasm: building/loading the guest")
            from hybrid.wasm.python import run_python

            run_python("pass")  # builds the guest once if this machine never has
            progress.update(task, description="python-wasm: csv, func")
            csv_code = PYWASM_CSV.format(path=str(csv_path), source=CSV_SCRIPT)
            func_code = PYWASM_FUNC.format(source=FUNC_SOURCE, tests=FUNC_TESTS)
            cold_csv = [in_fresh_process(csv_code) for _ in range(max(3, runs // 2))]
            cold_func = [in_fresh_process(func_code) for _ in range(max(3, runs // 2))]

            def py_csv() -> None:
                result = run_python(CSV_SCRIPT, files={"data.csv": data})
                expect(
                    result.ok and result.stdout.startswith("ok 5000"),
                    f"python-wasm csv: {result.detail}",
                )

            def py_func() -> None:
                result = run_python(FUNC_SOURCE, FUNC_TESTS)
                expect(result.ok, f"python-wasm func: {result.detail}")

            add("csv", "python-wasm", cold_csv, loop(runs, py_csv))
            add("func", "python-wasm", cold_func, loop(runs, py_func))

        for tier in ("bwrap", "docker", "gvisor"):
            if not tiers.get(tier, (False, ""))[0]:
                continue
            b = backend(tier)
            spec = SandboxSpec(
                tier=tier, budget=Budget(wall_seconds=600, memory="1G", pids=256, cpus=2)
            )
            progress.update(task, description=f"{tier}: csv, func (cold)")

            def cold_job(
                inputs: dict[str, bytes],
                command: str,
                check: str,
                repo: Path | None = None,
                spec: SandboxSpec = spec,
                tier: str = tier,
                b: Any = b,
            ) -> Callable[[], None]:
                def go() -> None:
                    with b.create(spec, repo=repo) as ws:
                        for name, blob in inputs.items():
                            ws.put(blob, name)
                        result = ws.exec(command)
                        expect(
                            result.ok and check in result.stdout,
                            f"{tier}: {command}: {result.detail} {result.stderr[-300:]}",
                        )

                return go

            csv_inputs = {"data.csv": data, "check.py": CSV_SCRIPT.encode()}
            func_inputs = {"func.py": (FUNC_SOURCE + FUNC_TESTS).encode()}
            cold_csv = loop(runs, cold_job(csv_inputs, "python3 check.py", "ok 5000"))
            cold_func = loop(runs, cold_job(func_inputs, "python3 func.py", ""))
            progress.update(task, description=f"{tier}: pytest (cold)")
            cold_pytest = loop(pyruns, cold_job({}, PYTEST, "passed", repo=project_dir))

            progress.update(task, description=f"{tier}: warm runs")
            with b.create(spec, repo=project_dir) as ws:
                for name, blob in {**csv_inputs, **func_inputs}.items():
                    ws.put(blob, name)

                def warm(command: str, check: str, tier: str = tier) -> Callable[[], None]:
                    def go() -> None:
                        result = ws.exec(command)
                        expect(
                            result.ok and check in result.stdout,
                            f"{tier} warm: {command}: {result.detail}",
                        )

                    return go

                add("csv", tier, cold_csv, loop(runs, warm("python3 check.py", "ok 5000")))
                add("func", tier, cold_func, loop(runs, warm("python3 func.py", "")))
                warm_pytest = loop(pyruns, warm(PYTEST, "passed"))
                add("pytest", tier, cold_pytest, warm_pytest)

                progress.update(task, description=f"{tier}: workstation targets")
                hardened = SandboxSpec(tier=tier)

                def lifecycle(hardened: SandboxSpec = hardened, b: Any = b) -> None:
                    made = b.create(hardened)
                    try:
                        expect(made.exec(["true"]).ok, "exec true")
                    finally:
                        made.remove()

                cycle = stats(loop(runs * 2, lifecycle))
                execs = stats(loop(runs * 3, lambda: ws.exec(["true"])))
                snaps: list[float] = []
                starts: list[float] = []
                names: list[str] = []
                try:
                    for i in range(max(3, runs // 2) if isinstance(b, Snapshots) else 0):
                        name = f"bench-{tier}-{os.getpid()}-{i}"
                        t0 = time.perf_counter()
                        ws.snapshot(name, ephemeral=True)
                        snaps.append((time.perf_counter() - t0) * 1000)
                        names.append(name)
                        t0 = time.perf_counter()
                        started = b.start(name)
                        starts.append((time.perf_counter() - t0) * 1000)
                        started.remove()
                finally:
                    for name in names:
                        with contextlib.suppress(HybridError):
                            b.remove_snapshot(name)
                ratio = stats(warm_pytest)["p50"] / host_pytest
                runtime = {"docker": "runc", "gvisor": "runsc"}.get(tier, tier)
                if tier == "bwrap":
                    targets += [
                        {
                            "target": "create + exec + remove (bwrap)",
                            "p50_ms": cycle["p50"],
                            "p95_ms": cycle["p95"],
                            "limit": 30.0,
                        },
                        {
                            "target": "exec in a running workstation (bwrap)",
                            "p50_ms": execs["p50"],
                            "p95_ms": execs["p95"],
                            "limit": None,
                        },
                        {
                            "target": "pytest in a workstation / host (bwrap)",
                            "ratio": ratio,
                            "limit_ratio": 1.1,
                        },
                    ]
                    continue
                targets += [
                    {
                        "target": f"hardened create + exec + remove ({runtime})",
                        "p50_ms": cycle["p50"],
                        "p95_ms": cycle["p95"],
                        "limit": 450.0 if tier == "docker" else None,
                    },
                    {
                        "target": f"exec in a running workstation ({runtime})",
                        "p50_ms": execs["p50"],
                        "p95_ms": execs["p95"],
                        "limit": 70.0 if tier == "docker" else None,
                    },
                    {
                        "target": f"snapshot ({runtime}, project + pycache)",
                        "p50_ms": stats(snaps)["p50"],
                        "p95_ms": stats(snaps)["p95"],
                        "limit": 1000.0,
                    },
                    {
                        "target": f"start from a snapshot ({runtime})",
                        "p50_ms": stats(starts)["p50"],
                        "p95_ms": stats(starts)["p95"],
                        "limit": 500.0,
                    },
                    {
                        "target": f"pytest in a workstation / host ({runtime})",
                        "ratio": ratio,
                        "limit_ratio": 1.3 if tier == "docker" else None,
                    },
                ]
        if tiers.get("microvm", (False, ""))[0]:
            progress.update(task, description="microvm: boot, snapshot, csv, func")
            microvm_rows(add, targets, runs, data)
    host.close()
    shutil.rmtree(workdir, ignore_errors=True)
    return rows, targets


def microvm_rows(
    add: Callable[[str, str, list[float], list[float]], None],
    targets: list[dict[str, Any]],
    runs: int,
    data: bytes,
) -> None:
    """microvm: csv and func cold (a VM from its template, inputs in, run, remove) and warm (exec
    in a running VM); targets: a cold boot to the first command, a start from the template
    snapshot to the first command, and exec in a running VM. pytest is left out: guest code
    runs ~15x slower under TCG, so a 660-test run takes minutes."""
    from hybrid.workstation.microvm import MicrovmBackend, build, vm
    from hybrid.workstation.microvm.backend import shape_of

    b = MicrovmBackend()
    spec = SandboxSpec(tier="microvm", budget=Budget(wall_seconds=600, memory="512M", pids=256))
    inputs = {
        "csv": ({"data.csv": data, "check.py": CSV_SCRIPT.encode()}, "python3 check.py", "ok 5000"),
        "func": ({"func.py": (FUNC_SOURCE + FUNC_TESTS).encode()}, "python3 func.py", ""),
    }

    def cold(files: dict[str, bytes], command: str, check: str) -> Callable[[], None]:
        def go() -> None:
            with b.create(spec) as ws:
                for name, blob in files.items():
                    ws.put(blob, name)
                result = ws.exec(command)
                expect(result.ok and check in result.stdout, f"microvm: {command}: {result.detail}")

        return go

    colds = {job: [timed(cold(*inputs[job])) for _ in range(max(3, runs // 2))] for job in inputs}
    with b.create(spec) as ws:
        for files, _command, _check in inputs.values():
            for name, blob in files.items():
                ws.put(blob, name)
        for job, (_files, command, check) in inputs.items():
            warm = [
                timed(lambda c=command, k=check: expect(k in ws.exec(c).stdout, c))
                for _ in range(runs)
            ]
            add(job, "microvm", colds[job], warm)
        execs = stats([timed(lambda: ws.exec(["true"])) for _ in range(runs)])

    artifacts = build.built()
    assert artifacts is not None
    hardened = SandboxSpec(tier="microvm")
    shape = shape_of(hardened)

    def boot(snapshot: Path | None) -> float:
        home = Path(tempfile.mkdtemp(prefix="hybrid-bench-vm-"))
        started = time.perf_counter()
        machine = vm.Machine(
            artifacts, shape, home, [vm.Share("s0", home, "", False)], incoming=snapshot
        )
        try:
            machine.connect()
            first = machine.stream(
                {
                    "op": "exec",
                    "argv": ["true"],
                    "env": {},
                    "cwd": "/",
                    "timeout": 60,
                    "limit": 1024,
                    "uid": 1000,
                },
                time.monotonic() + 120,
            )
            expect(any(m.get("code") == 0 for m in first), "first command in a booted VM")
            return (time.perf_counter() - started) * 1000
        finally:
            machine.close()
            shutil.rmtree(home, ignore_errors=True)

    template = vm.template(artifacts, shape)
    accelerator = vm.accel()[0]
    boots = stats([boot(None) for _ in range(max(3, runs // 3))])
    restores = stats([boot(template) for _ in range(max(3, runs // 2))])
    targets += [
        {
            "target": f"microvm cold boot to first command ({accelerator})",
            "p50_ms": boots["p50"],
            "p95_ms": boots["p95"],
            "limit": 2500.0 if accelerator == "tcg" else 300.0,
        },
        {
            "target": f"microvm from its snapshot to first command ({accelerator})",
            "p50_ms": restores["p50"],
            "p95_ms": restores["p95"],
            "limit": 1000.0,
        },
        {
            "target": f"exec in a running microVM ({accelerator})",
            "p50_ms": execs["p50"],
            "p95_ms": execs["p95"],
            "limit": None,
        },
    ]


def render(rows: list[dict[str, Any]], targets: list[dict[str, Any]], note: str) -> None:
    out = Console(width=None if sys.stdout.isatty() else 140)
    table = Table(title="tiers: same jobs, milliseconds (ratio = warm p50 / host p50)")
    for column in (
        "job",
        "tier",
        "cold p50",
        "cold p95",
        "warm p50",
        "warm p95",
        "warm / host",
        "n",
    ):
        table.add_column(
            column, justify="left" if column in ("job", "tier") else "right", no_wrap=True
        )
    host = {r["job"]: r["warm"]["p50"] for r in rows if r["tier"] == "host"}
    order = {
        t: i
        for i, t in enumerate(
            ("wasm", "python-wasm", "bwrap", "docker", "gvisor", "microvm", "host")
        )
    }
    for row in sorted(
        rows, key=lambda r: (("csv", "func", "pytest").index(r["job"]), order[r["tier"]])
    ):
        ratio = row["warm"]["p50"] / host[row["job"]] if host.get(row["job"]) else float("nan")
        table.add_row(
            row["job"],
            row["tier"],
            f"{row['cold']['p50']:.1f}",
            f"{row['cold']['p95']:.1f}",
            f"{row['warm']['p50']:.1f}",
            f"{row['warm']['p95']:.1f}",
            f"{ratio:.2f}x",
            f"{row['cold']['n']}/{row['warm']['n']}",
        )
    out.print(table)
    checks = Table(title="workstation targets")
    for column in ("target", "p50", "p95", "target", "met"):
        checks.add_column(column, justify="left" if column == "target" else "right", no_wrap=True)
    for t in targets:
        if "ratio" in t:
            limit = t["limit_ratio"]
            met = "" if limit is None else ("yes" if t["ratio"] <= limit else "NO")
            checks.add_row(
                t["target"], f"{t['ratio']:.2f}x", "", f"<= {limit}x" if limit else "-", met
            )
        else:
            limit = t["limit"]
            met = "" if limit is None else ("yes" if t["p50_ms"] <= limit else "NO")
            checks.add_row(
                t["target"],
                f"{t['p50_ms']:.0f} ms",
                f"{t['p95_ms']:.0f} ms",
                f"<= {limit:.0f} ms" if limit else "-",
                met,
            )
    out.print(checks)
    out.print(note)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="Samples per quick measurement.")
    parser.add_argument("--pytest-runs", type=int, default=5, help="Samples of each pytest run.")
    parser.add_argument(
        "--project", type=Path, help="Project to run pytest on (default: more-itertools sdist)."
    )
    parser.add_argument("--json", action="store_true", help="Print raw numbers as JSON.")
    args = parser.parse_args()
    rows, targets = measure(args)
    skipped = [t for t, (ok, _) in availability().items() if not ok]
    note = f"{os.cpu_count()} cores; host = base image rootfs via chroot, no sandbox"
    if skipped:
        note += f"; not available here: {', '.join(skipped)} (see hybrid doctor)"
    if args.json:
        print(json.dumps({"rows": rows, "targets": targets, "note": note}, indent=2))
    else:
        render(rows, targets, note)


if __name__ == "__main__":
    main()
