"""The code graph of a repository: files and symbols, linked by definitions, references and
imports, plus the BM25 postings over paths, symbol names and docstrings.

The built graph (``Graph``) is stored in the tag cache as a plain dict of lists and packed
arrays (``GraphData``) under the repository's fingerprint, so a warm run loads one blob instead
of rebuilding. Everything is ordered by sorted paths and names: no set or hash order leaks in.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, NamedTuple

from hybrid.context.resolve import Resolver, is_test_path
from hybrid.context.tags import Payload
from hybrid.context.text import terms

if TYPE_CHECKING:
    from hybrid.context.index import RepoIndex

GraphData = dict[str, Any]
"""A graph as stored in the tag cache (``Graph.data()``; marshal needs plain containers)."""

PATH_WEIGHT = 3  # BM25 term-frequency multiplier of path words


# Names every program uses from its language runtime: a repo that happens to define one
# (a method called ``str``, a type called ``Error``) must not collect every call to it.
_COMMON = frozenset(
    """abs all any ascii bin bool breakpoint bytearray bytes callable chr classmethod compile
    complex delattr dict dir divmod enumerate eval exec filter float format frozenset getattr
    globals hasattr hash help hex id input int isinstance issubclass iter len list locals map
    max memoryview min next object oct open ord pow print property range repr reversed round
    set setattr slice sorted staticmethod str sum super tuple type vars zip Exception
    ValueError TypeError KeyError IndexError AttributeError RuntimeError NotImplementedError
    NotImplemented OSError ImportError StopIteration AssertionError self cls
    console Object Array String Number Boolean Promise Math JSON Date Error Map Set Symbol
    require module exports parseInt parseFloat setTimeout document window
    append cap copy delete make new panic recover string error byte rune fmt
    Some None Ok Err Vec Box Option Result println format vec assert assert_eq clone unwrap
    into from default to_string iter
    System Integer List HashMap ArrayList Override equals hashCode toString
    printf fprintf sprintf snprintf malloc calloc realloc free memcpy memset strlen strcmp
    sizeof puts require_relative attr_reader attr_accessor raise""".split()  # noqa: SIM905
)


def _ref_weight(name: str, n_defs: int) -> float:
    """How much one reference to ``name`` says about the files that define it."""
    w = 0.05 if name in _COMMON else 1.0
    if name.startswith("_"):
        w *= 0.3
    if len(name) < 3:
        w *= 0.2
    if n_defs > 3:
        w *= 3.0 / n_defs
    return w


def path_terms(path: str) -> list[str]:
    """BM25 terms of a path (directory and file name words)."""
    return terms(path.replace("/", " ").replace(".", " ").replace("-", " "))


class Slim(NamedTuple):
    """What the graph needs of one file, in the order it is stored in the tag cache. Kept next
    to the graph so that a rebuild after a small change reads only the changed files' payloads."""

    lang: str
    names: list[str]
    """Defined names, qualified (``Class.method``), sorted and unique."""
    refs: dict[str, int]
    imports: list[str]
    terms: dict[str, int]
    n_defs: int
    error: str


# An unresolved reference to a name defined under more qualified names than this is spread
# over all of them only up to this many; beyond, it says little and would multiply edges.
MAX_FANOUT = 4


def qualified(name: str, scope: str) -> str:
    """The graph key of a definition: ``Scope.name``, or the bare name at top level."""
    return f"{scope}.{name}" if scope else name


def bare(key: str) -> str:
    """The name of a graph key (``Session.send`` -> ``send``)."""
    return key.rpartition(".")[2]


def slim(payload: Payload) -> Slim:
    """The part of a file's tags that the graph is built from."""
    return Slim(
        payload.lang,
        sorted({qualified(d[0], d[5]) for d in payload.defs}),
        payload.refs,
        payload.imports,
        payload.terms,
        len(payload.defs),
        payload.error,
    )


def names_index(graph: Graph) -> dict[str, list[int]]:
    """Bare name -> ids (into ``graph.symbols``) of the definitions with that name."""
    if graph.by_name is None:
        got: dict[str, list[int]] = {}
        for j, key in enumerate(graph.symbols):
            got.setdefault(bare(key), []).append(j)
        graph.by_name = got
    return graph.by_name


def _keys_by_name(keys: list[str], sym_id: dict[str, int]) -> dict[str, list[int]]:
    """Symbol ids of ``keys`` (sorted), grouped by their bare name."""
    out: dict[str, list[int]] = {}
    for key in keys:
        out.setdefault(bare(key), []).append(sym_id[key])
    return out


@dataclass
class Graph:
    """The file/symbol graph of a repository. Node ids: files ``0..n-1`` in path order, then
    symbols ``n..`` in name order; edges are packed arrays (``src``, ``dst``, ``weight``)."""

    paths: list[str]
    langs: list[str]
    tests: list[bool]
    """Whether each file is a test file."""
    symbols: list[str]
    definers: list[list[int]]
    """For each symbol, the files that define it."""
    src: bytes
    """Edge sources (int32)."""
    dst: bytes
    """Edge targets (int32)."""
    weight: bytes
    """Edge weights (float64)."""
    imports: list[list[int]]
    """For each file, the files it imports."""
    terms: list[dict[str, int]]
    """BM25 term frequencies of each file."""
    path_terms: list[list[str]]
    doc_len: bytes
    """BM25 document length of each file (float64)."""
    ndefs: list[int]
    errors: list[str]
    index: RepoIndex | None = None
    """The index the graph was loaded with (``load_graph`` sets it; never stored)."""
    by_name: dict[str, list[int]] | None = field(default=None, repr=False, compare=False)
    """Bare name -> ids into ``symbols`` (``names_index`` fills it; never stored)."""

    def data(self) -> GraphData:
        """The stored form: every field but ``index`` and ``by_name``, by name."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("index", "by_name")
        }

    @classmethod
    def from_data(cls, data: GraphData, index: RepoIndex | None = None) -> Graph:
        """The graph stored as ``data``."""
        return cls(**data, index=index)

    @property
    def repo_index(self) -> RepoIndex:
        """The index the graph was loaded with; a graph built without one has none."""
        if self.index is None:
            raise ValueError("this graph was built without its repository index")
        return self.index


def build_graph(files: dict[str, Slim]) -> Graph:
    """Build the file/symbol graph and the BM25 statistics from every file's ``Slim``.

    Symbols are keyed by qualified name. A reference (a bare name) goes to the definitions
    of that name in the same file, else to those in the files it imports, else to all of
    them (a name defined under many qualified names: to none, see ``MAX_FANOUT``)."""
    paths = sorted(files)
    file_id = {p: i for i, p in enumerate(paths)}
    n = len(paths)
    definers: dict[str, list[int]] = {}
    for i, p in enumerate(paths):
        for key in files[p].names:
            definers.setdefault(key, []).append(i)
    symbols = sorted(definers)
    sym_id = {key: j for j, key in enumerate(symbols)}
    sym_definers = [definers[key] for key in symbols]
    by_name: dict[str, list[int]] = {}
    for j, key in enumerate(symbols):
        by_name.setdefault(bare(key), []).append(j)
    name_weight = {}
    for name, ids in by_name.items():
        n_files = (
            len(definers[symbols[ids[0]]])
            if len(ids) == 1
            else len({i for j in ids for i in definers[symbols[j]]})
        )
        name_weight[name] = _ref_weight(name, n_files)

    src = array("i")
    dst = array("i")
    weight = array("d")
    resolver = Resolver(paths)
    resolved_memo: dict[tuple[str, str, str], list[str]] = {}
    imports: list[list[int]] = []
    for i, p in enumerate(paths):
        lang, specs = files[p].lang, files[p].imports
        targets: set[int] = set()
        folder = p.rpartition("/")[0]
        for spec in specs:
            memo_key = (folder, lang, spec)  # files of one folder resolve an import alike
            resolved = resolved_memo.get(memo_key)
            if resolved is None:
                resolved = resolved_memo[memo_key] = resolver.resolve(p, lang, spec)
            for target in resolved:
                t = file_id[target]
                if t != i:
                    targets.add(t)
        imports.append(sorted(targets))
    terms_of: list[dict[str, int]] = []
    path_terms_of: list[list[str]] = []
    doc_len = array("d")
    sqrt = math.sqrt
    for i, p in enumerate(paths):
        _lang, own, refs, _specs, tf, _n, _err = files[p]
        imported = imports[i]
        mine: dict[str, list[int]] | None = None  # name -> this file's keys, on first need
        near: set[int] | None = None  # the files it imports, on first need
        # references: file -> symbol (dict order is the parse order: deterministic)
        for name, count in refs.items():
            ids = by_name.get(name, [])
            if not ids:
                continue
            if len(ids) > 1:
                if mine is None:
                    mine = _keys_by_name(own, sym_id)
                local = mine.get(name)
                if local is None:
                    # The definitions of the name in the files this one imports: checked from
                    # the name's side, so a file importing half the repository costs no more.
                    if near is None:
                        near = set(imported)
                    local = [j for j in ids if not near.isdisjoint(sym_definers[j])]
                ids = local or (ids if len(ids) <= MAX_FANOUT else [])
            w = sqrt(count) * name_weight[name] / max(1, len(ids))
            for j in ids:
                src.append(i)
                dst.append(n + j)
                weight.append(w)
        # imports: file -> file
        for t in imported:
            src.append(i)
            dst.append(t)
            weight.append(2.0)
        words = path_terms(p)
        terms_of.append(tf)
        path_terms_of.append(words)
        doc_len.append(float(sum(tf.values()) + PATH_WEIGHT * len(words)))
    # definitions: symbol -> file
    for j, key in enumerate(symbols):
        for i in definers[key]:
            src.append(n + j)
            dst.append(i)
            weight.append(1.0)
    return Graph(
        paths=paths,
        langs=[files[p].lang for p in paths],
        tests=[is_test_path(p) for p in paths],
        symbols=symbols,
        definers=[definers[s] for s in symbols],
        src=src.tobytes(),
        dst=dst.tobytes(),
        weight=weight.tobytes(),
        imports=imports,
        terms=terms_of,
        path_terms=path_terms_of,
        doc_len=doc_len.tobytes(),
        ndefs=[files[p].n_defs for p in paths],
        errors=[files[p].error for p in paths],
    )


def importers(graph: Graph) -> list[list[int]]:
    """Reverse of ``graph.imports``: for each file, the files that import it."""
    out: list[list[int]] = [[] for _ in graph.paths]
    for i, targets in enumerate(graph.imports):
        for t in targets:
            out[t].append(i)
    return out
