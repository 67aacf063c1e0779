"""Fill a token budget with the bodies of ranked symbols, in symbol order across files.

Each body comes with what it takes to edit it correctly: the file's frame (imports, module
constants, class headers and fields: every line outside a function) when that is cheap,
else the fields or header of its enclosing class and the import lines the body uses. Fixes
touch those lines as often as bodies. A file small enough goes in whole. The text is per
file, in line order, each run of lines left out marked ``⋮``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from hybrid.context.resolve import test_spans
from hybrid.context.symbols import SymbolHit, leading_start
from hybrid.context.tags import FILE_KIND, Definition
from hybrid.context.text import IDENT_RE, count_tokens
from hybrid.paths import printable
from hybrid.repofs import Refused, read_text

FRAME_SHARE = 0.1  # a file's frame (all but its function bodies) costing at most this share
SMALL_FILE_SHARE = 0.25  # a whole file costing at most this share of the budget goes in whole
FIRST_FILE_SHARE = 0.84  # ... and the best symbol's file, up to this share: fixes spread out
CLASS_MAX_TOKENS = 400  # a larger class is represented by its methods, not its whole body
# A body's packing priority is its score less SIZE_PENALTY per doubling of its size above
# SIZE_FLOOR tokens. Fitted on fix commits (fit_symbols), no penalty does best: a big body
# the task matches is where the fix is as often as a small one.
SIZE_PENALTY = 0.0
SIZE_FLOOR = 100
_CONTAINERS = frozenset({"class", "interface", "module", "type"})
_ELIDED = frozenset({"function", "method"})
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
    imports: list[tuple[int, int]]  # import statement line spans
    shown: list[bool]  # per 1-based line (index 0 unused): held verbatim
    whole: bool = False
    framed: bool = False
    frames: dict[bool, list[bool]] = field(default_factory=dict)  # lean? -> frame_lines


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


_COMMENT = ("#", "//", "/*", "*", "--")
_NOT_COMMENT = ("#include", "#define", "#[", "#!")


def _prose(lines: list[str]) -> list[tuple[int, int]]:
    """Line spans of comment lines and triple-quoted docstring blocks."""
    out: list[tuple[int, int]] = []
    n = 0
    while n < len(lines):
        text = lines[n].strip().lstrip("rRbBuU")
        quote = text[:3] if text[:3] in ('"""', "'''") else ""
        if quote:
            end = n
            if text.count(quote) < 2 or len(text) < 6:
                end = next((k for k in range(n + 1, len(lines)) if quote in lines[k]), n)
            out.append((n + 1, end + 1))
            n = end + 1
            continue
        if text.startswith(_COMMENT) and not text.startswith(_NOT_COMMENT):
            out.append((n + 1, n + 1))
        n += 1
    return out


def frame_lines(lines: list[str], defs: list[Definition], lean: bool = False) -> list[bool]:
    """Per 1-based line, whether it belongs to the file's frame: every line outside the
    functions and methods (with their doc comments) and outside in-file test modules:
    imports, constants, class headers and fields, module-level code."""
    keep = [False] + [True] * len(lines)
    hidden = [(leading_start(lines, d.line), d.end_line) for d in defs if d.kind in _ELIDED]
    hidden += test_spans(defs)
    if lean:
        hidden += _prose(lines)
    for a, b in hidden:
        for n in range(a, min(b, len(lines)) + 1):
            keep[n] = False
    return keep


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


def _mark(shown: list[bool], a: int, b: int) -> None:
    for n in range(max(1, a), min(b, len(shown) - 1) + 1):
        shown[n] = True


class BodyPacker:
    """Chooses bodies for ``SymbolHit``s until ``budget`` tokens are used.

    A file is held whole, or as the lines it shows verbatim (the chosen bodies, their
    class headers or fields, the imports they use, and the file's frame when it is
    cheap), with each run of lines left out marked ``⋮``.
    """

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
            text = read_text(self.root, path)
        except Refused:
            return None
        lang = self.langs.get(path, "")
        lines = text.splitlines()
        f = _File(path, lang, lines, import_statements(lines, lang), [False] * (len(lines) + 1))
        self.files[path] = f
        return f

    def _imports_for(self, f: _File, body: str, shown: list[bool]) -> None:
        """Show the import statements whose names ``body`` uses."""
        names = set(IDENT_RE.findall(body)) - _NOT_NAMES
        for a, b in f.imports:
            if shown[a]:
                continue
            idents = set(IDENT_RE.findall("\n".join(f.lines[a - 1 : b]))) - _NOT_NAMES
            if f.lang in ("c", "cpp", "ruby") or idents & names:
                _mark(shown, a, b)

    @staticmethod
    def _enclosing(d: Definition, file_defs: list[Definition]) -> Definition | None:
        if not d.scope:
            return None
        last = d.scope.rsplit(".", 1)[-1]
        best = None
        for c in file_defs:
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

    @staticmethod
    def _frame(f: _File, file_defs: list[Definition], lean: bool = False) -> list[bool]:
        if lean not in f.frames:
            f.frames[lean] = frame_lines(f.lines, file_defs, lean)
        return f.frames[lean]

    def add(self, hit: SymbolHit, file_defs: list[Definition]) -> bool:
        """Take ``hit``'s body if it fits; ``file_defs`` are all definitions of its file."""
        f = self._file(hit.path)
        a, b = hit.span  # the body with its doc comment and decorators
        if f is None or f.whole or all(f.shown[a : b + 1]):
            return False
        whole_cost = _cost(f"# {printable(f.path)}\n" + "\n".join(f.lines) + "\n")
        share = FIRST_FILE_SHARE if not self.order or self.order == [f.path] else SMALL_FILE_SHARE
        d = hit.definition
        if d.kind == FILE_KIND:  # a file without definitions goes in whole or not at all
            return self._take_whole(f, whole_cost, hit)
        if whole_cost <= max(64, int(self.budget * share)) and self._take_whole(f, whole_cost, hit):
            return True
        body = "\n".join(f.lines[a - 1 : b])
        if (
            d.kind in _CONTAINERS
            and _cost(body) > CLASS_MAX_TOKENS
            and self._has_members(d, file_defs)
        ):
            return False  # a large class is packed by its methods
        before = _cost(self._render(f)) if f.path in self.order else 0
        shown = list(f.shown)
        _mark(shown, a, b)
        framed = f.framed
        if not framed:
            # the file's frame (imports, constants, class fields: fixes touch those lines
            # too) when it is cheap, else that frame without its comments and docstrings,
            # else the enclosing class's fields, else its header
            for lean in (False, True):
                frame = self._frame(f, file_defs, lean)
                with_frame = [x or y for x, y in zip(shown, frame, strict=True)]
                extra = _cost(self._render(f, with_frame)) - before - _cost(body)
                if extra <= self.budget * FRAME_SHARE:
                    shown, framed = with_frame, True
                    break
        if not framed:
            cls = self._enclosing(d, file_defs)
            if cls is not None:
                frame = self._frame(f, file_defs, lean=True)
                fields = [cls.line <= n <= cls.end_line and frame[n] for n in range(len(frame))]
                cost = sum(_cost(f.lines[n - 1] + "\n") for n in range(1, len(frame)) if fields[n])
                if cost <= CLASS_MAX_TOKENS:
                    shown = [x or y for x, y in zip(shown, fields, strict=True)]
                else:
                    _mark(shown, cls.line, cls.line + len(_header_lines(f, cls)) - 1)
            self._imports_for(f, body, shown)
        cost = _cost(self._render(f, shown)) - before
        if self.used + cost > self.budget:
            return False
        self.used += cost
        f.shown, f.framed = shown, framed
        if f.path not in self.order:
            self.order.append(f.path)
        self.chosen.append(hit)
        return True

    def _take_whole(self, f: _File, whole_cost: int, hit: SymbolHit) -> bool:
        already = _cost(self._render(f)) if f.path in self.order else 0
        if self.used - already + whole_cost > self.budget:
            return False  # the body alone may still fit
        self.used += whole_cost - already
        f.whole = True
        if f.path not in self.order:
            self.order.append(f.path)
        self.chosen.append(hit)
        return True

    def _render(self, f: _File, shown: list[bool] | None = None) -> str:
        """The file's text as packed: whole, or its shown lines with each run of lines
        left out marked ``⋮`` (blank lines between two such runs dropped)."""
        if f.whole:
            return f"# {printable(f.path)}\n" + "\n".join(f.lines) + "\n"
        shown = shown if shown is not None else f.shown
        out = [f"# {printable(f.path)}"]
        n, last = 1, len(f.lines)
        while n <= last:
            if shown[n]:
                out.append(f.lines[n - 1])
                n += 1
                continue
            m = n
            while m <= last and not shown[m]:
                m += 1
            if not any(ln.strip() for ln in f.lines[n - 1 : m - 1]):
                out.extend(f.lines[n - 1 : m - 1])  # blank lines: shown as they are
                n = m
                continue
            first = next(ln for ln in f.lines[n - 1 : m - 1] if ln.strip())
            while len(out) > 1 and not out[-1].strip() and out[-2].strip() == "⋮":
                out.pop()
            if out[-1].strip() != "⋮":
                out.append(first[: len(first) - len(first.lstrip())] + "⋮")
            n = m
        return "\n".join(out) + "\n"

    def _spans(self, f: _File) -> list[tuple[int, int]]:
        """Runs of lines held verbatim (blank lines between two runs join them)."""
        runs: list[tuple[int, int]] = []
        for n in range(1, len(f.lines) + 1):
            if f.shown[n] or (not f.lines[n - 1].strip() and runs and runs[-1][1] == n - 1):
                if runs and runs[-1][1] == n - 1:
                    runs[-1] = (runs[-1][0], n)
                else:
                    runs.append((n, n))
        return runs

    def result(self) -> list[tuple[str, str, list[tuple[int, int]], list[str], bool]]:
        """Per file, in the order files were first chosen: (path, text, spans of the lines
        it holds verbatim, names, whole file?)."""
        out = []
        for path in self.order:
            f = self.files[path]
            names = [h.definition.qualified for h in self.chosen if h.path == path]
            spans = [(1, max(1, len(f.lines)))] if f.whole else self._spans(f)
            out.append((path, self._render(f), spans, names, f.whole))
        return out
