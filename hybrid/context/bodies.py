"""Fill a token budget with the bodies of ranked symbols, in symbol order across files.

Each body comes with what it takes to edit it correctly: the header of its enclosing class
and the import lines of its file that the body uses. A file small enough goes in whole
(it holds all its bodies). The text is grouped per file, bodies in line order.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from hybrid.context.symbols import SymbolHit
from hybrid.context.tags import Definition
from hybrid.context.text import IDENT_RE, count_tokens

SMALL_FILE_SHARE = 0.25  # a whole file costing at most this share of the budget goes in whole
FIRST_FILE_SHARE = 0.6  # ... and the best symbol's file, up to this share: fixes spread out
CLASS_MAX_TOKENS = 400  # a larger class is represented by its methods, not its whole body
# A body's packing priority is its score less SIZE_PENALTY per doubling of its size above
# SIZE_FLOOR tokens: a fix sits in one of many small bodies more often than in one big one.
SIZE_PENALTY = 0.1
SIZE_FLOOR = 100
_CONTAINERS = frozenset({"class", "interface", "module", "type"})
_IMPORT_START = {
    "python": re.compile(r"^(import\s|from\s+\S+\s+import\s)"),
    "javascript": re.compile(r"^(import\s|(const|let|var)\s.*\brequire\()"),
    "typescript": re.compile(r"^(import\s|(const|let|var)\s.*\brequire\()"),
    "tsx": re.compile(r"^(import\s|(const|let|var)\s.*\brequire\()"),
    "rust": re.compile(r"^(pub\s+)?use\s"),
    "java": re.compile(r"^import\s"),
    "go": re.compile(r"^import\s"),
    "ruby": re.compile(r"^require"),
    "c": re.compile(r"^#\s*include"),
    "cpp": re.compile(r"^#\s*include"),
}
_NOT_NAMES = frozenset({"import", "from", "as", "use", "pub", "const", "let", "var", "require"})


@dataclass
class _File:
    path: str
    lang: str
    lines: list[str]
    whole: bool = False
    defs: list[Definition] = field(default_factory=list)
    imports: list[tuple[int, int]] = field(default_factory=list)  # statement line spans
    used_imports: set[int] = field(default_factory=set)
    headers: dict[int, Definition] = field(default_factory=dict)
    score: float = 0.0


def import_statements(lines: list[str], lang: str) -> list[tuple[int, int]]:
    """1-based line spans of the top-level import statements of a file."""
    start_re = _IMPORT_START.get(lang)
    if start_re is None:
        return []
    out: list[tuple[int, int]] = []
    k = 0
    while k < len(lines):
        line = lines[k]
        if lang == "go" and line.startswith("import ("):
            end = k + 1
            while end < len(lines) and not lines[end].startswith(")"):
                out.append((end + 1, end + 1))
                end += 1
            k = end + 1
            continue
        if start_re.match(line):
            end = k
            if lang == "python" and "(" in line and ")" not in line:
                while end + 1 < len(lines) and ")" not in lines[end]:
                    end += 1
            elif lang in ("javascript", "typescript", "tsx", "rust"):
                while end + 1 < len(lines) and not lines[end].rstrip().endswith((";", "'", '"')):
                    end += 1
                    if end - k > 40:
                        break
            out.append((k + 1, end + 1))
            k = end + 1
            continue
        k += 1
    return out


def _cost(text: str) -> int:
    return count_tokens(text)


def _header_lines(f: _File, cls: Definition) -> list[str]:
    """The class's header: its first line through the one that opens the body."""
    out = []
    for n in range(cls.line, min(cls.end_line, cls.line + 6) + 1):
        out.append(f.lines[n - 1])
        if f.lines[n - 1].rstrip().endswith((":", "{")):
            break
    return out


def body_tokens(lines: list[str], hit: SymbolHit) -> int:
    """Tokens of ``hit``'s body (with its doc comment and decorators)."""
    a, b = hit.span
    return count_tokens("\n".join(lines[a - 1 : b]))


def packing_order(hits: list[SymbolHit], cost: list[int]) -> list[SymbolHit]:
    """``hits`` in the order the packer tries them: score less a penalty that grows with
    the body's size (``cost``: its tokens), ties by the hits' own order."""
    key = [
        h.score - SIZE_PENALTY * math.log2(max(c, SIZE_FLOOR) / SIZE_FLOOR)
        for h, c in zip(hits, cost, strict=True)
    ]
    order = sorted(range(len(hits)), key=lambda k: (-round(key[k], 9), k))
    return [hits[k] for k in order]


class BodyPacker:
    """Chooses bodies for ``SymbolHit``s until ``budget`` tokens are used."""

    def __init__(self, root: Path, langs: dict[str, str], budget: int) -> None:
        self.root = root
        self.langs = langs
        self.budget = budget
        self.used = 0
        self.files: dict[str, _File] = {}
        self.order: list[str] = []
        self.chosen: list[SymbolHit] = []

    def packing(self, hits: list[SymbolHit]) -> list[SymbolHit]:
        """``hits`` in packing order (see ``packing_order``)."""
        cost = []
        for h in hits:
            f = self._file(h.path)
            cost.append(body_tokens(f.lines, h) if f is not None else 0)
        return packing_order(hits, cost)

    def _file(self, path: str) -> _File | None:
        f = self.files.get(path)
        if f is not None:
            return f
        try:
            text = (self.root / path).read_text("utf-8", "replace")
        except OSError:
            return None
        lang = self.langs.get(path, "")
        lines = text.splitlines()
        f = _File(path, lang, lines, imports=import_statements(lines, lang))
        self.files[path] = f
        return f

    def _covered(self, f: _File, d: Definition) -> bool:
        return f.whole or any(o.line <= d.line and d.end_line <= o.end_line for o in f.defs)

    def _imports_for(self, f: _File, body: str) -> tuple[set[int], int]:
        """Import statements the body uses that are not packed yet, and their cost."""
        names = set(IDENT_RE.findall(body)) - _NOT_NAMES
        new: set[int] = set()
        cost = 0
        for k, (a, b) in enumerate(f.imports):
            if k in f.used_imports:
                continue
            stmt = "\n".join(f.lines[a - 1 : b])
            idents = set(IDENT_RE.findall(stmt)) - _NOT_NAMES
            if f.lang in ("c", "cpp", "ruby") or idents & names:
                new.add(k)
                cost += _cost(stmt + "\n")
        return new, cost

    def _enclosing(self, f: _File, d: Definition, hits_defs: list[Definition]) -> Definition | None:
        if not d.scope:
            return None
        last = d.scope.rsplit(".", 1)[-1]
        best = None
        for c in hits_defs:
            if (
                c.kind in _CONTAINERS
                and c.name == last
                and c.line <= d.line
                and d.end_line <= c.end_line
                and c is not d
                and (best is None or c.line > best.line)
            ):
                best = c
        return best

    @staticmethod
    def _has_members(d: Definition, file_defs: list[Definition]) -> bool:
        """Whether definitions other than fields sit inside ``d`` (a Go struct has none)."""
        return any(
            o.kind in ("function", "method", "class")
            and d.line < o.line
            and o.end_line <= d.end_line
            for o in file_defs
        )

    def add(self, hit: SymbolHit, file_defs: list[Definition]) -> bool:
        """Take ``hit``'s body if it fits; ``file_defs`` are all definitions of its file."""
        f = self._file(hit.path)
        # the body as packed: with its doc comment and decorators
        d = hit.definition._replace(line=hit.span[0])
        if f is None or self._covered(f, d):
            return False
        whole_cost = _cost(f"# {f.path}\n" + "\n".join(f.lines) + "\n")
        share = FIRST_FILE_SHARE if not self.order or self.order == [f.path] else SMALL_FILE_SHARE
        if whole_cost <= max(64, int(self.budget * share)) and self._take_whole(f, whole_cost, hit):
            return True
        body = "\n".join(f.lines[d.line - 1 : d.end_line])
        cost = _cost(f"# {f.path}:{d.line}-{d.end_line}\n{body}\n")
        if d.kind in _CONTAINERS and cost > CLASS_MAX_TOKENS and self._has_members(d, file_defs):
            return False  # a large class is packed by its methods
        if hit.path not in self.order:
            cost += _cost(f"# {f.path}\n")
        cls = self._enclosing(f, d, file_defs)
        if cls is not None and cls.line not in f.headers and not self._covered(f, cls):
            cost += _cost(f"# {f.path}:{cls.line}\n" + "\n".join(_header_lines(f, cls)) + "\n")
        new_imports, import_cost = self._imports_for(f, body)
        cost += import_cost
        if self.used + cost > self.budget:
            return False
        self.used += cost
        # a class body taken whole covers the methods already chosen inside it
        f.defs = [o for o in f.defs if not (d.line <= o.line and o.end_line <= d.end_line)]
        f.defs.append(d)
        f.used_imports |= new_imports
        if cls is not None and not self._covered(f, cls):
            f.headers[cls.line] = cls
        if hit.path not in self.order:
            self.order.append(hit.path)
        self.chosen.append(hit)
        return True

    def _take_whole(self, f: _File, whole_cost: int, hit: SymbolHit) -> bool:
        already = _cost(self._render(f)) if f.path in self.order else 0
        if self.used - already + whole_cost > self.budget:
            return False  # the body alone may still fit
        self.used += whole_cost - already
        f.whole = True
        f.defs = [hit.definition]
        if f.path not in self.order:
            self.order.append(f.path)
        self.chosen.append(hit)
        return True

    def _render(self, f: _File) -> str:
        if f.whole:
            return f"# {f.path}\n" + "\n".join(f.lines) + "\n"
        parts = [f"# {f.path}\n"]
        for k in sorted(f.used_imports):
            a, b = f.imports[k]
            parts.append("\n".join(f.lines[a - 1 : b]) + "\n")
        blocks: list[tuple[int, str]] = []
        for cls in f.headers.values():
            if not any(o.line <= cls.line and cls.end_line <= o.end_line for o in f.defs):
                blocks.append(
                    (cls.line, f"# {f.path}:{cls.line}\n" + "\n".join(_header_lines(f, cls)) + "\n")
                )
        for d in f.defs:
            body = "\n".join(f.lines[d.line - 1 : d.end_line])
            blocks.append((d.line, f"# {f.path}:{d.line}-{d.end_line}\n{body}\n"))
        parts.extend(text for _, text in sorted(blocks))
        return "".join(parts)

    def _spans(self, f: _File) -> list[tuple[int, int]]:
        """Lines held verbatim: the bodies, the import statements and the class headers."""
        spans = [(d.line, d.end_line) for d in f.defs]
        spans += [f.imports[k] for k in sorted(f.used_imports)]
        for cls in f.headers.values():
            if not any(o.line <= cls.line and cls.end_line <= o.end_line for o in f.defs):
                spans.append((cls.line, cls.line + len(_header_lines(f, cls)) - 1))
        return spans

    def result(self) -> list[tuple[str, str, list[tuple[int, int]], list[str], bool]]:
        """Per file, in the order files were first chosen: (path, text, spans of the lines
        it holds verbatim, names, whole file?)."""
        out = []
        for path in self.order:
            f = self.files[path]
            names = [h.definition.qualified for h in self.chosen if h.path == path]
            spans = [(1, max(1, len(f.lines)))] if f.whole else self._spans(f)
            out.append((path, self._render(f), sorted(spans), names, f.whole))
        return out
