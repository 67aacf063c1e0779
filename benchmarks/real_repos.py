"""Real fix-commit validation across public projects: the fraction that validates, and why not.

    PYTHONPATH=. python3 benchmarks/real_repos.py --repos DIR [--per-project 6] [--json OUT]

``DIR`` holds git repositories (bare or not) fetched for evaluation, one per project, found as
``DIR/OWNER+NAME/repo`` or ``DIR/NAME``; none of their code is part of this project. Commits
are mined newest first: a bug fix (by its subject, which names no other platform and does not
lead with adding tests; not by a bot) that changes test files and source code, touches no
dependency declaration (so one installed environment serves the project), and is small. Each
is validated with ``hybrid.validate.validate`` in a workstation at its parent with the
project's dependencies admitted and installed offline (the install layer is cached, so
repeats of one project start in seconds). One table: per project, sampled, validated, and the
failure classes of the rest.

``--also-image TAG`` (repeatable, Python projects) is a CI matrix: a commit that does not
validate on the default image (Debian's Python 3.11) is validated again on each of these in
turn, such as ``hybrid image bootstrap --suite trixie`` (3.13) and ``--suite forky`` (3.14), for
fixes of behaviour only a newer interpreter shows. A commit that today's packages cannot run at
all is validated again with the packages it names as of its date (``validate`` does that). The
table counts both apart.

``--gate`` then puts each validated commit's real fix through the review gate with plain flags,
as a person would: a clone at the parent with the commit's test changes committed (the task),
the commit's source change as the patch, ``hybrid gate --test "<runner> <the commit's test
files>"`` (the Node image for a Node project, as validate has it). A second table: per project,
validated, ready, blocked and the gate's verdict time (median, p50 over all; the dependency
layer is warm: validate made it).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import signal
import sys
import time
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel

from hybrid import git


class Project(BaseModel):
    name: str
    github: str
    source: str = ""  # the source directory a fix must touch
    tests: str = "tests/"
    until: str | None = None
    test_command: str | None = None
    any_subject: bool = False  # every commit changing source and tests, not only "fix ..." ones
    # "first": the sample whose misses the mining rules were written from (session 6);
    # "fresh": projects added after those rules, never looked at before their run (session 14);
    # "third": the same, added in session 16 after the harness's last change from a miss;
    # "fourth": the same, added in session 17 with the mining rules that ask for test code
    # and no speed-up in the subject;
    # "fifth": the same, with the rule against spelling fixes that the fourth's run showed;
    # "sixth": the same, after the harness fixes the fifth's run showed (entry points, cache).
    # "seventh": the same, chosen for issue 30 (the gate on never-seen projects) before any run;
    # the Node one was chosen for having a lockfile and a mocha/jest/tap runner.
    sample: str = "first"
    node: bool = False  # a Node project: the node image, no --also-image


PROJECTS = [
    Project(name="humanize", github="python-humanize/humanize", source="src/"),
    Project(
        name="more-itertools", github="more-itertools/more-itertools", source="more_itertools/"
    ),
    Project(name="tomlkit", github="python-poetry/tomlkit", source="tomlkit/"),
    Project(name="click", github="pallets/click", source="src/"),
    Project(name="dateutil", github="dateutil/dateutil", tests=""),
    Project(name="requests", github="psf/requests", source="src/"),
    # Jest era (node 18, CommonJS): the later node --test / ESM-only history needs node >= 20.
    Project(
        name="commander",
        github="tj/commander.js",
        source="lib/",
        until="3dd60861",
        any_subject=True,
        test_command="jest --ci --silent",  # the test file follows: no array option before it
    ),
    Project(name="attrs", github="python-attrs/attrs", source="src/", sample="fresh"),
    Project(name="jinja", github="pallets/jinja", source="src/", sample="fresh"),
    Project(name="packaging", github="pypa/packaging", source="src/", sample="fresh"),
    Project(
        name="pluggy", github="pytest-dev/pluggy", source="src/", tests="testing/", sample="fresh"
    ),
    Project(name="sqlparse", github="andialbrecht/sqlparse", source="sqlparse/", sample="fresh"),
    Project(
        name="marshmallow", github="marshmallow-code/marshmallow", source="src/", sample="fresh"
    ),
    Project(name="structlog", github="hynek/structlog", source="src/", sample="third"),
    Project(name="cachetools", github="tkem/cachetools", source="src/", sample="third"),
    Project(name="tenacity", github="jd/tenacity", source="tenacity/", sample="third"),
    Project(name="pyparsing", github="pyparsing/pyparsing", source="pyparsing/", sample="third"),
    Project(name="boltons", github="mahmoud/boltons", source="boltons/", sample="third"),
    Project(name="arrow", github="arrow-py/arrow", source="arrow/", sample="fourth"),
    Project(name="loguru", github="Delgan/loguru", source="loguru/", sample="fourth"),
    Project(
        name="pyflakes",
        github="PyCQA/pyflakes",
        source="pyflakes/",
        tests="pyflakes/test/",
        sample="fourth",
    ),
    Project(
        name="markdown", github="Python-Markdown/markdown", source="markdown/", sample="fourth"
    ),
    Project(
        name="jsonschema",
        github="python-jsonschema/jsonschema",
        source="jsonschema/",
        tests="jsonschema/tests/",
        sample="fourth",
    ),
    Project(name="werkzeug", github="pallets/werkzeug", source="src/", sample="fifth"),
    Project(name="pyjwt", github="jpadilla/pyjwt", source="jwt/", sample="fifth"),
    Project(name="dotenv", github="theskumar/python-dotenv", source="src/", sample="fifth"),
    Project(
        name="markdown-it",
        github="executablebooks/markdown-it-py",
        source="markdown_it/",
        sample="fifth",
    ),
    Project(name="isort", github="PyCQA/isort", source="isort/", sample="fifth"),
    Project(name="cattrs", github="python-attrs/cattrs", source="src/", sample="sixth"),
    Project(
        name="h11", github="python-hyper/h11", source="h11/", tests="h11/tests/", sample="sixth"
    ),
    Project(name="mako", github="sqlalchemy/mako", source="mako/", tests="test/", sample="sixth"),
    Project(name="platformdirs", github="tox-dev/platformdirs", source="src/", sample="sixth"),
    Project(name="w3lib", github="scrapy/w3lib", source="w3lib/", sample="sixth"),
    Project(
        name="tabulate",
        github="astanin/python-tabulate",
        source="tabulate/",
        tests="test/",
        sample="seventh",
    ),
    Project(name="wcmatch", github="facelessuser/wcmatch", source="wcmatch/", sample="seventh"),
    Project(
        name="glom", github="mahmoud/glom", source="glom/", tests="glom/test/", sample="seventh"
    ),
    Project(
        name="pycodestyle",
        github="PyCQA/pycodestyle",
        source="pycodestyle.py",
        tests="",
        sample="seventh",
    ),
    Project(name="prettytable", github="jazzband/prettytable", source="src/", sample="seventh"),
    # Before its package-lock.json was removed (b24c6774): the lockfile is what installs offline.
    Project(
        name="ejs",
        github="mde/ejs",
        source="lib/",
        tests="test/",
        until="b24c6774^",
        sample="seventh",
        node=True,
    ),
]
_FIX = re.compile(
    r"\b(fix(es|ed)?|bug|issue|regression|wrong|incorrect|crash|broken|error|handle|correct)",
    re.IGNORECASE,
)
# A change that keeps behaviour by definition: nothing its tests check fails at the parent.
_NOT_A_FIX = re.compile(
    r"\b(typos?|spelling|pep8|lint|coverage|revert|reformat|perf|performance|speed ?up|optimi[sz]\w*)\b",
    re.IGNORECASE,
)
# A Linux workstation cannot show a fix for another platform failing at its parent.
_OTHER_PLATFORM = re.compile(r"\b(windows|win32|macos|mac os|darwin|osx|cygwin|msys)\b", re.I)
# A subject that leads with adding tests: code already right, nothing fails at the parent.
_ADDS_TESTS = re.compile(r"^\s*(add|adds|added|more|extra)\b[^,;:]*\btests?\b", re.I)
_DEPENDENCY_FILES = re.compile(
    r"(^|/)(pyproject\.toml|setup\.py|setup\.cfg|requirements[^/]*\.txt|tox\.ini|noxfile\.py|"
    r"uv\.lock|poetry\.lock|package\.json|package-lock\.json|npm-shrinkwrap\.json)$"
)
_DOCS = re.compile(
    r"(\.(md|rst|txt)$|^docs?/|^changelog|^CHANGES|^NEWS|^HISTORY|^\.github/)", re.IGNORECASE
)


def locate(root: Path, project: Project) -> Path | None:
    for candidate in (root / project.github.replace("/", "+") / "repo", root / project.name):
        if candidate.exists():
            return candidate
    return None


def mine(repo: Path, project: Project, limit: int, scan: int = 4000) -> list[str]:
    """The newest ``limit`` small bug-fix commits that change tests and source, nothing else."""
    from hybrid.validate import is_test

    head = project.until or "HEAD"
    fields = "--format=%H%x00%s%x00%an"  # sha, subject, author
    log = git.run(
        ["log", "--no-merges", "-n", str(scan), fields, head], repo, text=True, check=True
    ).stdout
    picked: list[str] = []
    for line in log.splitlines():
        sha, subject, author = line.split("\0")
        if author.endswith("[bot]"):  # formatting and dependency bumps, never a fix to validate
            continue
        if not (project.any_subject or _FIX.search(subject)) or any(
            rule.search(subject) for rule in (_NOT_A_FIX, _OTHER_PLATFORM, _ADDS_TESTS)
        ):
            continue
        stat = git.run(
            ["diff", "--numstat", "--no-renames", f"{sha}^", sha], repo, text=True
        ).stdout
        rows = [r.split("\t") for r in stat.splitlines() if r.count("\t") == 2]
        if not rows or len(rows) > 8:
            continue
        paths = [r[2] for r in rows]
        lines = sum(int(r[0]) + int(r[1]) for r in rows if r[0].isdigit() and r[1].isdigit())
        if lines > 400 or any(_DEPENDENCY_FILES.search(p) for p in paths):
            continue
        tests = [p for p in paths if is_test(p) and p.startswith(project.tests)]
        source = [
            p
            for p in paths
            if not is_test(p)
            and p.startswith(project.source)
            and PurePosixPath(p).suffix in (".py", ".js")
        ]
        other = [p for p in paths if p not in tests and p not in source and not _DOCS.search(p)]
        if tests and source and not other and adds_test_code(repo, sha, tests):
            picked.append(sha)
            if len(picked) == limit:
                break
    return picked


_COMMENT = re.compile(r"(#|//).*$|/\*.*?\*/")
_MARKER = re.compile(r"xfail|skip|\.todo\b|\.failing\b")  # pytest, unittest, jest


def adds_test_code(repo: Path, sha: str, tests: list[str]) -> bool:
    """Whether the commit's test change can fail at the parent: it adds test code or lifts an
    expected failure. A change of comments or whitespace only, or one that only removes
    tests, has nothing that could."""
    if all(_same_python(repo, sha, path) for path in tests):
        return False  # comments, layout, trailing commas: the same syntax tree
    diff = git.run(
        ["diff", "-U0", "--no-renames", f"{sha}^", sha, "--", *tests], repo, text=True
    ).stdout
    added: Counter[str] = Counter()
    for line in diff.splitlines():
        if line[:1] in "+-" and not line.startswith(("+++", "---")):
            code = "".join(_COMMENT.sub("", line[1:]).split())
            if code:
                added[code] += 1 if line[0] == "+" else -1
    return any(n > 0 or _MARKER.search(code) for code, n in added.items() if n)


def _same_python(repo: Path, sha: str, path: str) -> bool:
    """Whether a Python file has the same syntax tree before and after ``sha``."""
    if not path.endswith(".py"):
        return False
    trees = []
    for rev in (f"{sha}^", sha):
        shown = git.run(["show", f"{rev}:{path}"], repo)
        try:
            trees.append(ast.dump(ast.parse(shown.stdout)) if shown.returncode == 0 else None)
        except (SyntaxError, ValueError):
            return False
    return trees[0] is not None and trees[0] == trees[1]


def shared_layer(repo: Path, commit: str, image: str) -> str:
    """The dependency layer of ``commit``'s parent (made once, then a cache hit)."""
    import tempfile

    from hybrid import deps
    from hybrid.validate import export

    with tempfile.TemporaryDirectory(prefix="hybrid-bench-") as work:
        checkout = Path(work) / "repo"
        export(repo, f"{commit}^", checkout)
        return deps.prepare(checkout, image=image).layer.ref


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repos", type=Path, required=True)
    parser.add_argument("--per-project", type=int, default=5)
    parser.add_argument("--only", nargs="*", help="Project names to run (default: all found).")
    parser.add_argument("--json", type=Path, help="Write every Validation here (JSON lines).")
    parser.add_argument("--timeout", type=float, default=300, help="Seconds per test run.")
    parser.add_argument(
        "--also-image",
        action="append",
        default=[],
        metavar="TAG",
        help="Validate a commit that misses on the default image again on this one (repeatable).",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="Reuse the --json file's verdicts for the commits mined again.",
    )
    parser.add_argument(
        "--table", type=Path, nargs="+", help="Only print the table of earlier --json files."
    )
    parser.add_argument(
        "--gate",
        action="store_true",
        help="Put each validated commit's real fix through the review gate (plain flags).",
    )
    args = parser.parse_args()
    # A stopped run still removes its workstation: SIGTERM unwinds through validate's finally.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.table:
        rows = [json.loads(line) for path in args.table for line in path.read_text().splitlines()]
        table_of(rows)
        gate_table(rows)
        return

    from hybrid.errors import HybridError
    from hybrid.validate import validate
    from hybrid.workstation.images import BASE_IMAGE, profile_tag

    records: list[dict[str, Any]] = []
    if args.resume and args.json and args.json.exists():
        records = [json.loads(line) for line in args.json.read_text().splitlines()]
    done = {r["commit"] for r in records}
    mined: set[str] = set()
    projects: set[str] = set()  # the projects mined this run
    out = args.json.open("a") if args.json else None
    for project in PROJECTS:
        if args.only and project.name not in args.only:
            continue
        repo = locate(args.repos, project)
        if repo is None:
            print(f"{project.name}: not found under {args.repos}, skipped", file=sys.stderr)
            continue
        commits = mine(repo, project, args.per_project)
        mined.update(commits)
        projects.add(project.name)
        node = project.node or project.github == "tj/commander.js"
        base = profile_tag("node") if node else BASE_IMAGE
        # One installed environment per project, from the newest sampled commit's parent; a
        # commit that misses on it is retried with its own (an older checkout can need older
        # test tools: the shared environment is a speed-up and must not change a verdict).
        shared = None
        try:
            todo = [c for c in commits if c not in done]
            shared = shared_layer(repo, commits[0], base) if todo else None
        except HybridError as exc:  # each commit then tries its own, and says why
            print(f"{project.name}: no shared layer: {str(exc)[:200]}", file=sys.stderr)
        seconds = []
        for sha in commits:
            if sha in done:
                continue
            start = time.monotonic()
            options = {"test_command": project.test_command, "timeout": args.timeout}
            # On the shared layer, no other Python: that is the second call's, with its own deps.
            result = validate(
                repo,
                sha,
                image=shared or base,
                deps=shared is None,
                interpreters=[] if shared else None,
                **options,
            )
            if not result.validated and shared:
                result = validate(repo, sha, image=base, **options)
            also = None
            for other in [] if node else args.also_image:
                if result.validated:
                    break
                retry = validate(repo, sha, image=other, **options)
                if retry.validated:
                    result, also = retry, other
            seconds.append(time.monotonic() - start)
            verdict = "ok" if result.validated else f"{result.failure}: {result.reason[:120]}"
            print(
                f"{project.name} {sha[:10]} {seconds[-1]:5.1f}s f2p={len(result.fail_to_pass)} "
                f"p2p={len(result.pass_to_pass)} {verdict}  ({result.subject[:60]})"
                + (f" on {also}" if also else "")
                + (f" as of {result.exclude_newer:%Y-%m-%d}" if result.exclude_newer else ""),
                flush=True,
            )
            record = {
                "project": project.name,
                "wall": seconds[-1],
                "also_image": also,
                **result.model_dump(mode="json"),
            }
            records.append(record)
            if out:
                out.write(json.dumps(record) + "\n")
                out.flush()

    # A resumed file can hold commits that today's mining rules no longer pick: they leave it.
    records = [r for r in records if r["commit"] in mined or r["project"] not in projects]
    if args.gate:
        by_name = {p.name: p for p in PROJECTS}
        for record in records:
            project = by_name.get(record["project"])
            if not record["validated"] or "gate" in record or project is None:
                continue
            if record["project"] not in projects and args.only:
                continue
            repo = locate(args.repos, project)
            if repo is None:
                continue
            node = project.node or project.github == "tj/commander.js"
            record["gate"] = gate_fix(
                repo,
                record,
                image=profile_tag("node") if node else None,
                test_command=project.test_command,
            )
            verdict = record["gate"]["disposition"]
            why = "; ".join(record["gate"]["reasons"])[:160]
            print(
                f"gate {project.name} {record['commit'][:10]} {record['gate']['seconds']:5.1f}s "
                f"{verdict}{': ' + why if why else ''}",
                flush=True,
            )
            if out:  # the file is rewritten below with every record's gate result
                out.flush()
    if out:
        out.close()
        kept = args.json.with_suffix(".tmp")
        kept.write_text("".join(json.dumps(r) + "\n" for r in records))
        kept.replace(args.json)
    table_of(records)
    gate_table(records)


def gate_fix(
    repo: Path, record: dict[str, Any], *, image: str | None, test_command: str | None
) -> dict[str, Any]:
    """The gate's verdict on the commit's own source change, in a clone at its parent holding
    the commit's test changes (the task): plain flags, the commit's test files as the test."""
    import tempfile

    from hybrid.agent.gate import gate
    from hybrid.validate import _Runner

    commit, parent = record["commit"], record["parent"]
    env = {
        "PATH": "/usr/bin:/bin",
        "GIT_AUTHOR_NAME": "bench",
        "GIT_AUTHOR_EMAIL": "bench@hybrid.invalid",
        "GIT_COMMITTER_NAME": "bench",
        "GIT_COMMITTER_EMAIL": "bench@hybrid.invalid",
    }

    def git(cwd: Path, *args: str) -> str:
        return subprocess.run(
            ["git", "-c", "core.hooksPath=/dev/null", *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    with tempfile.TemporaryDirectory(prefix="hybrid-bench-gate-") as work:
        clone = Path(work) / "repo"
        git(Path(work), "clone", "-q", "--no-checkout", "--shared", str(repo), str(clone))
        git(clone, "checkout", "-q", "-B", "task", parent)
        # The task: the parent with the commit's test changes (its new tests fail here).
        present = git(clone, "ls-tree", "-r", "--name-only", commit, "--", *record["tests"])
        kept = [p for p in record["tests"] if p in present.splitlines()]
        gone = [p for p in record["tests"] if p not in kept]
        if kept:
            git(clone, "checkout", "-q", commit, "--", *kept)
        if gone:
            git(clone, "rm", "-q", "--ignore-unmatch", "--", *gone)
        git(clone, "commit", "-q", "--allow-empty", "-m", "the task's tests")
        patch = git(clone, "diff", "--binary", parent, commit, "--", *record["source"])
        runner = _Runner.for_checkout(clone, test_command, None)
        files = [p for p in kept if runner.runs(p)]
        base = runner.command.split(" -o junit_family")[0].split(" --json")[0]
        command = f"{base} {' '.join(files)}"
        start = time.monotonic()
        report = gate(patch, clone, test=command, image=image)
        seconds = time.monotonic() - start
    return {
        "disposition": report.disposition,
        "reasons": report.reasons,
        "seconds": seconds,
        "command": command,
    }


def gate_table(records: list[dict[str, Any]]) -> None:
    """Per project: validated commits, how many the gate says ready with plain flags, and the
    verdict time (median per project, p50 over all)."""
    gated = [r for r in records if r.get("gate")]
    if not gated:
        return
    print()
    header = ["project", "validated", "gated", "ready", "blocked", "median s/verdict"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    projects: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if record["validated"]:
            projects.setdefault(record["project"], []).append(record)
    for name, rows in projects.items():
        done = [r for r in rows if r.get("gate")]
        ready = sum(1 for r in done if r["gate"]["disposition"].startswith("ready"))
        seconds = sorted(r["gate"]["seconds"] for r in done)
        median = f"{seconds[len(seconds) // 2]:.1f}" if seconds else ""
        cells = [name, len(rows), len(done), ready, len(done) - ready, median]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    ready = sum(1 for r in gated if r["gate"]["disposition"].startswith("ready"))
    seconds = sorted(r["gate"]["seconds"] for r in gated)
    print()
    print(
        f"gate: ready {ready}/{len(gated)} = {ready / len(gated):.1%} of validated commits "
        f"(target >= 95%); verdict p50 {seconds[len(seconds) // 2]:.1f}s, "
        f"max {seconds[-1]:.1f}s (warm layer; shared, noisy machine)"
    )
    for record in gated:
        if not record["gate"]["disposition"].startswith("ready"):
            why = "; ".join(record["gate"]["reasons"])[:200]
            print(f"- gate {record['project']} {record['commit'][:10]}: {why}")


def table_of(records: list[dict[str, Any]]) -> None:
    """One table: per project, sampled, validated and the failure classes of the rest, with a
    total for each sample (the one the mining rules were written from, and the fresh one)."""
    from hybrid.validate import FAILURES

    samples = {p.name: p.sample for p in PROJECTS}
    projects: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        projects.setdefault(record["project"], []).append(record)
    header = ["project", "sample", "sampled", "validated", "of them on --also-image", "as of date"]
    header += [*FAILURES, "median s/commit"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    totals: dict[str, tuple[int, int, Counter[str]]] = {}
    for name, rows in projects.items():
        classes = Counter(r["failure"] or "other" for r in rows if not r["validated"])
        good = sum(1 for r in rows if r["validated"])
        seconds = sorted(r.get("wall", 0.0) for r in rows)
        sample = samples.get(name, "?")
        sampled, ok, total = totals.get(sample, (0, 0, Counter()))
        totals[sample] = (sampled + len(rows), ok + good, total + classes)
        also = sum(1 for r in rows if r["validated"] and r.get("also_image"))
        dated = sum(1 for r in rows if r["validated"] and r.get("exclude_newer"))
        cells = [name, sample, str(len(rows)), str(good), str(also), str(dated)]
        cells += [str(classes.get(f, 0)) for f in FAILURES]
        print("| " + " | ".join([*cells, f"{seconds[len(seconds) // 2]:.0f}"]) + " |")
    for sample, (sampled, ok, total) in totals.items():
        cells = [
            "total",
            sample,
            str(sampled),
            str(ok),
            "",
            "",
            *(str(total.get(f, 0)) for f in FAILURES),
        ]
        print("| " + " | ".join([*cells, ""]) + " |")
    print()
    for sample, (sampled, ok, _) in totals.items():
        print(f"{sample}: validated {ok}/{sampled} = {ok / sampled:.1%} (target >= 90% of >= 30)")
    sampled = sum(t[0] for t in totals.values())
    ok = sum(t[1] for t in totals.values())
    caught = sampled - sum(t[2]["passes_at_parent"] for t in totals.values())
    if sampled:
        print(f"all: validated {ok}/{sampled} = {ok / sampled:.1%}; of the commits whose own tests")
        print(f"  fail at their parent: {ok}/{caught} = {ok / max(caught, 1):.1%}")
    for record in records:
        if not record["validated"]:
            print(
                f"- {record['project']} {record['commit'][:10]}: {record['failure']}: "
                f"{record['reason'][:160]}"
            )


if __name__ == "__main__":
    main()
