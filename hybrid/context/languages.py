"""Which language a file is in, and the tree-sitter grammar and tags query for it.

Grammars come from the per-language wheels (``tree-sitter-python`` ...); the tags queries are
this project's own ``grammars/<lang>-tags.scm`` files, shipped as package data
``hybrid.grammars``. tree-sitter is imported only when a file is actually parsed.
"""

from __future__ import annotations

import functools
import importlib
import importlib.resources
import os
from typing import Any

from hybrid.errors import ContextError

# language -> (grammar module, language function, query file stem)
GRAMMARS: dict[str, tuple[str, str, str]] = {
    "python": ("tree_sitter_python", "language", "python"),
    "javascript": ("tree_sitter_javascript", "language", "javascript"),
    "typescript": ("tree_sitter_typescript", "language_typescript", "typescript"),
    "tsx": ("tree_sitter_typescript", "language_tsx", "typescript"),
    "go": ("tree_sitter_go", "language", "go"),
    "rust": ("tree_sitter_rust", "language", "rust"),
    "java": ("tree_sitter_java", "language", "java"),
    "c": ("tree_sitter_c", "language", "c"),
    "cpp": ("tree_sitter_cpp", "language", "cpp"),
    "ruby": ("tree_sitter_ruby", "language", "ruby"),
}

EXTENSIONS: dict[str, str] = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".jsx": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".cxx": "cpp",
    ".hpp": "cpp",
    ".hh": "cpp",
    ".hxx": "cpp",
    ".rb": "ruby",
}

# Source files with no grammar here: universal-ctags reads them when it is installed.
CTAGS_EXTENSIONS: dict[str, str] = {
    ".php": "PHP",
    ".pl": "Perl",
    ".pm": "Perl",
    ".lua": "Lua",
    ".sh": "Sh",
    ".bash": "Sh",
    ".scala": "Scala",
    ".kt": "Kotlin",
    ".swift": "Swift",
    ".cs": "C#",
    ".m": "ObjectiveC",
    ".r": "R",
    ".R": "R",
    ".ex": "Elixir",
    ".exs": "Elixir",
    ".erl": "Erlang",
    ".hs": "Haskell",
    ".ml": "OCaml",
    ".tcl": "Tcl",
    ".vim": "Vim",
    ".f90": "Fortran",
    ".jl": "Julia",
    ".clj": "Clojure",
    ".el": "EmacsLisp",
    ".sql": "SQL",
}


def language_for(path: str) -> str | None:
    """The tree-sitter language of ``path`` ("python", "tsx", ...), ``ctags:<Lang>``, or None."""
    ext = os.path.splitext(path)[1]
    lang = EXTENSIONS.get(ext)
    if lang is not None:
        return lang
    ctags_lang = CTAGS_EXTENSIONS.get(ext)
    return f"ctags:{ctags_lang}" if ctags_lang else None


def query_source(lang: str) -> str:
    """The text of this project's tags query for ``lang``."""
    stem = GRAMMARS[lang][2]
    resource = importlib.resources.files("hybrid.grammars").joinpath(f"{stem}-tags.scm")
    try:
        return resource.read_text(encoding="utf-8")
    except OSError as exc:
        raise ContextError(f"tags query for {lang} is missing from hybrid.grammars: {exc}") from exc


@functools.cache
def grammar(lang: str) -> tuple[Any, Any, Any]:
    """(Language, Parser, Query) for ``lang``, built once per process."""
    from tree_sitter import Language, Parser, Query

    if lang not in GRAMMARS:
        raise ContextError(f"no tree-sitter grammar for {lang!r}")
    module_name, func, _ = GRAMMARS[lang]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ContextError(f"grammar package {module_name} is not installed: {exc}") from exc
    language = Language(getattr(module, func)())
    try:
        query = Query(language, query_source(lang))
    except Exception as exc:  # tree_sitter.QueryError and friends
        raise ContextError(f"tags query for {lang} does not compile: {exc}") from exc
    return language, Parser(language), query
