"""Repo maps and context packs: ranking, budgets, reasons and determinism."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import hybrid
from hybrid.context.pack import context_pack
from hybrid.context.ranking import analyse_task, rank
from hybrid.context.repomap import load_graph, repo_map
from hybrid.context.text import count_tokens
from hybrid.errors import ContextError


def test_mentioned_identifier_ranks_its_definition_first(shop_repo: Path) -> None:
    graph = load_graph(shop_repo)
    for task, expected in [
        ("apply_discount gives the wrong amount above 100", "shop/pricing.py"),
        ("Cart.total ignores the tax", "shop/cart.py"),
        ("shipping cost for heavy parcels is too low", "shop/shipping.py"),
    ]:
        ranking = rank(graph, task)
        assert graph.paths[ranking.order[0]] == expected, task
        assert ranking.reasons[ranking.order[0]]


def test_area_prefix_names_a_directory(tmp_path: Path, write) -> None:  # type: ignore[no-untyped-def]
    """An "area:" prefix lifts the files under that directory (by stem: parser, parsers/)."""
    body = "def read_value(text):\n    return text.strip()\n"
    write(tmp_path, {"parsers/core.py": body, "output/core.py": body})
    graph = load_graph(tmp_path)
    ranking = rank(graph, "parser: read_value keeps the newline")
    assert graph.paths[ranking.order[0]] == "parsers/core.py"
    assert "directory named in the task" in ranking.reasons[ranking.order[0]]
    for task in (
        "fix(parser): read_value keeps the newline",  # a conventional commit's scope
        "core/parser: read_value keeps the newline",  # the narrowest part of a path
        "parser: read_value keeps the newline",
    ):
        assert analyse_task(graph, task).lead == "parser", task
    assert analyse_task(graph, "Fix #12: read_value keeps the newline").lead == ""


def test_ablations_differ_and_are_complete(shop_repo: Path) -> None:
    graph = load_graph(shop_repo)
    task = "apply_discount is wrong"
    orders = {mode: rank(graph, task, mode).order for mode in ("fused", "bm25", "graph")}
    for order in orders.values():
        assert sorted(order) == list(range(len(graph.paths)))


@pytest.mark.parametrize("budget", [5, 40, 120, 1000])
def test_map_respects_budget(shop_repo: Path, budget: int) -> None:
    result = repo_map(shop_repo, "discount", budget)
    assert count_tokens(result.text) <= budget if result.text else True
    assert result.tokens <= budget
    assert result.files_total == 5


def test_map_lists_signatures(shop_repo: Path) -> None:
    result = repo_map(shop_repo, "apply_discount", 500)
    top = result.entries[0]
    assert top.path == "shop/pricing.py"
    assert any("def apply_discount(amount):" in s for s in top.signatures)
    assert "shop/pricing.py:" in result.text


@pytest.mark.parametrize("budget", [64, 300, 3000])
def test_pack_respects_budget_and_explains(shop_repo: Path, budget: int) -> None:
    pack = context_pack(shop_repo, "apply_discount returns the wrong amount", budget)
    assert pack.tokens <= budget
    assert pack.tokens == sum(item.tokens for item in pack.items)
    for item in pack.items:
        assert item.reason
        assert count_tokens(item.text) == item.tokens


def test_pack_contents(shop_repo: Path) -> None:
    pack = context_pack(shop_repo, "apply_discount returns the wrong amount", 3000)
    kinds = {(item.kind, item.path) for item in pack.items}
    assert ("file", "shop/pricing.py") in kinds
    assert ("test", "tests/test_pricing.py") in kinds
    # cart.py uses apply_discount: it comes as a ranked file or as a neighbour skeleton
    assert ("file", "shop/cart.py") in kinds or ("skeleton", "shop/cart.py") in kinds
    first_file = next(item for item in pack.items if item.kind == "file")
    assert "defines apply_discount" in first_file.reason
    assert "return amount * 0.9" in first_file.text


def test_pack_large_file_gives_symbol_bodies(tmp_path: Path, write) -> None:  # type: ignore[no-untyped-def]
    filler = "".join(f"def filler_{i}(x):\n    return x + {i}\n\n" for i in range(300))
    write(
        tmp_path,
        {"big.py": filler + "def target_fn(x):\n    return 'needle'\n", "other.py": "X = 1\n"},
    )
    pack = context_pack(tmp_path, "target_fn returns the wrong thing", 800)
    assert pack.tokens <= 800
    symbols = next(item for item in pack.items if item.path == "big.py")
    assert symbols.kind == "symbols"
    assert "return 'needle'" in symbols.text


def test_pack_needs_task(shop_repo: Path) -> None:
    with pytest.raises(ContextError):
        context_pack(shop_repo, "  ", 1000)


def _map_json(root: Path, cache: Path, seed: str) -> dict:  # type: ignore[type-arg]
    env = dict(os.environ, PYTHONHASHSEED=seed, HYBRID_CACHE_DIR=str(cache))
    args = ["map", str(root), "--task", "parse the policy spec and run wasm", "--tokens", "1500"]
    out = subprocess.run(
        [sys.executable, "-c", "from hybrid.cli import main; main()", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(out.stdout)


def test_deterministic_across_processes(tmp_path: Path) -> None:
    """Different hash seeds, cold (parallel parse) and warm (cached graph): same map."""
    root = tmp_path / "src"
    shutil.copytree(
        Path(hybrid.__file__).parent,
        root / "hybrid",
        ignore=shutil.ignore_patterns("__pycache__", "*.wasm"),
    )
    # more docstring text than a file's doc budget: which docstrings count must not vary
    step = '    """' + "Parse the policy spec and run it. " * 8 + '"""\n\n'
    docs = "".join(f"def policy_step_{i}():\n{step}" for i in range(60))
    (root / "many_docs.py").write_text(docs)
    cold = _map_json(root, tmp_path / "c1", "1")
    warm = _map_json(root, tmp_path / "c1", "2")
    other = _map_json(root, tmp_path / "c2", "3")
    assert cold["entries"] and cold["text"]
    assert cold == warm == other


def test_no_source_files_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("# nothing to index\n")
    with pytest.raises(ContextError, match="no source files"):
        repo_map(tmp_path, "anything", 100)


def test_words_only_in_comments_are_found_by_grep(shop_repo: Path, git) -> None:  # type: ignore[no-untyped-def]
    path = shop_repo / "shop/shipping.py"
    path.write_text(
        path.read_text() + "\n# the courier rejects overweight parcels (zorblax rule)\n"
    )
    git(shop_repo, "commit", "-qam", "note")
    graph = load_graph(shop_repo)
    plain = rank(graph, "zorblax rule breaks checkout")
    assert plain.bm25[graph.paths.index("shop/shipping.py")] == 0  # not in any name or doc
    from functools import partial

    from hybrid.context.grep import grep_words

    with_grep = rank(graph, "zorblax rule breaks checkout", grep=partial(grep_words, shop_repo))
    assert graph.paths[with_grep.order[0]] == "shop/shipping.py"
    assert with_grep.bm25[graph.paths.index("shop/shipping.py")] > 0
