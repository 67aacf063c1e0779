"""Real-file context: tree-sitter tags, an incremental tag cache, a file/symbol graph ranked
by personalized PageRank fused with BM25, repo maps, skeletons and task context packs.

Names load lazily (numpy and tree-sitter only when used), so ``import hybrid.context`` is
cheap::

    from hybrid.context import repo_map, context_pack, skeleton
    print(repo_map(".", task="fix the etag in send_file", tokens=1024).text)
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "build_index": "hybrid.context.index",
    "RepoIndex": "hybrid.context.index",
    "TagCache": "hybrid.context.cache",
    "FileTags": "hybrid.context.tags",
    "Definition": "hybrid.context.tags",
    "extract": "hybrid.context.tags",
    "load_graph": "hybrid.context.repomap",
    "Graph": "hybrid.context.graph",
    "repo_map": "hybrid.context.repomap",
    "RepoMap": "hybrid.context.repomap",
    "MapEntry": "hybrid.context.repomap",
    "rank": "hybrid.context.ranking",
    "rank_symbols": "hybrid.context.symbols",
    "rerank_files": "hybrid.context.symbols",
    "SymbolHit": "hybrid.context.symbols",
    "Ranking": "hybrid.context.ranking",
    "skeleton": "hybrid.context.skeletons",
    "skeleton_source": "hybrid.context.skeletons",
    "context_pack": "hybrid.context.pack",
    "ContextPack": "hybrid.context.pack",
    "PackItem": "hybrid.context.pack",
    "fill_pack": "hybrid.context.pack",
    "evaluate": "hybrid.context.evaluation",
    "mine_cases": "hybrid.context.evaluation",
    "EvalReport": "hybrid.context.evaluation",
    "count_tokens": "hybrid.context.text",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hybrid.context' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
