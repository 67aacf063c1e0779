"""The lexical scan of Python files: the same definitions and imports as the tags query, and
a Python file's tags parsed only when something asks for them."""

from __future__ import annotations

from pathlib import Path

import pytest

import hybrid
from hybrid.context.cache import TagCache
from hybrid.context.graph import slim
from hybrid.context.index import build_index
from hybrid.context.lexical import scan
from hybrid.context.repomap import load_graph, repo_map
from hybrid.context.tags import extract
from hybrid.context.text import name_terms

_OWN_SOURCES = sorted(Path(hybrid.__file__).parent.rglob("*.py"))


@pytest.mark.parametrize("path", _OWN_SOURCES, ids=lambda p: p.name)
def test_scan_agrees_with_the_tags_query_on_this_project(path: Path) -> None:
    """Every Python file of hybrid itself: the same qualified names, counts and imports."""
    source = path.read_bytes()
    parsed, scanned = slim(extract(source, "python")), scan(source)
    assert scanned.names == parsed.names
    assert scanned.n_defs == parsed.n_defs
    assert scanned.imports == parsed.imports
    # references are a superset of the query's, but for names used only inside f-strings
    # (blanked like every string) or in their own definition
    f_lines = [line for line in source.decode().splitlines() if 'f"' in line or "f'" in line]
    for name in set(parsed.refs) - set(scanned.refs):
        assert name in parsed.names or any(name in line for line in f_lines), name


def test_scan_reads_layout_not_text() -> None:
    source = b'''"""Module doc: def not_a_def(): and class NotAClass: are prose."""
from __future__ import annotations
import os.path as osp, sys
from ..core import basic

LIMIT: int = 3
url = "http://x#y"  # a hash in a string, a 'quote' in a comment


class Outer(Base):
    """Outer doc."""

    class Inner:
        def method(self, arg):
            def helper():
                return arg.value.compute()
            return helper

    @functools.cache
    @property
    def after_inner(self):
        text = """
def fake():
    pass
"""
        return text


if os.environ.get("X"):
    def conditional():
        pass
'''
    got = scan(source)
    assert got.names == [
        "LIMIT",
        "Outer",
        "Outer.Inner",
        "Outer.Inner.helper",
        "Outer.Inner.method",
        "Outer.after_inner",
        "conditional",  # the module-level ``if`` closed the class
        "url",
    ]
    assert got.imports == ["..core", "os.path", "sys"]
    assert got.refs["compute"] == 1  # called attribute: a reference
    assert "value" not in got.refs  # attribute read: not one
    assert "not_a_def" not in got.refs and "fake" not in got.refs  # inside strings
    assert "quote" not in got.refs and "y" not in got.refs  # comments, strings
    assert got.refs["Base"] == 1 and "def" not in got.refs
    assert got.refs["cache"] == got.refs["property"] == 1  # decorators
    assert got.terms["module"] >= 1  # docstrings
    assert all(got.terms[t] >= 2 for t in name_terms("Outer"))  # definitions weigh double


def test_python_tags_are_parsed_when_first_asked_for(shop_repo: Path) -> None:
    cache = TagCache()
    index = build_index(shop_repo, cache=cache)
    assert index.stats.parsed == 5  # scanned, for the graph
    assert cache.payloads([TagCache.key(f.content_id, f.lang) for f in index.files]) == {}
    tags = index.tags("shop/cart.py")
    assert "Cart" in {d.name for d in tags.definitions}
    assert tags.definitions[0].line > 0 and tags.definitions[0].signature
    again = build_index(shop_repo, cache=cache)
    assert len(cache.payloads(TagCache.key(f.content_id, f.lang) for f in again.files)) == 1


def test_map_shows_scanned_files_with_parsed_signatures(shop_repo: Path) -> None:
    graph = load_graph(shop_repo)
    assert "Cart" in graph.symbols
    made = repo_map(shop_repo, tokens=400)
    assert any("class Cart" in sig for e in made.entries for sig in e.signatures)
