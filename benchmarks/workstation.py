"""What a workstation for agents is judged by, per real repository, in one table from one run.

    PYTHONPATH=. python3 benchmarks/workstation.py --repos DIR [--runs 3] [--only requests ...]

``DIR`` holds git repositories fetched for evaluation (as for real_repos.py); each is exported
at its newest commit. Per project:

- setup cold: a fresh cache directory (lock: resolve and download through the user's pip
  configuration; pip's own HTTP cache is left as it is, for the host too) and a new install
  layer on a fresh copy of the image (so no earlier layer can serve it), then the workstation;
  host: ``python -m venv`` + ``pip install`` of the same requirements.
- setup warm: ``deps.up`` again (lock and layer are cache hits) -- the ready-workstation time.
- the test command, and a typecheck where the project declares one (mypy), in the workstation
  and on the host, with 1 and with 2 workstations running it at once.

Per command in a workstation, from the container's cgroup (v1): CPU seconds (user+sys), peak
memory, memory-limit hits (failcnt), block I/O bytes; and from /proc/pressure (the whole
machine: cgroup v1 has no per-group pressure) the memory and I/O stall time while it ran.
p50/p95 over ``--runs`` runs; the ratio is the workstation's p50 over the host's p50 at the
same concurrency (x2: two host runs at once as well, each in its own copy of the checkout).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel


class Bench(BaseModel):
    name: str
    github: str
    test: str
    typecheck: str | None = None


BENCHES = [
    Bench(
        name="requests",
        github="psf/requests",
        test="python -m pytest -q -p no:cacheprovider tests/test_utils.py",
    ),
    Bench(
        name="humanize",
        github="python-humanize/humanize",
        test="python -m pytest -q -p no:cacheprovider",
        typecheck="python -m mypy --cache-dir=/tmp/mypy src",
    ),
    Bench(
        name="more-itertools",
        github="more-itertools/more-itertools",
        test="python -m pytest -q -p no:cacheprovider tests",
    ),
    Bench(
        name="tomlkit",
        github="python-poetry/tomlkit",
        # tests/toml-test is a git submodule (not in the archive): its runner is left out.
        test="python -m pytest -q -p no:cacheprovider tests --ignore=tests/test_toml_tests.py",
    ),
]


# -- cgroup v1 counters of one container ------------------------------------------------------

_CG = Path("/sys/fs/cgroup")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _pressure(kind: str) -> float:
    """Machine-wide stall seconds ("some") of ``kind`` (memory, io) so far."""
    for line in _read(Path("/proc/pressure") / kind).splitlines():
        if line.startswith("some"):
            return int(line.rsplit("total=", 1)[1]) / 1e6
    return 0.0


class Counters:
    """Before/after readings of one container's cgroup around one command."""

    def __init__(self, container_id: str) -> None:
        self.id = container_id

    def _path(self, controller: str, name: str) -> Path:
        return _CG / controller / "docker" / self.id / name

    def snapshot(self) -> dict[str, float]:
        stat = dict(
            line.split() for line in _read(self._path("cpuacct", "cpuacct.stat")).splitlines()
        )
        blkio = 0
        for line in _read(self._path("blkio", "blkio.throttle.io_service_bytes")).splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in ("Read", "Write"):
                blkio += int(parts[2])
        ticks = os.sysconf("SC_CLK_TCK")
        return {
            "cpu": (int(stat.get("user", 0)) + int(stat.get("system", 0))) / ticks,
            "failcnt": float(_read(self._path("memory", "memory.failcnt")) or 0),
            "io": float(blkio),
            "psi_mem": _pressure("memory"),
            "psi_io": _pressure("io"),
        }

    def reset_peak(self) -> None:
        with contextlib.suppress(OSError):
            self._path("memory", "memory.max_usage_in_bytes").write_text("0")

    def peak(self) -> float:
        return float(_read(self._path("memory", "memory.max_usage_in_bytes")) or 0)


class Sample(BaseModel):
    wall: float
    cpu: float = 0.0
    peak_mb: float = 0.0
    failcnt: float = 0.0
    io_mb: float = 0.0
    psi_mem: float = 0.0
    psi_io: float = 0.0
    ok: bool = True


def run_in(ws: Any, command: str) -> Sample:
    counters = Counters(ws.id)
    counters.reset_peak()
    before = counters.snapshot()
    start = time.monotonic()
    result = ws.exec(["/bin/sh", "-c", command], timeout=1800)
    wall = time.monotonic() - start
    after = counters.snapshot()
    return Sample(
        wall=wall,
        cpu=after["cpu"] - before["cpu"],
        peak_mb=counters.peak() / 2**20,
        failcnt=after["failcnt"] - before["failcnt"],
        io_mb=(after["io"] - before["io"]) / 2**20,
        psi_mem=after["psi_mem"] - before["psi_mem"],
        psi_io=after["psi_io"] - before["psi_io"],
        ok=result.exit_code == 0,
    )


def run_host(venv: Path, checkout: Path, command: str) -> Sample:
    import resource

    env = {
        "PATH": f"{venv}/bin:/usr/bin:/bin",
        "HOME": tempfile.gettempdir(),
        "LANG": "C.UTF-8",
        "NO_COLOR": "1",
    }
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    psi = (_pressure("memory"), _pressure("io"))
    start = time.monotonic()
    done = subprocess.run(
        ["/bin/sh", "-c", command], cwd=checkout, env=env, capture_output=True, check=False
    )
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return Sample(
        wall=wall,
        cpu=(after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        peak_mb=after.ru_maxrss / 1024,  # the largest child so far (kB on Linux)
        io_mb=(after.ru_inblock - before.ru_inblock + after.ru_oublock - before.ru_oublock)
        * 512
        / 2**20,
        psi_mem=_pressure("memory") - psi[0],
        psi_io=_pressure("io") - psi[1],
        ok=done.returncode == 0,
    )


# -- setup ------------------------------------------------------------------------------------


def export(repo: Path, into: Path) -> Path:
    from hybrid.validate import export as export_tree

    export_tree(repo, "HEAD", into)
    return into


def fresh_image(base: str, token: str) -> str:
    """A copy of ``base`` with its own id (a label), so no existing layer serves it."""
    from hybrid.workstation.docker import LABEL_MANAGED, client

    api = client().api
    made = api.create_container(base, command=["true"], labels={LABEL_MANAGED: "1"})["Id"]
    try:
        api.commit(
            made,
            repository="hybrid-bench",
            tag=token,
            changes=[f"LABEL hybrid.bench={token}"],
        )
    finally:
        api.remove_container(made, force=True)
    return f"hybrid-bench:{token}"


def host_venv(checkout: Path, manifest: Any, into: Path) -> float:
    """The host's own cold setup of the same requirements: venv + pip install; seconds."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(into)], check=True, capture_output=True)
    specs = [f"{a.name}=={a.version}" for a in manifest.artifacts if a.ecosystem == "python"]
    if not any(a.name == "pytest" for a in manifest.artifacts):
        specs.append("pytest")  # the workstation's comes with the image (python3-pytest)
    if specs:
        done = subprocess.run(
            [
                f"{into}/bin/python",
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "-q",
                *specs,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            print(f"host pip install failed: {done.stderr[-500:]}", file=sys.stderr)
    seconds = time.monotonic() - start
    site = next(into.glob("lib/python3*/site-packages"))
    (site / "_bench_project.pth").write_text(
        "".join(f"{(checkout / p).resolve()}\n" for p in manifest.paths)
    )
    return seconds


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def concurrently(jobs: list[Callable[[], Sample]], runs: int) -> list[Sample]:
    """Each job ``runs`` times, the jobs at once (one thread each)."""
    samples: list[Sample] = []
    lock = threading.Lock()

    def one(job: Callable[[], Sample]) -> None:
        for _ in range(runs):
            sample = job()
            with lock:
                samples.append(sample)

    threads = [threading.Thread(target=one, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return samples


def bench(repo: Path, item: Bench, runs: int, rows: list[list[str]]) -> None:
    import secrets

    from hybrid import deps
    from hybrid.policy import SandboxSpec, for_workstation
    from hybrid.workstation import backend
    from hybrid.workstation.docker import client
    from hybrid.workstation.images import BASE_IMAGE

    engine = backend()
    spec = for_workstation(SandboxSpec(tier="docker"))
    token = secrets.token_hex(4)
    image = fresh_image(BASE_IMAGE, token)
    made: list[Any] = []
    layer_ref = None
    saved_cache = os.environ.get("HYBRID_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="hybrid-bench-") as work:
        try:
            checkout = export(repo, Path(work) / "repo")
            twin = Path(work) / "twin"
            shutil.copytree(checkout, twin, symlinks=True)
            os.environ["HYBRID_CACHE_DIR"] = str(Path(work) / "cache")
            start = time.monotonic()
            first = deps.up(engine, checkout, spec, image=image)
            cold = time.monotonic() - start
            made.append(first)
            record = deps.installed(first)
            layer_ref = record.layer
            host_cold = host_venv(checkout, record.manifest, Path(work) / "venv")
            first.remove()
            warm = []
            for _ in range(runs):
                start = time.monotonic()
                ws = deps.up(engine, checkout, spec, image=image)
                warm.append(time.monotonic() - start)
                made.append(ws)
            for other in made[1:-1]:
                other.remove()
            keep = made[-1]
            extra = deps.up(engine, checkout, spec, image=image)  # the second of two at once
            made.append(extra)
            add = rows.append
            add(
                [
                    item.name,
                    "setup cold",
                    f"{cold:.1f}",
                    "",
                    f"{host_cold:.1f}",
                    f"{cold / host_cold:.2f}x",
                    "",
                    "",
                    "",
                    "",
                    "",
                ]
            )
            add(
                [
                    item.name,
                    "setup warm (cache hit)",
                    f"{pct(warm, 0.5):.1f}",
                    f"{pct(warm, 0.95):.1f}",
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                ]
            )
            commands = [("test", item.test)]
            if item.typecheck and keep.exec(["python", "-c", "import mypy"]).exit_code == 0:
                commands.append(("typecheck", item.typecheck))
            for label, command in commands:
                host_command = command.replace("/tmp/mypy", f"{work}/mypy")
                venv = Path(work) / "venv"
                host = [run_host(venv, checkout, host_command) for _ in range(runs)]
                # Two at once on the host too, each in its own copy: the same load both sides.
                host_two = concurrently(
                    [partial(run_host, venv, tree, host_command) for tree in (checkout, twin)],
                    runs,
                )
                one = [run_in(keep, command) for _ in range(runs)]
                two = concurrently([partial(run_in, ws, command) for ws in (keep, extra)], runs)
                for concurrency, samples, on_host in (("1", one, host), ("2", two, host_two)):
                    walls = [s.wall for s in samples]
                    host_p50 = pct([s.wall for s in on_host], 0.5)
                    add(
                        [
                            item.name,
                            f"{label} x{concurrency}"
                            + ("" if all(s.ok for s in samples) else " (FAILED)"),
                            f"{pct(walls, 0.5):.1f}",
                            f"{pct(walls, 0.95):.1f}",
                            f"{host_p50:.1f}" + ("" if all(s.ok for s in on_host) else "!"),
                            f"{pct(walls, 0.5) / host_p50:.2f}x",
                            f"{statistics.median(s.cpu for s in samples):.1f}",
                            f"{statistics.median(s.peak_mb for s in samples):.0f}",
                            f"{statistics.median(s.failcnt for s in samples):.0f}",
                            f"{statistics.median(s.psi_mem for s in samples):.2f}",
                            f"{statistics.median(s.psi_io for s in samples):.2f}",
                        ]
                    )
            print(f"{item.name}: done", file=sys.stderr, flush=True)
        finally:
            for ws in made:
                with contextlib.suppress(Exception):
                    ws.remove()
            if saved_cache is None:
                os.environ.pop("HYBRID_CACHE_DIR", None)
            else:
                os.environ["HYBRID_CACHE_DIR"] = saved_cache
            api = client().api
            for ref in (layer_ref, image):
                if ref:
                    with contextlib.suppress(Exception):
                        api.remove_image(ref, force=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repos", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    rows: list[list[str]] = []
    for item in BENCHES:
        if args.only and item.name not in args.only:
            continue
        repo = args.repos / item.github.replace("/", "+") / "repo"
        if not repo.exists():
            print(f"{item.name}: no {repo}, skipped", file=sys.stderr)
            continue
        bench(repo, item, args.runs, rows)
    header = [
        "project",
        "step",
        "ws p50 s",
        "ws p95 s",
        "host p50 s",
        "ratio",
        "cpu s",
        "peak MiB",
        "mem limit hits",
        "mem stall s*",
        "io stall s*",
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(
        "\n* machine-wide /proc/pressure 'some' stall while the command ran (cgroup v1 has none per group)"
    )
    print(f"runs per cell: {args.runs}; 2 cores shared with other work: quote medians")


if __name__ == "__main__":
    main()
