"""``hybrid context eval`` on a real (small) history, and the CLI commands end to end."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hybrid.cli import cli
from hybrid.context.evaluation import evaluate, mine_cases


@pytest.fixture
def history_repo(shop_repo: Path, git: Any) -> Path:
    """Three bug-fix commits and one feature commit on top of the shop."""
    steps = [
        (
            "shop/pricing.py",
            "    return amount\n",
            "    return round(amount, 2)\n",
            "Fix rounding in apply_discount",
        ),
        (
            "shop/shipping.py",
            "weight_kg * 2",
            "weight_kg * 3",
            "fix shipping cost for heavy parcels",
        ),
        (
            "shop/cart.py",
            "self.items = []",
            "self.items: list = []",
            "Add a type to the cart items",
        ),
        ("shop/cart.py", "(1 + TAX_RATE)", "(1.0 + TAX_RATE)", "Cart.total: fix tax bug"),
        # housekeeping: its message names no behaviour, so it is no task
        ("shop/cart.py", "(1.0 + TAX_RATE)", "(1.0 + TAX_RATE)  # gross", "Fix typo in a comment"),
    ]
    for path, old, new, message in steps:
        file = shop_repo / path
        file.write_text(file.read_text().replace(old, new))
        git(shop_repo, "commit", "-qam", message)
    return shop_repo


def test_mine_cases_is_deterministic(history_repo: Path) -> None:
    cases = mine_cases(history_repo, 10)
    assert [c.task for c in cases] == [
        "Cart.total: fix tax bug",
        "fix shipping cost for heavy parcels",
        "Fix rounding in apply_discount",
    ]
    assert [c.gold for c in cases] == [["shop/cart.py"], ["shop/shipping.py"], ["shop/pricing.py"]]
    assert mine_cases(history_repo, 10) == cases
    assert len(mine_cases(history_repo, 2)) == 2


def test_evaluate_reports_all_modes(history_repo: Path) -> None:
    report = evaluate(history_repo, 10)
    assert report.cases == 3
    assert set(report.metrics) == {"full", "fused", "bm25", "graph"}
    assert report.metrics["fused"].acc_at_1 == 1.0
    for m in report.metrics.values():
        assert 0 <= m.acc_at_1 <= m.acc_at_5 <= 1 and 0 <= m.mrr <= 1
    listing = subprocess.run(
        ["git", "-C", str(history_repo), "worktree", "list"], capture_output=True, text=True
    )
    assert len(listing.stdout.strip().splitlines()) == 1  # the temporary worktree is gone


def test_cli_map_skeleton_context_eval(history_repo: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(
        cli, ["map", str(history_repo), "--task", "apply_discount", "--tokens", "200", "--json"]
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["entries"][0]["path"] == "shop/pricing.py" and data["tokens"] <= 200

    out = runner.invoke(cli, ["skeleton", str(history_repo / "shop/cart.py")])
    assert out.exit_code == 0 and "def total(self):" in out.output and "subtotal" not in out.output

    out = runner.invoke(
        cli,
        [
            "context",
            str(history_repo),
            "--task",
            "fix apply_discount",
            "--tokens",
            "2000",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    pack = json.loads(out.output)
    assert pack["tokens"] <= 2000 and all(item["reason"] for item in pack["items"])

    out = runner.invoke(cli, ["context", "eval", str(history_repo), "--limit", "5", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["cases"] == 3


def test_cli_bad_input_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    for args in (
        ["skeleton", str(tmp_path / "notes.txt")],
        ["context", "eval", str(tmp_path)],
        ["context", str(tmp_path), "--task", " "],
    ):
        proc = subprocess.run(["hybrid", *args], capture_output=True, text=True)
        assert proc.returncode != 0
        assert proc.stderr.startswith("hybrid: error:"), proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.skipif(shutil.which("ctags") is None, reason="universal-ctags is not installed")
def test_ctags_fallback_for_languages_without_grammar(tmp_path: Path) -> None:
    (tmp_path / "util.lua").write_text(
        "local M = {}\nfunction M.greet(name)\n  return 'hi ' .. name\nend\nfunction helper()\nend\nreturn M\n"
    )
    from hybrid.context.index import build_index

    index = build_index(tmp_path)
    tags = index.tags("util.lua")
    assert tags.lang == "ctags:Lua"
    assert {"helper"} <= {d.name for d in tags.definitions}


def test_fix_hunks_and_coverage(history_repo: Path, git: Any) -> None:
    """Hunks are parent lines; a pure insertion counts as the line it follows; only bodies
    (whole files, symbol spans) cover a hunk, never a skeleton."""
    from hybrid.context.evaluation import covered_hunks, fix_hunks
    from hybrid.context.pack import ContextPack, PackItem

    pricing = history_repo / "shop/pricing.py"
    pricing.write_text(
        pricing.read_text().replace("TAX_RATE = 0.2\n", "TAX_RATE = 0.2\nLIMIT = 1\n")
    )
    git(history_repo, "commit", "-qam", "fix: a limit")
    case = mine_cases(history_repo, 1)[0]
    hunks = fix_hunks(history_repo, case)
    assert [(h.path, h.lines) for h in hunks] == [("shop/pricing.py", (3, 3))]

    def pack(*items: PackItem) -> ContextPack:
        return ContextPack(root=".", task="t", budget=1, tokens=0, items=list(items), ranking=[])

    body = PackItem(
        kind="symbols", path="shop/pricing.py", reason="r", tokens=1, text="", spans=[(1, 3)]
    )
    elsewhere = PackItem(
        kind="symbols", path="shop/pricing.py", reason="r", tokens=1, text="", spans=[(6, 10)]
    )
    skeleton = PackItem(kind="skeleton", path="shop/pricing.py", reason="r", tokens=1, text="")
    assert covered_hunks(pack(body), hunks) == 1
    assert covered_hunks(pack(elsewhere, skeleton), hunks) == 0


def test_evaluate_reports_edit_site_recall(history_repo: Path) -> None:
    report = evaluate(history_repo, 10, budgets=(64, 2000))
    assert set(report.edit) >= {"full"}
    for per_budget in report.edit.values():
        assert set(per_budget) == {64, 2000}
    # every file of the shop fits in 2000 tokens: each fix's hunk is in a packed body
    assert report.edit["full"][2000].task_recall == 1.0
    assert all(r.hunks == 1 for r in report.results)
    assert report.edit["full"][64].hunk_recall < 1.0


def test_cli_eval_prints_edit_site_recall_with_ablations(history_repo: Path) -> None:
    runner = CliRunner(env={"COLUMNS": "200"})
    out = runner.invoke(cli, ["context", "eval", str(history_repo), "--limit", "5"])
    assert out.exit_code == 0, out.output
    assert "edit-site recall" in out.output
    for label in ("full (symbol ranking)", "- symbol ranking", "- body text", "- recent history"):
        assert label in out.output
    for budget in ("2k", "4k", "8k", "16k"):
        assert budget in out.output


@pytest.fixture
def no_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain progress lines from the first update (the CLI waits a second before the first)."""
    import hybrid.cli._progress

    monkeypatch.setattr(hybrid.cli._progress, "DELAY", 0.0)


def test_long_work_shows_plain_progress_without_a_terminal(
    hybrid_cli, history_repo: Path, tmp_path: Path, no_delay: None
) -> None:
    """A cold map and `context eval` with stderr on a pipe (a log, CI, an agent): plain lines."""
    big = tmp_path / "big"
    for i in range(300):
        (big / f"pkg{i % 10}").mkdir(parents=True, exist_ok=True)
        (big / f"pkg{i % 10}" / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n")
    code, out, err = hybrid_cli("map", str(big), "--json")
    assert code == 0, err
    json.loads(out)  # progress never reaches stdout
    lines = err.splitlines()
    assert "hybrid: parsing files 300/300 (100%)" in lines, err
    assert lines[-1].startswith("hybrid: parsing files: done in "), err
    assert all(line.startswith("hybrid: parsing files") for line in lines), err
    code, _, err = hybrid_cli("map", str(big), "--json")  # warm: nothing to parse, no lines
    assert code == 0 and err == "", err

    code, out, err = hybrid_cli("context", "eval", str(history_repo), "--limit", "3")
    assert code == 0, err
    assert "hybrid: evaluating commits 3/3 (100%)" in err.splitlines(), err


def test_a_rust_files_own_test_module_is_not_an_edit_site(tmp_path: Path, git: Any) -> None:
    """A fix that also adds a test inside the source file's ``mod tests``: only the
    source hunk is scored, and the symbols packed are never the test functions."""
    from functools import partial

    from hybrid.context.evaluation import fix_hunks, source_hunks
    from hybrid.context.grep import grep_words
    from hybrid.context.ranking import rank
    from hybrid.context.repomap import load_graph
    from hybrid.context.symbols import rank_symbols

    filler = "".join(f"\npub fn helper_{k}(x: u32) -> u32 {{\n    x + {k}\n}}\n" for k in range(3))
    lib = tmp_path / "src/lib.rs"
    lib.parent.mkdir(parents=True)
    lib.write_text(
        "pub fn parse_port(s: &str) -> u16 {\n    s.parse().unwrap()\n}\n"
        + filler
        + "\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn port() {\n"
        '        assert_eq!(super::parse_port("80"), 80);\n    }\n}\n'
    )
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "init")
    text = lib.read_text()
    text = text.replace("s.parse().unwrap()", "s.trim().parse().unwrap_or(0)")
    text = text.replace("    }\n}\n", "    }\n\n    #[test]\n    fn junk() {\n    }\n}\n")
    lib.write_text(text)
    git(tmp_path, "commit", "-qam", "fix: parse_port panics on a bad port")
    case = mine_cases(tmp_path, 1)[0]
    git(tmp_path, "checkout", "-q", case.parent)
    hunks = fix_hunks(tmp_path, case)
    assert len(hunks) == 2
    graph = load_graph(tmp_path)
    assert [h.lines for h in source_hunks(graph, hunks)] == [(2, 2)]
    ranking = rank(graph, case.task, "fused", [], partial(grep_words, tmp_path))
    hits = rank_symbols(graph, ranking, tmp_path)
    assert "parse_port" in {h.definition.name for h in hits}
    assert not [h for h in hits if h.definition.scope == "tests" or h.definition.name == "tests"]
