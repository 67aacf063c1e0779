"""Definitions and references per file, from tree-sitter and this project's tags queries.

A file's tags are a ``Payload``: a named tuple whose plain-tuple form (``tuple(payload)``)
crosses process boundaries and goes into the SQLite cache with ``marshal`` cheaply;
``FileTags`` is the readable view of one.
Languages without a grammar fall back to universal-ctags (definitions only).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, NamedTuple

from hybrid.context.languages import grammar
from hybrid.context.text import name_terms, terms
from hybrid.repofs import Refused, read_file

if TYPE_CHECKING:
    from tree_sitter import Node

DefTuple = tuple[str, str, int, int, str, str]
"""(name, kind, line, end_line, signature, scope) of one definition, as stored (see Definition)."""


class Payload(NamedTuple):
    """What parsing one file yields, in the order it is stored in the tag cache."""

    lang: str
    defs: list[DefTuple]
    refs: dict[str, int]
    """Referenced names and how often."""
    imports: list[str]
    """Import specs as written (sorted, unique)."""
    terms: dict[str, int]
    """BM25 term frequencies over symbol names, docstrings and references."""
    error: str
    """Why the file yielded nothing ("" when it parsed)."""

    @classmethod
    def empty(cls, lang: str, error: str = "") -> Payload:
        """No tags, and why."""
        return cls(lang, [], {}, [], {}, error)


_CLIMB = frozenset(
    {
        "function_declarator",
        "pointer_declarator",
        "reference_declarator",
        "qualified_identifier",
        "scope_resolution",
        "template_function",
    }
)
# Signatures are kept whole (the map wraps them); this only stops a pathological one.
_MAX_SIGNATURE = 2000
_MAX_DOC_CHARS = 4000
_TIGHT_OPEN = re.compile(r"([(\[]) ")
_TIGHT_CLOSE = re.compile(r",? ([)\]])")
_TIGHT_COMMA = re.compile(r" ,")  # where a comment before a comma was cut
# Nodes that open a named scope, and the field holding the name.
_SCOPES: dict[str, str] = {
    "class_definition": "name",  # python
    "class_declaration": "name",  # js, ts, java
    "abstract_class_declaration": "name",
    "class": "name",  # js class expression, ruby
    "module": "name",  # ruby, ts namespace
    "interface_declaration": "name",
    "enum_declaration": "name",
    "record_declaration": "name",
    "impl_item": "type",  # rust
    "trait_item": "name",
    "mod_item": "name",
    "class_specifier": "name",  # c++
    "struct_specifier": "name",
    "namespace_definition": "name",
}


FILE_KIND = "file"  # a whole file ranked as one symbol (symbols.whole_file); no tag has it


class Definition(NamedTuple):
    """One definition: name, kind (class, function, method, ...), 1-based line span,
    signature, and the dotted scope that encloses it ("" at top level)."""

    name: str
    kind: str
    line: int
    end_line: int
    signature: str
    scope: str = ""

    @property
    def qualified(self) -> str:
        """``Scope.name`` (``Session.request``), or the bare name at top level."""
        return f"{self.scope}.{self.name}" if self.scope else self.name


class FileTags(NamedTuple):
    """Everything the index knows about one file."""

    path: str
    lang: str
    definitions: tuple[Definition, ...]
    references: dict[str, int]
    imports: tuple[str, ...]
    error: str

    @classmethod
    def from_payload(cls, path: str, payload: Payload) -> FileTags:
        return cls(
            path,
            payload.lang,
            tuple(Definition(*d) for d in payload.defs),
            payload.refs,
            tuple(payload.imports),
            payload.error,
        )


def _text(node: Node) -> str:
    raw = node.text
    return raw.decode("utf-8", "replace") if raw is not None else ""


def _start(node: Node) -> int:
    return node.start_byte


def _by_name(item: tuple[bytes | None, int]) -> bytes:
    return item[0] or b""


def _definition_node(name_node: Node) -> Node:
    node = name_node.parent
    while node is not None and node.type in _CLIMB:
        node = node.parent
    if (
        node is not None
        and node.type == "member_expression"
        and node.parent is not None
        and node.parent.type == "assignment_expression"
    ):
        return node.parent  # res.send = function send() {...}: the whole assignment
    return node if node is not None else name_node


def _python_kind(node: Node) -> str:
    """method (in a class body), function (module level) or local (nested in a function)."""
    parent = node.parent
    if parent is not None and parent.type == "decorated_definition":
        parent = parent.parent
    if parent is None or parent.type == "module":
        return "function"
    while parent is not None:
        if parent.type == "class_definition":
            return "method"
        if parent.type in ("function_definition", "lambda"):
            return "local"
        parent = parent.parent
    return "function"


def _scope_name(node: Node, field: str) -> str:
    named = node.child_by_field_name(field)
    if named is None:
        return ""
    if named.type in ("generic_type", "scoped_type_identifier", "scope_resolution"):
        inner = named.child_by_field_name("type") or named.child_by_field_name("name")
        named = inner if inner is not None else named
    return _text(named).split("<", 1)[0].strip()


def _go_receiver(node: Node) -> str:
    receiver = node.child_by_field_name("receiver")
    if receiver is None:
        return ""
    found = ""
    stack = [receiver]
    while stack:  # the receiver's type name: (c *Command) or (r Router[T]) -> the identifier
        current = stack.pop()
        if current.type == "type_identifier":
            found = found or _text(current)
        stack.extend(reversed(current.children))
    return found


def _scope(node: Node, name_node: Node) -> str:
    """Dotted names of the classes, modules, impls ... around a definition node."""
    if node.type == "method_declaration" and node.child_by_field_name("receiver") is not None:
        return _go_receiver(node)
    parts: list[str] = []
    parent = node.parent
    while parent is not None:
        field = _SCOPES.get(parent.type)
        if field is not None and parent is not node:
            name = _scope_name(parent, field)
            if name:
                parts.append(name)
        parent = parent.parent
    outer = name_node.parent
    if outer is not None and outer.type in ("qualified_identifier", "member_expression"):
        # C++ Foo::bar, JS res.send = function ...
        field = "scope" if outer.type == "qualified_identifier" else "object"
        scope_node = outer.child_by_field_name(field)
        if scope_node is not None:
            parts.insert(0, _text(scope_node).replace("::", "."))
    return ".".join(reversed(parts))


def _signature(node: Node, source: bytes) -> str:
    body = node.child_by_field_name("body")
    if body is None and node.type == "variable_declarator":
        value = node.child_by_field_name("value")
        body = value.child_by_field_name("body") if value is not None else None
    if body is not None and body.start_byte > node.start_byte:
        raw = _without_comments(node, body, source)
    else:
        end = source.find(b"\n", node.start_byte, node.end_byte)
        raw = source[node.start_byte : end if end != -1 else node.end_byte]
    text = " ".join(raw.decode("utf-8", "replace").split())
    text = _TIGHT_OPEN.sub(r"\1", _TIGHT_CLOSE.sub(r"\1", text))  # "f( a, )" -> "f(a)"
    text = _TIGHT_COMMA.sub(",", text)
    text = text.rstrip("{").rstrip()
    if len(text) > _MAX_SIGNATURE:
        text = text[: _MAX_SIGNATURE - 3] + "..."
    return text


def _without_comments(node: Node, body: Node, source: bytes) -> bytes:
    """The text from ``node`` to its body, without the comments in between (a `# noqa` after the
    colon, the `#:` attribute notes before a Python body's first statement)."""
    comments = []
    stack = [child for child in node.children if child.start_byte < body.start_byte]
    while stack:
        child = stack.pop()
        if "comment" in child.type:
            comments.append((child.start_byte, min(child.end_byte, body.start_byte)))
        else:
            stack.extend(c for c in child.children if c.start_byte < body.start_byte)
    kept, at = [], node.start_byte
    for start, end in sorted(comments):
        kept.append(source[at:start])
        at = max(at, end)
    kept.append(source[at : body.start_byte])
    return b"".join(kept)


def qualified_signature(d: Definition) -> str:
    """The signature with the name written as ``Scope.name`` (``def Session.request(...)``),
    unless the signature already names the scope (a Go receiver)."""
    if not d.scope:
        return d.signature
    sig = d.signature
    at = _word_at(sig, d.name)
    if at < 0:
        return f"{d.scope}.{sig}" if sig.startswith(d.name) else sig
    last = d.scope.rsplit(".", 1)[-1]
    if _word_at(sig[:at], last) >= 0:
        return sig
    return sig[:at] + d.scope + "." + sig[at:]


def _word_at(text: str, word: str) -> int:
    """Index of ``word`` in ``text`` as a whole identifier, or -1."""
    start = 0
    while True:
        at = text.find(word, start)
        if at < 0:
            return -1
        before = text[at - 1] if at else " "
        after = text[at + len(word) : at + len(word) + 1] or " "
        if not (before.isalnum() or before == "_") and not (after.isalnum() or after == "_"):
            return at
        start = at + 1


def extract(source: bytes, lang: str) -> Payload:
    """Parse ``source`` as ``lang`` and run its tags query."""
    from tree_sitter import QueryCursor

    _, parser, query = grammar(lang)
    tree = parser.parse(source)
    captures = QueryCursor(query).captures(tree.root_node)
    defs: list[DefTuple] = []
    raw_refs: Counter[bytes | None] = Counter()  # decoded once per distinct name, below
    imports: list[str] = []
    docs: list[str] = []
    doc_chars = 0
    for capture, nodes in captures.items():
        if capture.startswith("definition."):
            kind = capture[11:]
            for name_node in nodes:
                node = _definition_node(name_node)
                kind_here = _python_kind(node) if lang == "python" and kind == "function" else kind
                text = _text(name_node)
                defs.append(
                    (
                        text,
                        kind_here,
                        node.start_point[0] + 1,
                        node.end_point[0] + 1,
                        _signature(node, source),
                        _scope(node, name_node),
                    )
                )
        elif capture == "reference.import":
            for node in nodes:
                imports.append(_text(node).strip("\"'<>"))
        elif capture.startswith("reference."):
            raw_refs.update([node.text for node in nodes])
        elif capture == "doc":
            # captures() does not promise document order; the doc budget below needs it
            for node in sorted(nodes, key=_start):
                if doc_chars < _MAX_DOC_CHARS:
                    text = _text(node)[:1000]
                    docs.append(text)
                    doc_chars += len(text)
    defs.sort(key=lambda d: (d[2], d[0]))
    refs: dict[str, int] = {}
    for raw, count in sorted(raw_refs.items(), key=_by_name):  # fixed order for the graph
        if raw:
            name = raw.decode("utf-8", "replace")
            refs[name] = refs.get(name, 0) + count
    return Payload(lang, defs, refs, sorted(set(imports)), file_terms(defs, docs, refs), "")


DEF_WEIGHT = 2
REF_CAP = 3
_TERM_KINDS = frozenset({"class", "function", "method", "interface", "type", "module", "macro"})


def file_terms(defs: list[DefTuple], docs: list[str], refs: dict[str, int]) -> dict[str, int]:
    """BM25 term frequencies of one file: definition names weigh double, references count
    at most three times each, docstrings count as written."""
    # A plain dict, not a Counter: Counter's __missing__ is a Python call per new term, and
    # this loop runs for every distinct name of every file.
    tf: dict[str, int] = dict(Counter(terms("\n".join(docs))))
    get = tf.get
    for d in defs:
        if d[1] in _TERM_KINDS:
            for term in name_terms(d[0]):
                tf[term] = get(term, 0) + DEF_WEIGHT
    for name, count in refs.items():
        c = count if count < REF_CAP else REF_CAP
        for term in name_terms(name):
            tf[term] = get(term, 0) + c
    return tf


def extract_file(root: str, rel: str, lang: str) -> Payload:
    """Tags of file ``rel`` of the checkout at ``root`` (read by ``hybrid.repofs``: never
    through a link, never a FIFO or device); a file not read yields an empty payload saying why."""
    try:
        source = read_file(root, rel)
    except Refused as exc:
        return Payload.empty(lang, f"not read: {exc.reason}")
    try:
        return extract(source, lang)
    except Exception as exc:  # a grammar crash must not lose the other files
        return Payload.empty(lang, f"parse failed: {exc}")


def ctags_available() -> bool:
    """Whether universal-ctags is on PATH (the fallback for languages without a grammar)."""
    exe = shutil.which("ctags")
    if exe is None:
        return False
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return "Universal Ctags" in out.stdout


def extract_ctags(root: str, files: list[tuple[str, str]]) -> dict[str, Payload]:
    """Definitions for ``files`` ((relative path, "ctags:<Lang>")) from one universal-ctags run.

    ctags opens what it is given and follows links, so it never sees the checkout: each file is
    read by ``hybrid.repofs`` into a private directory (named by number, extension kept, so a
    name with a newline cannot break ctags' list) and ctags runs there."""
    result: dict[str, Payload] = {path: Payload.empty(lang) for path, lang in files}
    if not files:
        return result
    cmd = ["ctags", "--output-format=json", "--fields=+nKSe", "-f", "-", "-L", "-"]
    with tempfile.TemporaryDirectory(prefix="hybrid-ctags-") as tmp:
        copies: dict[str, str] = {}  # copy's name -> path in the checkout
        for n, (path, lang) in enumerate(files):
            try:
                data = read_file(root, path)
            except Refused as exc:
                result[path] = Payload.empty(lang, f"not read: {exc.reason}")
                continue
            suffix = PurePosixPath(path).suffix
            name = f"{n}{suffix}" if suffix.isprintable() and "/" not in suffix else str(n)
            Path(tmp, name).write_bytes(data)
            copies[name] = path
        try:
            out = subprocess.run(
                cmd,
                cwd=tmp,
                input="\n".join(copies),
                capture_output=True,
                text=True,
                timeout=300,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            for path, lang in files:
                result[path] = Payload.empty(lang, f"ctags failed: {exc}")
            return result
    defs: dict[str, list[DefTuple]] = {p: [] for p, _ in files}
    for line in out.stdout.splitlines():
        try:
            tag = json.loads(line)
        except ValueError:
            continue
        found_in = copies.get(tag.get("path", ""))
        if tag.get("_type") != "tag" or found_in is None or found_in not in defs:
            continue
        path = found_in
        lineno = int(tag.get("line", 0))
        signature = f"{tag.get('kind', '')} {tag['name']}{tag.get('signature', '')}".strip()
        defs[path].append(
            (
                tag["name"],
                str(tag.get("kind", "symbol")),
                lineno,
                int(tag.get("end", lineno)),
                signature,
                str(tag.get("scope", "")).replace("::", "."),
            )
        )
    read = set(copies.values())
    for path, lang in files:
        if path not in read:
            continue  # not read: its payload says why
        found = sorted(defs[path], key=lambda d: (d[2], d[0]))
        result[path] = Payload(lang, found, {}, [], file_terms(found, [], {}), "")
    return result
