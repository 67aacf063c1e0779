"""A Python file's graph inputs (``Slim``) from a lexical scan, without a parse.

Parsing every file of a large checkout with tree-sitter costs seconds (sympy: ~10 s of CPU,
most of it in ``Parser.parse`` and the tags query), yet the graph needs of each file only its
defined names, referenced names, imports and BM25 terms. Python's layout gives those to a few
regular expressions: string literals and comments are blanked first (no definitions or
references are read inside them), definitions are ``def``/``class`` lines scoped by their
indentation plus module-level assignments, references are the remaining identifiers.
What is shown of a file (signatures, line spans) still comes from tree-sitter, parsed when
something asks for that file (``RepoIndex.payloads``).

The scan mirrors ``python-tags.scm``: the same kinds (class, function, method, local,
constant), the same scopes (enclosing classes), imports as written. It differs in that every
identifier outside strings and comments but an attribute not called counts as a reference
(the query counts only those in reference positions: calls, arguments, attribute objects,
...), so assignment targets and parameters count too; and names inside f-strings do not.
"""

from __future__ import annotations

import keyword
import re
from collections import Counter

from hybrid.context.graph import Slim, qualified
from hybrid.context.tags import DefTuple, file_terms

LANG = "python"

# Strings and comments, matched left to right so that a quote inside a comment (or a hash
# inside a string) is read as what it is. Prefixes (r, b, f, u) are left as one-letter names.
# Possessive repeats: no backtracking into long strings.
_SKIP = re.compile(
    r'"""(?:[^"\\]++|\\.|"(?!""))*+"""'
    r"|'''(?:[^'\\]++|\\.|'(?!''))*+'''"
    r'|"(?:[^"\\\n]++|\\.)*+"'
    r"|'(?:[^'\\\n]++|\\.)*+'"
    r"|#[^\n]*+",
    re.S,
)
# Where a docstring starts: the first string of a def/class body (the line before ends with
# a colon) or of the module. Its end is found with str.find, faster than a regex.
_DOC_START = re.compile(r':[ \t]*\n[ \t]*[rRuU]?("""|\'\'\'|"|\')')
_MODULE_DOC = re.compile(r'(?:[ \t]*(?:#[^\n]*)?\n)*[ \t]*[rRuU]?("""|\'\'\'|"|\')')
# One pass over the blanked code, line starts only (the text is prefixed with a newline):
# a def/class line (indent, keyword, name), an import, a decorator, a module-level
# assignment (name), or any other statement at column 0 (it closes every open scope).
_LINE = re.compile(
    r"\n([ \t]*+)(?:(?:async[ \t]+)?(def|class)[ \t]+([A-Za-z_]\w*)"
    r"|import[ \t]+([\w. \t,]+)"
    r"|from[ \t]+([.\w]+)[ \t]+import\b"
    r"|@[ \t]*+[\w.]*\.([A-Za-z_]\w*+))"
    r"|\n(?:([A-Za-z_]\w*+)[ \t]*+(?::[^=\n]*)?=(?!=)|(?=[A-Za-z_@]))"
)
# An attribute that is not called (``obj.attr``): the query reads it as no reference (only
# ``obj`` is one), and counting it would link every ``self.name`` to whatever defines name.
_ATTRIBUTE = re.compile(r"\.[ \t]*+[A-Za-z_]\w*+(?![ \t]*+\()")
# Every ASCII character that cannot be in an identifier, as a space: translate() and split()
# find the identifiers faster than a regex does.
_NOT_IDENT = str.maketrans({c: " " for c in map(chr, range(128)) if not (c.isalnum() or c == "_")})
_KEYWORDS = frozenset(keyword.kwlist)  # not the soft ones: match, case, _ and type are names
_MAX_DOC_CHARS = 4000  # as tags.extract: the first docstrings, 1,000 characters each


def scan(source: bytes) -> Slim:
    """The graph inputs of one Python file's ``source``."""
    text = source.decode("utf-8", "replace")
    docs = _docstrings(text)
    code = "\n" + _SKIP.sub(" ", text)
    defs: list[DefTuple] = []
    imports: set[str] = set()
    open_scopes: list[tuple[int, str, str]] = []  # (indent width, "def" | "class", name)
    decorators: list[str] = []  # @functools.cache: the attribute is a reference here
    for m in _LINE.finditer(code):
        indent, what, name, imported, module, decorator, assigned = m.groups()
        if not indent:  # a statement at column 0 (or a def/class there: popped below)
            open_scopes.clear()
        if what is not None:
            width = len(indent.expandtabs(8))
            while open_scopes and open_scopes[-1][0] >= width:
                open_scopes.pop()
            if what == "class":
                kind = "class"
            elif not open_scopes:
                kind = "function"
            else:
                kind = "method" if open_scopes[-1][1] == "class" else "local"
            scope = ".".join(n for _, w, n in open_scopes if w == "class")
            defs.append((name, kind, 0, 0, "", scope))
            open_scopes.append((width, what, name))
        elif imported is not None:
            for part in imported.split(","):
                spec = part.split()
                if spec:
                    imports.add(spec[0])
        elif module is not None and module != "__future__":  # not an import in the query
            imports.add(module)
        elif decorator is not None:
            decorators.append(decorator)
        elif assigned is not None and assigned not in _KEYWORDS:
            defs.append((assigned, "constant", 0, 0, "", ""))
    counts = Counter(_ATTRIBUTE.sub(" ", code).translate(_NOT_IDENT).split())
    for d in defs:  # the name in ``def name`` defines it; it does not refer to it
        counts[d[0]] -= 1
    counts.update(decorators)
    refs = {
        n: c
        for n, c in sorted(counts.items())
        if c > 0 and n not in _KEYWORDS and not n[0].isdigit()  # 1e5, 0x10: numbers
    }
    return Slim(
        LANG,
        sorted({qualified(d[0], d[5]) for d in defs}),
        refs,
        sorted(imports),
        file_terms(defs, docs, refs),
        len(defs),
        "",
    )


def _docstrings(text: str) -> list[str]:
    """The module's and the defs' docstrings, in order, up to ``_MAX_DOC_CHARS``."""
    docs: list[str] = []
    chars = 0
    first = _MODULE_DOC.match(text)
    starts = _DOC_START.finditer(text)
    for m in ([first] if first else []) + list(starts):
        quote = m.group(1)
        end = text.find(quote, m.end())
        if end < 0:
            break
        if len(quote) == 1 and "\n" in text[m.end() : end]:
            continue  # not a one-line string after all
        doc = text[m.end() : min(end, m.end() + 1000)]
        docs.append(doc)
        chars += len(doc)
        if chars >= _MAX_DOC_CHARS:
            break
    return docs
