"""scope check on diffs made by real git and diff: renames, deletions, binaries, modes, rules."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from hybrid.checks import scope
from hybrid.errors import InvalidDiff, InvalidInput

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git to make real diffs")


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    )
    return done.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.invalid")
    git(repo, "config", "user.name", "t")
    (repo / "src" / "old_name.py").write_text("".join(f"line {i}\n" for i in range(20)))
    (repo / "src" / "gone.txt").write_text("bye\n")
    (repo / "src" / "logo.png").write_bytes(b"\x89PNG\x00\x01\x02")
    (repo / "src" / "with space.txt").write_text("hi\n")
    (repo / "README.md").write_text("readme\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "init")
    return repo


def staged_diff(repo: Path, *extra: str) -> str:
    git(repo, "add", "-A")
    return git(repo, "diff", "--cached", "-M", *extra)


def test_rename_delete_binary_mode(repo: Path) -> None:
    git(repo, "mv", "src/old_name.py", "src/new_name.py")
    with (repo / "src" / "new_name.py").open("a") as handle:
        handle.write("added\n")
    git(repo, "rm", "-q", "src/gone.txt")
    (repo / "src" / "logo.png").write_bytes(b"\x89PNG\x00\x09\x09\x09")
    (repo / "src" / "new.bin").write_bytes(b"\x00\x01")
    (repo / "src" / "with space.txt").chmod(0o755)
    (repo / "README.md").write_text("readme\nmore\n")
    for extra in ((), ("--binary",)):
        report = scope(staged_diff(repo, *extra), allow=["src", "README.md"])
        files = {f.path: f for f in report.files}
        assert report.ok and report.decision == "reviewable", report.violations
        assert files["src/new_name.py"].status == "renamed"
        assert files["src/new_name.py"].old_path == "src/old_name.py"
        assert files["src/new_name.py"].additions == 1
        assert files["src/gone.txt"].status == "deleted" and files["src/gone.txt"].deletions == 1
        assert files["src/logo.png"].binary and files["src/logo.png"].status == "modified"
        assert files["src/new.bin"].binary and files["src/new.bin"].status == "added"
        assert files["src/with space.txt"].new_mode == "100755"
        assert (files["README.md"].additions, files["README.md"].deletions) == (1, 0)
        assert report.additions == 2


def test_default_denies_name_path_and_rule(repo: Path) -> None:
    (repo / "config").mkdir()
    (repo / "config" / ".env.production").write_text("X=1\n")
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "ci.yml").write_text("on: push\n")
    (repo / "deploy.pem").write_text("cert\n")
    (repo / "poetry.lock").write_text("lock\n")
    report = scope(staged_diff(repo))
    assert report.decision == "blocked"
    rules = {v.path: v.rule for v in report.violations}
    assert rules == {
        "config/.env.production": "env-file",
        ".github/workflows/ci.yml": "ci-config",
        "deploy.pem": "credential-file",
        "poetry.lock": "lockfile",
    }
    assert all(v.path in v.message for v in report.violations)
    relaxed = scope(staged_diff(repo), allow_lockfiles=True)
    assert "poetry.lock" not in {v.path for v in relaxed.violations}


def test_rename_out_of_a_denied_path_is_blocked(repo: Path) -> None:
    (repo / ".env").write_text("SECRET=1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "env")
    git(repo, "mv", ".env", "src/settings.txt")
    report = scope(staged_diff(repo), allow=["src/"])
    assert [(v.path, v.rule) for v in report.violations] == [(".env", "env-file")]


def test_allowed_prefixes_and_extra_deny(repo: Path, hybrid_cli, tmp_path: Path) -> None:
    (repo / "docs").mkdir()
    (repo / "docs" / "a.md").write_text("a\n")
    (repo / "src" / "gone.txt").write_text("changed\n")
    patch = tmp_path / "change.diff"
    patch.write_text(staged_diff(repo))
    code, out, _ = hybrid_cli("check", "scope", str(patch), "--allow", "src", "--json")
    data = json.loads(out)
    assert code == 1 and data["decision"] == "blocked"
    assert [(v["path"], v["rule"]) for v in data["violations"]] == [
        ("docs/a.md", "outside-allowed-prefixes")
    ]
    code, out, _ = hybrid_cli("check", "scope", str(patch), "--deny", "docs/**")
    assert code == 1 and "violation: docs/a.md: denied-glob (docs/**)" in out
    code, out, _ = hybrid_cli("check", "scope", str(patch))
    assert code == 0 and out.splitlines()[-1].startswith("reviewable")


def test_plain_diff_u_with_new_file(tmp_path: Path) -> None:
    if shutil.which("diff") is None:
        pytest.skip("needs diff")
    for side, text in (("old", "a\n"), ("new", "b\n")):
        (tmp_path / side / "src").mkdir(parents=True)
        (tmp_path / side / "src" / "x.c").write_text(text)
    (tmp_path / "new" / "src" / "added.c").write_text("n\n")
    done = subprocess.run(
        ["diff", "-ruN", "old", "new"], cwd=tmp_path, capture_output=True, text=True
    )
    report = scope(done.stdout, allow=["src"])
    assert report.ok
    assert {(f.path, f.status) for f in report.files} == {
        ("src/x.c", "modified"),
        ("src/added.c", "added"),
    }


def test_path_escape_is_blocked() -> None:
    diff = "--- a/../../etc/passwd\n+++ b/../../etc/passwd\n@@ -1 +1 @@\n-root\n+evil\n"
    report = scope(diff)
    assert [v.rule for v in report.violations] == ["path-escape"]


@pytest.mark.parametrize(
    ("diff", "message"),
    [
        ("", "empty diff"),
        ("just some text\nnot a diff\n", "no file changes found"),
        ("--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n-b\n+c\n", "hunk ends early"),
        ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n+c\n", "outside any hunk"),
        ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n*b\n", "unexpected line in hunk"),
        ("--- a/x\n+++ b/x\n@@ -x +1 @@\n", "bad hunk range"),
        ("@@ -1 +1 @@\n-a\n+b\n", "hunk without"),
        ("diff --git a/x b/y\nrename from x\n", "'rename from' and 'rename to'"),
        ("diff --git a/x b/x\nGIT binary patch\nnot a block\n", "without a literal or delta block"),
        ("diff --git a/x b/x\nsomething odd\n", "unexpected line in git file header"),
        ("diff --git a/x b/x\n", "without any header or change"),
        ('diff --git "a/x" "b/x\nindex 1..2\n', "unterminated quoted path"),
    ],
)
def test_malformed_diffs(diff: str, message: str) -> None:
    with pytest.raises(InvalidDiff, match=message):
        scope(diff)


def test_malformed_diff_cli_is_one_line(hybrid_cli) -> None:
    code, out, err = hybrid_cli(
        "check", "scope", "-", stdin=b"--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n x\n"
    )
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("hybrid: error: malformed diff at line 3")


def test_an_empty_diff_is_nothing_to_review(repo: Path, hybrid_cli) -> None:
    """`git diff | hybrid check scope -` on a clean tree: exit 0 and a note, not bad input."""
    clean = subprocess.run(["git", "diff"], cwd=repo, capture_output=True, check=True).stdout
    assert clean == b""
    for stdin in (clean, b"\n  \n"):
        code, out, err = hybrid_cli("check", "scope", "-", stdin=stdin)
        assert code == 0 and out == "", (code, out, err)
        assert err == "hybrid: note: empty diff: nothing to review\n"
        code, out, err = hybrid_cli("check", "scope", "-", "--json", stdin=stdin)
        report = json.loads(out)
        assert code == 0 and report["decision"] == "empty" and report["ok"] is True
    # The library keeps refusing it unless asked: a gate must never pass an empty patch.
    with pytest.raises(InvalidDiff, match="empty diff"):
        scope("")
    assert scope("", empty_ok=True).decision == "empty"


def test_quoted_and_unicode_paths(repo: Path) -> None:
    (repo / "src" / "ünï cödé.txt").write_text("x\n")
    (repo / "src" / 'quo"te.txt').write_text("y\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "odd names")
    git(repo, "mv", "src/ünï cödé.txt", "src/rénamed file.txt")
    with (repo / "src" / 'quo"te.txt').open("a") as handle:
        handle.write("more\n")
    report = scope(staged_diff(repo), allow=["src"])
    assert report.ok
    assert {(f.path, f.old_path, f.status) for f in report.files} == {
        ('src/quo"te.txt', None, "modified"),
        ("src/rénamed file.txt", "src/ünï cödé.txt", "renamed"),
    }


def test_format_patch_series_and_log_p(repo: Path) -> None:
    (repo / "src" / "new.py").write_text("x = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "add new.py\n\n- a bullet line\n+ another one\n")
    # Newest: in `git log -p` the next commit's header follows this header-only section.
    git(repo, "mv", "src/gone.txt", "src/kept.txt")
    git(repo, "commit", "-qm", "rename only\n\n- moved")
    for text in (git(repo, "format-patch", "-2", "--stdout"), git(repo, "log", "-p", "-2")):
        report = scope(text, allow=["src"])
        assert report.ok, report.violations
        assert {(f.path, f.status) for f in report.files} == {
            ("src/kept.txt", "renamed"),
            ("src/new.py", "added"),
        }


def test_scope_and_json_take_a_path_keyword_and_refuse_a_file_name_as_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hybrid.checks import check_json, redact, scope

    monkeypatch.chdir(tmp_path)
    Path("fix.diff").write_text("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n")
    Path("doc.json").write_text('{"a": 1}\n')
    with pytest.raises(InvalidInput, match=r"pass path='fix\.diff'"):
        scope("fix.diff")
    assert [f.path for f in scope(path="fix.diff").files] == ["x.py"]
    with pytest.raises(InvalidInput, match=r"pass path='doc\.json'"):
        check_json("doc.json")
    assert check_json(path="doc.json").valid_json
    # Redaction takes any text, a file name included; path= reads the file.
    assert "fix.diff" in redact("fix.diff").text
    assert "+b" in redact(path="fix.diff").text
