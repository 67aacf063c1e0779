"""Skeletons: a file's imports, signatures, decorators, docstrings and module constants,
with bodies elided. Python skeletons parse again (bodies become ``...``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from hybrid.context.languages import grammar, language_for
from hybrid.errors import ContextError, InvalidInput
from hybrid.paths import display
from hybrid.repofs import Refused, read_file

if TYPE_CHECKING:
    from tree_sitter import Node

_MAX_CONSTANT_LINES = 3
_PY_KEEP = frozenset({"import_statement", "import_from_statement", "future_import_statement"})
_BODY_TYPES = frozenset(
    {
        "block",
        "statement_block",
        "compound_statement",
        "declaration_list",
        "field_declaration_list",
        "class_body",
        "interface_body",
        "enum_body",
        "body_statement",
    }
)
_FUNCTION_TYPES = frozenset(
    {
        "function_declaration",
        "function_definition",
        "method_definition",
        "method_declaration",
        "constructor_declaration",
        "function_item",
        "arrow_function",
        "function_expression",
        "generator_function_declaration",
        "func_literal",
        "method",
        "singleton_method",
    }
)


def _indent_of(source: bytes, byte: int) -> str:
    start = source.rfind(b"\n", 0, byte) + 1
    prefix = source[start:byte]
    return prefix.decode("utf-8", "replace") if not prefix.strip() else ""


def _text(source: bytes, node: Node) -> str:
    return source[node.start_byte : node.end_byte].decode("utf-8", "replace")


def _py_docstring(block: Node) -> Node | None:
    first = block.named_children[0] if block.named_child_count else None
    if (
        first is not None
        and first.type == "expression_statement"
        and first.named_child_count
        and first.named_children[0].type == "string"
    ):
        return first
    return None


def _py_statement(source: bytes, node: Node, out: list[str], in_class: bool) -> None:
    kind = node.type
    indent = _indent_of(source, node.start_byte)
    if kind in _PY_KEEP:
        out.append(indent + _text(source, node))
    elif kind == "decorated_definition":
        for child in node.named_children:
            if child.type == "decorator":
                out.append(_indent_of(source, child.start_byte) + _text(source, child))
        definition = node.child_by_field_name("definition")
        if definition is not None:
            _py_statement(source, definition, out, in_class)
    elif kind in ("function_definition", "class_definition"):
        body = node.child_by_field_name("body")
        if body is None:
            out.append(indent + _text(source, node))
            return
        header = source[node.start_byte : body.start_byte].decode("utf-8", "replace").rstrip()
        out.append(indent + header)
        body_indent = _indent_of(source, body.start_byte) or indent + "    "
        doc = _py_docstring(body)
        before = len(out)
        if doc is not None:
            out.append(body_indent + _text(source, doc))
        if kind == "class_definition":
            for child in body.named_children:
                if child is not doc and child.type != "comment":
                    _py_statement(source, child, out, True)
        if len(out) == before or (kind == "function_definition"):
            out.append(body_indent + "...")
    elif kind == "expression_statement" and node.named_child_count:
        inner = node.named_children[0]
        if inner.type == "assignment":
            text = _text(source, node)
            if text.count("\n") < _MAX_CONSTANT_LINES:
                out.append(indent + text)
            else:
                left = inner.child_by_field_name("left")
                kind_node = inner.child_by_field_name("type")
                head = _text(source, left) if left is not None else "_"
                if kind_node is not None:
                    head += ": " + _text(source, kind_node)
                out.append(f"{indent}{head} = ...")
        elif inner.type == "string" and not in_class:
            out.append(indent + _text(source, node))
    elif kind in ("if_statement", "try_statement") and not in_class:
        # `if TYPE_CHECKING:` / `try: import x` blocks hold imports worth keeping
        imports = [c for c in _walk_imports(node)]
        if imports:
            out.append(indent + "if True:  # (skeleton) conditional imports")
            for imp in imports:
                out.append(indent + "    " + _text(source, imp))


def _walk_imports(node: Node) -> Iterator[Node]:
    stack = [node]
    while stack:
        current = stack.pop()
        if current.type in _PY_KEEP:
            yield current
        elif current.type not in ("function_definition", "class_definition"):
            stack.extend(reversed(current.named_children))


def python_skeleton(source: bytes) -> str:
    """Skeleton of Python source; the result is valid Python."""
    _, parser, _ = grammar("python")
    tree = parser.parse(source)
    out: list[str] = []
    for node in tree.root_node.named_children:
        if node.type == "comment":
            continue
        if out and node.type in ("function_definition", "class_definition", "decorated_definition"):
            out.append("")
        _py_statement(source, node, out, False)
    return "\n".join(out) + ("\n" if out else "")


def generic_skeleton(source: bytes, lang: str) -> str:
    """Skeleton for brace and ``end`` languages: function bodies become ``{ /* ... */ }``
    (``# ...`` in Ruby), which parse again: no new tree-sitter ERROR nodes."""
    _, parser, _ = grammar(lang)
    tree = parser.parse(source)
    cuts: list[tuple[int, int, str]] = []
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type in _FUNCTION_TYPES:
            body = node.child_by_field_name("body")
            if body is not None and body.end_byte > body.start_byte:
                # placeholders the grammar accepts, so the skeleton parses again
                if lang == "ruby":
                    after = source[body.end_byte : body.end_byte + 1]
                    cuts.append(
                        (body.start_byte, body.end_byte, "# ..." if after == b"\n" else "# ...\n")
                    )
                    continue
                if source[body.start_byte : body.start_byte + 1] == b"{":
                    cuts.append((body.start_byte, body.end_byte, "{ /* ... */ }"))
                    continue
                # an expression body (x => x + 1) is kept: short, and "..." would not parse
        stack.extend(node.children)
    cuts.sort()
    pieces: list[bytes] = []
    pos = 0
    for start, end, repl in cuts:
        if start < pos:
            continue
        pieces.append(source[pos:start])
        pieces.append(repl.encode())
        pos = end
    pieces.append(source[pos:])
    text = b"".join(pieces).decode("utf-8", "replace")
    # drop blank-line runs left by elision
    lines = [ln.rstrip() for ln in text.splitlines()]
    out: list[str] = []
    for ln in lines:
        if ln or (out and out[-1]):
            out.append(ln)
    return "\n".join(out).strip("\n") + "\n"


def skeleton_source(source: bytes, lang: str) -> str:
    """Skeleton of ``source`` written in ``lang``."""
    if lang == "python":
        return python_skeleton(source)
    if lang.startswith("ctags:"):
        raise ContextError(f"no grammar for {lang[6:]}: skeletons need a tree-sitter grammar")
    return generic_skeleton(source, lang)


def skeleton(path: str | Path) -> str:
    """Skeleton of one file on disk (language from its extension).

    Only a regular file is read, bounded, and no symlink is followed on the way to it below the
    current directory (anywhere, for a path outside it): a FIFO, a device, a link to a host
    file, or a file under a directory replaced by a link, is one ``InvalidInput`` line."""
    lang = language_for(Path(path).name)
    if lang is None:
        raise InvalidInput(f"{display(path)}: unsupported file type")
    root, rel = _below(Path(path))
    try:
        source = read_file(root, rel)
    except Refused as exc:
        raise InvalidInput(f"{display(path)}: {exc.reason}") from None
    return skeleton_source(source, lang)


def _below(path: Path) -> tuple[Path, str]:
    """(root, path below it): the current directory when ``path`` lies under it (the
    directories above it are the user's own), else ``/``. ``..`` goes by name, as written."""
    full = Path(os.path.abspath(path))
    cwd = Path(os.path.abspath(os.curdir))
    root = cwd if cwd in full.parents else Path(full.anchor)
    return root, full.relative_to(root).as_posix()
