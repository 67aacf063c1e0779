"""How the graph links a file's references to definitions (``build_graph``)."""

from __future__ import annotations

import gc
from array import array
from pathlib import Path
from typing import Any

from hybrid.context.cache import TagCache
from hybrid.context.graph import Graph, Slim, build_graph
from hybrid.context.index import build_index, gc_paused
from hybrid.context.repomap import repo_map


def _module(names: list[str], refs: dict[str, int], imports: list[str]) -> Slim:
    return Slim("python", sorted(names), refs, imports, {}, len(names), "")


def _edges(graph: Graph, path: str) -> list[tuple[str, float]]:
    """The symbols ``path`` refers to, with the weights of those edges."""
    src, dst, weight = array("i"), array("i"), array("d")
    src.frombytes(graph.src)
    dst.frombytes(graph.dst)
    weight.frombytes(graph.weight)
    i, n = graph.paths.index(path), len(graph.paths)
    return [
        (graph.symbols[d - n], round(w, 6))
        for s, d, w in zip(src, dst, weight, strict=True)
        if s == i and d >= n
    ]


def test_a_name_defined_in_many_files_links_to_the_imported_ones_only() -> None:
    # ``run`` is a method of six classes in six files (C0 in two of them), beyond MAX_FANOUT:
    # an importer reaches only the definitions in the files it imports (each once, in symbol
    # order), a file importing none of them reaches none, and a file defining it its own.
    files = {f"pkg/m{k}.py": _module([f"C{k}.run"], {}, []) for k in range(6)}
    files["pkg/m1.py"] = _module(["C0.run", "C1.run"], {}, [])
    files["pkg/user.py"] = _module(["main"], {"run": 4}, ["pkg.m0", "pkg.m1", "pkg.m3"])
    files["pkg/lonely.py"] = _module(["other"], {"run": 1}, [])
    files["pkg/m5.py"] = _module(["C5.run"], {"run": 1}, [])
    graph = build_graph(files)
    assert _edges(graph, "pkg/user.py") == [
        ("C0.run", 0.333333),
        ("C1.run", 0.333333),
        ("C3.run", 0.333333),
    ]
    assert _edges(graph, "pkg/lonely.py") == []
    assert _edges(graph, "pkg/m5.py") == [("C5.run", 0.5)]
    files["pkg/user.py"] = _module(["main"], {"run": 4}, ["pkg.m4"])
    assert _edges(build_graph(files), "pkg/user.py") == [("C4.run", 1.0)]


def test_a_small_budget_parses_only_the_files_it_can_show(
    tmp_path: Path, git: Any, write: Any
) -> None:
    files = {
        f"pkg/mod{i}.py": "".join(f"def func_{i}_{j}(x):\n    return x\n\n" for j in range(12))
        for i in range(30)
    }
    write(tmp_path / "repo", files)
    cache = TagCache(tmp_path / "cache.sqlite")
    made = repo_map(tmp_path / "repo", tokens=300, cache=cache)
    index = build_index(tmp_path / "repo", cache=cache)
    parsed = cache.payloads(TagCache.key(f.content_id, f.lang) for f in index.files)
    assert 1 <= len(made.entries) <= len(parsed) <= len(made.entries) + 1  # not 16


def test_a_map_leaves_the_garbage_collector_as_it_found_it(shop_repo: Path) -> None:
    assert gc.isenabled()
    repo_map(shop_repo, tokens=200)
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        repo_map(shop_repo, tokens=300)
        assert not gc.isenabled()  # paused by the caller: still paused
    finally:
        gc.enable()
