"""Repo map build time and memory: hybrid vs aider's RepoMap vs universal-ctags.

For each repository (a private ``git clone`` of it, so nothing touches the original):

* cold: empty caches (hybrid's tag cache, aider's ``.aider.tags.cache.v4``);
* warm: the same command again, nothing changed;
* one file changed: one source file edited, then the command again;

each as a whole process (interpreter start-up included), with the peak memory of the whole
process tree: the sum of the processes' proportional set sizes (PSS, so pages a process pool
shares after fork() count once), sampled from /proc every 10 ms. aider runs from its own virtualenv as a library (RepoMap with a
4-characters-per-token counter, no model, PYTHONHASHSEED fixed); ``ctags -R`` has no cache
and no ranking, so only its cold time is meaningful.

    python benchmarks/repo_map.py --repo /tmp/click --repo /tmp/sympy \
        --aider-python /tmp/aider-venv/bin/python

Prints one markdown table (medians over --runs; cold runs once per repository and tool
unless --cold-runs says otherwise).

``--localization REPO`` (repeatable) adds a second table: file-level Acc@1 / Acc@5 / MRR on
the repository's own bug-fix commits (the cases of ``hybrid context eval``) for hybrid's
ranking modes and for aider's RepoMap ranking, given the commit message the way aider's
coder would (identifiers and file names mentioned):

    python benchmarks/repo_map.py --localization /tmp/flask --localization /tmp/click
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
from pathlib import Path

from hybrid import git

AIDER_DRIVER = r"""
import os, subprocess, sys
from aider.io import InputOutput
from aider.repomap import RepoMap

class Model:
    def token_count(self, text):
        return (len(text) + 3) // 4

root = os.path.abspath(sys.argv[1])
listing = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True).stdout
files = [os.path.join(root, f) for f in listing.split("\n") if f]
io = InputOutput(pretty=False, yes=True, fancy_input=False)
rm = RepoMap(map_tokens=int(sys.argv[2]), root=root, main_model=Model(), io=io)
out = rm.get_repo_map([], files) or ""
sys.stdout.write(out)
"""


AIDER_LOCALIZE = r"""
import json, os, re, subprocess, sys
from collections import defaultdict
from pathlib import Path
from aider.io import InputOutput
from aider.repomap import RepoMap

class Model:
    def token_count(self, text):
        return (len(text) + 3) // 4

worktree, cases = sys.argv[1], json.load(open(sys.argv[2]))
io = InputOutput(pretty=False, yes=True, fancy_input=False)
out = []
for case in cases:
    subprocess.run(["git", "-C", worktree, "checkout", "-q", "--detach", "--force", case["parent"]], check=True)
    listing = subprocess.run(["git", "-C", worktree, "ls-files"], capture_output=True, text=True).stdout
    rel = [f for f in listing.split("\n") if f]
    files = [os.path.join(worktree, f) for f in rel]
    # what aider's coder does with a chat message: identifiers and file mentions
    idents = set(re.split(r"\W+", case["task"]))
    by_stem = defaultdict(set)
    for f in rel:
        stem = Path(f).stem.lower()
        if len(stem) >= 5:
            by_stem[stem].add(os.path.join(worktree, f))
    words = {w.strip("\"'`*_").rstrip(",.!;:?") for w in case["task"].split()}
    mentioned = {os.path.join(worktree, f) for f in rel if f in words or os.path.basename(f) in words}
    for ident in idents:
        if len(ident) >= 5:
            mentioned |= by_stem.get(ident.lower(), set())
    rm = RepoMap(map_tokens=1024, root=worktree, main_model=Model(), io=io)
    ranked = rm.get_ranked_tags([], files, mentioned, idents)
    order = []
    for tag in ranked:
        name = tag[0]
        if name not in order:
            order.append(name)
    ranks = [order.index(g) + 1 for g in case["gold"] if g in order]
    out.append(min(ranks) if ranks else 0)
json.dump(out, open(sys.argv[3], "w"))  # not stdout: aider prints progress there
"""


def localization(repo: Path, limit: int, aider_python: str | None) -> list[list[str]]:
    """Acc@1 / Acc@5 / MRR on the repo's bug-fix history: hybrid's modes and aider's ranking."""
    from hybrid.context.evaluation import evaluate, mine_cases

    report = evaluate(repo, limit)
    rows = []
    labels = {
        "fused": "hybrid (PPR + BM25)",
        "bm25": "hybrid BM25 only",
        "graph": "hybrid graph only",
    }
    for mode, m in report.metrics.items():
        rows.append(
            [
                repo.name,
                str(report.cases),
                labels[mode],
                f"{m.acc_at_1:.2f}",
                f"{m.acc_at_5:.2f}",
                f"{m.mrr:.3f}",
            ]
        )
    if aider_python and Path(aider_python).exists():
        import json

        cases = mine_cases(repo, limit)
        work = Path(tempfile.mkdtemp(prefix="hybrid-loc-"))
        pin = contextlib.ExitStack()
        pin.enter_context(git.pinned(repo))
        try:
            worktree = work / "wt"
            # Registered in hybrid.git's shadow of the repository, whose config runs nothing:
            # the aider driver's own git calls in the worktree read that config too.
            git.run(
                ["worktree", "add", "--detach", "--quiet", str(worktree), cases[0].parent],
                repo,
                check=True,
            )
            (work / "cases.json").write_text(json.dumps([c.model_dump() for c in cases]))
            (work / "driver.py").write_text(AIDER_LOCALIZE)
            env = dict(os.environ, PYTHONHASHSEED="0")
            out = subprocess.run(
                [
                    aider_python,
                    str(work / "driver.py"),
                    str(worktree),
                    str(work / "cases.json"),
                    str(work / "ranks.json"),
                ],
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            if out.returncode != 0:
                rows.append(
                    [
                        repo.name,
                        str(len(cases)),
                        "aider RepoMap ranking",
                        "failed",
                        out.stderr[-200:],
                        "",
                    ]
                )
            else:
                ranks = json.loads((work / "ranks.json").read_text())
                n = len(ranks) or 1
                rows.append(
                    [
                        repo.name,
                        str(len(ranks)),
                        "aider RepoMap ranking",
                        f"{sum(r == 1 for r in ranks) / n:.2f}",
                        f"{sum(1 <= r <= 5 for r in ranks) / n:.2f}",
                        f"{sum(1 / r for r in ranks if r) / n:.3f}",
                    ]
                )
        finally:
            git.run(["worktree", "remove", "--force", str(work / "wt")], repo)
            shutil.rmtree(work, ignore_errors=True)
            pin.close()
    return rows


def _pss(pid: int) -> int:
    """Proportional set size of one process (shared pages split between their users)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _tree_pids(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(children.get(p, []))
    return sorted(out)


def _tree_memory(pid: int) -> int | None:
    """Memory of ``pid`` and all its descendants: the sum of their proportional set sizes,
    so pages shared after fork() (a process pool) are counted once. None when the tree
    changed while it was read: a parent read before a fork() and its children read after
    it would count the shared pages one and a half times (on a loaded machine the walk
    over /proc is slow enough for that to happen; it once reported 231 MB for 139)."""
    pids = _tree_pids(pid)
    total = sum(_pss(p) for p in pids)
    return total if _tree_pids(pid) == pids else None


def measure(
    cmd: list[str], env: dict[str, str], cwd: str | None = None
) -> tuple[float, float, int, float]:
    """(wall seconds, peak MB, exit code, CPU seconds incl. waited children) of one process."""
    errors = tempfile.TemporaryFile()  # noqa: SIM115  (a file, not a pipe: a chatty child never blocks)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=errors)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_memory(proc.pid) or 0)
            done.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    errors.seek(0)
    stderr = errors.read().decode(errors="replace")
    errors.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        print(
            f"warning: {' '.join(cmd[:3])} exited {proc.returncode}: {stderr[-300:]}",
            file=sys.stderr,
        )
    # a process that ends between two samples still reports its own peak through wait4
    peak = max(peak, usage.ru_maxrss * 1024 if peak == 0 else 0)
    return wall, peak / 1e6, proc.returncode, usage.ru_utime + usage.ru_stime


def _edit_target(root: Path) -> Path:
    """A mid-sized tracked Python (or any source) file, chosen deterministically."""
    listing = git.run(["ls-files"], root, text=True, check=True)
    files = [
        f
        for f in listing.stdout.split()
        if f.endswith((".py", ".js", ".ts", ".go", ".rs", ".java", ".c", ".rb"))
    ]
    files = [f for f in files if "test" not in f]
    sized = sorted(files, key=lambda f: ((root / f).stat().st_size, f))
    return root / sized[len(sized) // 2]


def bench_repo(repo: Path, args: argparse.Namespace) -> list[list[str]]:
    rows: list[list[str]] = []
    work = Path(tempfile.mkdtemp(prefix="hybrid-bench-"))
    clone = work / repo.name
    # A local clone reads the source's objects, not its config; the clone is hybrid's own.
    clone_argv = ["-c", "protocol.file.allow=always", "clone", "--quiet", str(repo), str(clone)]
    git.run_own(clone_argv, cwd=work, check=True)
    n_files = len(git.run(["ls-files"], clone, text=True).stdout.split())
    target = _edit_target(clone)
    original = target.read_bytes()
    hybrid = shutil.which("hybrid")
    hybrid_cmd = (
        [hybrid] if hybrid else [sys.executable, "-c", "from hybrid.cli import main; main()"]
    )
    base_env = dict(os.environ, PYTHONHASHSEED="0")

    def edit(i: int) -> None:
        target.write_bytes(original + f"\n# benchmark edit {i}\n".encode())

    def scenario(
        name: str, cmd: list[str], env: dict[str, str], reset_cold, cold_runs: int
    ) -> list[str]:  # type: ignore[no-untyped-def]
        colds = []
        for _ in range(cold_runs):
            reset_cold()
            target.write_bytes(original)
            colds.append(measure(cmd, env))
        warm = [measure(cmd, env) for _ in range(args.runs)]
        one = []
        for i in range(args.runs):
            edit(i)
            one.append(measure(cmd, env))
        target.write_bytes(original)
        peak = max(m[1] for m in colds + warm + one)

        def med(ms: list[tuple[float, float, int, float]]) -> str:
            return f"{statistics.median(m[0] for m in ms):.2f} ({statistics.median(m[3] for m in ms):.2f})"

        return [name, med(colds), med(warm), med(one), f"{peak:.0f}"]

    # hybrid
    cache = work / "hybrid-cache"
    env = dict(base_env, HYBRID_CACHE_DIR=str(cache))
    cmd = [*hybrid_cmd, "map", str(clone), "--tokens", str(args.tokens), "--json"]
    rows.append(
        [
            repo.name,
            str(n_files),
            *scenario(
                "hybrid map",
                cmd,
                env,
                lambda: shutil.rmtree(cache, ignore_errors=True),
                args.cold_runs,
            ),
        ]
    )
    if args.task:
        cmd_t = [
            *hybrid_cmd,
            "map",
            str(clone),
            "--tokens",
            str(args.tokens),
            "--task",
            args.task,
            "--json",
        ]
        rows.append(
            [
                repo.name,
                str(n_files),
                *scenario(
                    "hybrid map --task",
                    cmd_t,
                    env,
                    lambda: shutil.rmtree(cache, ignore_errors=True),
                    args.cold_runs,
                ),
            ]
        )

    # aider
    aider_python = args.aider_python
    if aider_python and Path(aider_python).exists():
        driver = work / "aider_driver.py"
        driver.write_text(AIDER_DRIVER)
        aider_cache = clone / ".aider.tags.cache.v4"
        cmd = [aider_python, str(driver), str(clone), str(args.tokens)]
        rows.append(
            [
                repo.name,
                str(n_files),
                *scenario(
                    "aider RepoMap",
                    cmd,
                    base_env,
                    lambda: shutil.rmtree(aider_cache, ignore_errors=True),
                    1,
                ),
            ]
        )
        shutil.rmtree(aider_cache, ignore_errors=True)
    else:
        rows.append(
            [
                repo.name,
                str(n_files),
                "aider RepoMap",
                "n/a",
                "n/a",
                "n/a",
                "n/a  (no --aider-python)",
            ]
        )

    # universal-ctags: no cache, no ranking
    if shutil.which("ctags"):
        tags_out = work / "tags"
        runs = [
            measure(["ctags", "-R", "-f", str(tags_out), str(clone)], base_env)
            for _ in range(args.runs)
        ]
        wall = statistics.median(m[0] for m in runs)
        cpu = statistics.median(m[3] for m in runs)
        t = f"{wall:.2f} ({cpu:.2f})"
        peak = f"{max(m[1] for m in runs):.0f}"
        rows.append([repo.name, str(n_files), "ctags -R (unranked)", t, t, t, peak])
    shutil.rmtree(work, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--repo", action="append", default=[], help="a git checkout to time (repeatable)"
    )
    parser.add_argument(
        "--aider-python",
        default=os.environ.get("HYBRID_AIDER_PYTHON", "/tmp/aider-venv/bin/python"),
    )
    parser.add_argument("--tokens", type=int, default=1024, help="map token budget for both tools")
    parser.add_argument("--runs", type=int, default=3, help="runs per warm / one-file scenario")
    parser.add_argument("--cold-runs", type=int, default=1, help="cold runs for hybrid")
    parser.add_argument("--task", default="", help="also time `hybrid map --task TEXT`")
    parser.add_argument(
        "--localization",
        action="append",
        default=[],
        help="also score file localization on this repo's bug-fix history, hybrid vs aider (repeatable)",
    )
    parser.add_argument(
        "--limit", type=int, default=50, help="bug-fix commits per localization repo"
    )
    args = parser.parse_args()
    if args.localization:
        loc: list[list[str]] = []
        for repo in args.localization:
            loc.extend(localization(Path(repo).resolve(), args.limit, args.aider_python))
        head = ["repo", "cases", "ranking", "Acc@1", "Acc@5", "MRR"]
        print(
            "\nfile localization on bug-fix commits (message = task, changed non-test files = gold)\n"
        )
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join("---" for _ in head) + "|")
        for row in loc:
            print("| " + " | ".join(row) + " |")
    rows: list[list[str]] = []
    for repo in args.repo:
        rows.extend(bench_repo(Path(repo).resolve(), args))
        print(f"done {repo}", file=sys.stderr)
    if not rows:
        return
    header = ["repo", "files", "tool", "cold s", "warm s", "one file changed s", "peak MB"]
    print(
        f"\nrepo map build, whole process, {os.cpu_count()} cores; wall seconds (CPU seconds "
        f"incl. children); medians of {args.runs} (cold: {args.cold_runs}); "
        f"load average after the run {os.getloadavg()[0]:.1f}\n"
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    by = {(r[0], r[2]): r for r in rows}
    print()
    for repo in dict.fromkeys(r[0] for r in rows):
        h, a = by.get((repo, "hybrid map")), by.get((repo, "aider RepoMap"))
        if h and a and a[3] != "n/a":
            ratios = [float(a[k].split()[0]) / max(float(h[k].split()[0]), 1e-9) for k in (3, 4, 5)]
            print(
                f"{repo}: aider/hybrid time ratio cold {ratios[0]:.1f}x, warm {ratios[1]:.1f}x, one file {ratios[2]:.1f}x"
            )


if __name__ == "__main__":
    main()
