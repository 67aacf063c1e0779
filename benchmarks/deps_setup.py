"""Workstation setup with a project's dependencies: cold vs warm vs the host's own pip install.

    PYTHONPATH=. python3 benchmarks/deps_setup.py REPO [--test 'python -m pytest tests/test_utils.py -q']

Cold: a fresh artifact store and lock cache and no layer (pip's own HTTP cache is left as it is,
for the host run too); warm: the same project again (a cache hit). Host: ``python -m venv`` +
``pip install`` of the same requirement set through the same pip configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("repo", type=Path)
    parser.add_argument("--test", default="python -m pytest -q -p no:cacheprovider")
    parser.add_argument("--warm-runs", type=int, default=3)
    args = parser.parse_args()
    os.environ["HYBRID_CACHE_DIR"] = tempfile.mkdtemp(prefix="hybrid-bench-cache-")

    from hybrid import deps
    from hybrid.deps import layers
    from hybrid.workstation import backend
    from hybrid.workstation.docker import client
    from hybrid.workstation.images import BASE_IMAGE

    engine = backend()
    manifest = deps.plan(args.repo)
    image_id = client().api.inspect_image(BASE_IMAGE)["Id"]
    ref = f"{layers.REPOSITORY}:{layers.key_of(image_id, manifest)[:32]}"
    os.environ["HYBRID_CACHE_DIR"] = tempfile.mkdtemp(prefix="hybrid-bench-cache-")
    for row in client().api.containers(all=True, filters={"ancestor": ref}):
        sys.exit(f"{ref} is in use by {row['Names']}: not measuring a cold start")
    with contextlib.suppress(Exception):
        client().api.remove_image(ref)

    rows = []
    start = time.monotonic()
    ws = deps.up(engine, args.repo)
    cold = time.monotonic() - start
    steps = deps.installed(ws).seconds
    start = time.monotonic()
    result = ws.exec(shlex.split(args.test), timeout=1800)
    test_ws = time.monotonic() - start
    ws.remove()
    rows.append(("cold setup (lock + install + create)", cold, steps))

    warm = []
    for _ in range(args.warm_runs):
        start = time.monotonic()
        ws = deps.up(engine, args.repo)
        warm.append(time.monotonic() - start)
        assert deps.installed(ws).cache_hit
        ws.remove()

    specs = sorted({r.spec for r in manifest.requirements})
    with tempfile.TemporaryDirectory() as tmp:
        start = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", f"{tmp}/venv"], check=True)
        subprocess.run(
            [f"{tmp}/venv/bin/pip", "install", "-q", "--disable-pip-version-check", *specs],
            check=True,
        )
        host = time.monotonic() - start
        env = {**os.environ, "PYTHONPATH": ":".join(str(args.repo / p) for p in manifest.paths)}
        start = time.monotonic()
        subprocess.run(
            [f"{tmp}/venv/bin/{shlex.split(args.test)[0]}", *shlex.split(args.test)[1:]],
            cwd=args.repo,
            env=env,
            capture_output=True,
            check=False,
        )
        test_host = time.monotonic() - start

    print(
        f"project {args.repo} - {len(manifest.artifacts)} artifacts, {manifest.total_bytes / 1e6:.1f} MB"
    )
    print(f"{'measure':44} {'seconds':>8}")
    print(
        f"{'cold setup (lock + install + create)':44} {cold:8.1f}   steps: "
        + ", ".join(f"{k} {v:.1f}" for k, v in steps.items())
    )
    print(f"{'host venv + pip install of the same set':44} {host:8.1f}   ratio {cold / host:.2f}x")
    print(
        f"{'warm setup (cache hit), median':44} {statistics.median(warm):8.1f}   runs: "
        + ", ".join(f"{w:.1f}" for w in warm)
    )
    print(f"{'test command in the workstation':44} {test_ws:8.1f}   ({result.termination.value})")
    print(f"{'test command on the host':44} {test_host:8.1f}   ratio {test_ws / test_host:.2f}x")


if __name__ == "__main__":
    main()
