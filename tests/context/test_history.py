"""Similar past commits: the files that commits with messages like the task touched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hybrid.context import ranking, symbols
from hybrid.context.history import similar_changes
from hybrid.context.ranking import rank
from hybrid.context.repomap import load_graph, repo_map

TASK = "Refund totals are rounded twice"

FILES = {
    "app/__init__.py": "",
    "app/ledger.py": (
        "def post(entries):\n    amount = sum(e.amount for e in entries)\n    return amount\n"
    ),
    "app/report.py": "def header(title):\n    return title.upper()\n",
    "app/rounding.py": ("def round_total(total):\n    return round(total, 2)\n"),
    "app/cli.py": "def main(argv):\n    return 0\n",
    "app/orders.py": "def place(order):\n    return order.id\n",
    "app/users.py": "def login(user):\n    return user.name\n",
}


@pytest.fixture(name="shop")
def _shop(tmp_path: Path, git: Any, write: Any) -> Path:
    """A repository whose ledger was changed by fixes that read like ``TASK``."""
    repo = tmp_path / "shop"
    write(repo, FILES)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    past = [
        ("app/ledger.py", "Refunds: totals were rounded twice for partial refunds"),
        ("app/report.py", "Report: show the header in bold"),
        ("app/ledger.py", "Fix refund totals drifting by a cent after rounding"),
        ("app/cli.py", "cli: exit with the command's status"),
        ("app/orders.py", "Orders: keep the placement time"),
        ("app/users.py", "users: log in by e-mail address"),
        ("app/orders.py", "orders: reject an empty basket"),
    ]
    for n, (path, message) in enumerate(past):
        with (repo / path).open("a") as fh:
            fh.write(f"# change {n}\n")
        git(repo, "commit", "-q", "-am", message)
    return repo


def test_similar_commits_vote_for_the_files_they_touched(shop: Path, git: Any) -> None:
    votes = similar_changes(shop, TASK)
    assert max(votes, key=votes.__getitem__) == "app/ledger.py"
    assert "app/report.py" not in votes and "app/cli.py" not in votes
    # only history up to HEAD: at the first commit there is nothing to vote
    git(shop, "checkout", "-q", "HEAD~7")
    assert similar_changes(shop, TASK) == {}


def test_similar_commits_lift_the_file_in_the_ranking(
    shop: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph = load_graph(shop)
    ledger = graph.paths.index("app/ledger.py")
    plain = rank(graph, TASK, "fused")
    lifted = rank(graph, TASK, "fused", similar=similar_changes(shop, TASK))
    assert lifted.order.index(ledger) < plain.order.index(ledger)
    assert lifted.order.index(ledger) <= 1  # beside round_total, which the words name
    # and in the map, end to end
    listed = [e.path for e in repo_map(shop, TASK).entries]
    monkeypatch.setattr(ranking, "W_SIMILAR", 0.0)
    without = [e.path for e in repo_map(shop, TASK).entries]
    assert listed.index("app/ledger.py") < without.index("app/ledger.py")


LEDGER = (
    "CENTS = 100\n\n\n"
    "def describe_refund(entry):\n"
    '    """A line of text for one refund entry."""\n'
    '    return f"refund of {entry.amount}"\n\n\n'
    "def settle(entries):\n"
    "    balance = 0\n"
    "    for entry in entries:\n"
    "        balance += entry.amount\n"
    "    return balance\n\n\n"
    "def header(title):\n"
    "    return title.upper()\n"
)


def test_similar_commits_lift_the_symbol_whose_lines_they_added(
    tmp_path: Path, git: Any, write: Any
) -> None:
    repo = tmp_path / "ledger"
    write(repo, {"app/__init__.py": "", "app/ledger.py": LEDGER})
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    path = repo / "app/ledger.py"
    text = path.read_text().replace(
        "    return balance\n", "    balance = round(balance * CENTS) / CENTS\n    return balance\n"
    )
    path.write_text(text)
    git(repo, "commit", "-q", "-am", "Refund totals drifted by a cent in the ledger")
    # a later change above it: the added line is found by its text, not its old number
    path.write_text('"""The ledger."""\n\n' + text)
    git(repo, "commit", "-q", "-am", "ledger: say what the module is")
    task = "Refund totals are a cent off again"
    graph = load_graph(repo)
    ranking = rank(graph, task, "fused", similar=similar_changes(repo, task))
    with_history = [h.definition.name for h in symbols.rank_symbols(graph, ranking, repo)]
    without = [
        h.definition.name
        for h in symbols.rank_symbols(graph, ranking, repo, ablate=frozenset({"similar"}))
    ]
    assert with_history.index("settle") < without.index("settle")
    assert with_history[:2] == ["describe_refund", "settle"]  # the name still counts more
