"""The code graph of a repository: files and symbols, linked by definitions, references and
imports, plus the BM25 postings over paths, symbol names and docstrings.

The built graph (``Graph``) is stored in the tag cache as a plain dict of lists and packed
arrays (``GraphData``) under the repository's fingerprint, so a warm run loads one blob instead
of rebuilding. Everything is ordered by sorted paths and names: no set or hash order leaks in.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
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


def _by_bare_name(symbols: list[str]) -> dict[str, list[int]]:
    got: dict[str, list[int]] = {}
    for j, key in enumerate(symbols):
        got.setdefault(key.rpartition(".")[2], []).append(j)
    return got


def names_index(graph: Graph) -> dict[str, list[int]]:
    """Bare name -> ids (into ``graph.symbols``) of the definitions with that name."""
    if graph.by_name is None:
        graph.by_name = _by_bare_name(graph.symbols)
    return graph.by_name


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
    keys: list[str] = field(default_factory=list)
    """The tag-cache key each file's ``Slim`` was read under (``load_graph`` sets them), so a
    later build can tell which files changed and patch only their edges (``patch_graph``)."""
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


class _Linker:
    """Resolves one file's references to symbol ids, from what the whole graph defines."""

    def __init__(
        self,
        n_files: int,
        symbols: list[str],
        definers: list[list[int]],
        by_name: dict[str, list[int]] | None = None,
    ) -> None:
        self.n = n_files
        self.symbols = symbols
        self.definers = definers
        self.by_name = by_name if by_name is not None else _by_bare_name(symbols)
        self._weights: dict[str, float] = {}
        self._files: dict[str, tuple[frozenset[int], dict[int, list[int]]]] = {}

    def files_of(self, name: str) -> tuple[frozenset[int], dict[int, list[int]]]:
        """The files that define ``name`` (under any qualified name), and by each of them the
        ids of its definitions of it (ascending)."""
        got = self._files.get(name)
        if got is None:
            by_file: dict[int, list[int]] = {}
            for j in self.by_name[name]:
                for i in self.definers[j]:
                    by_file.setdefault(i, []).append(j)
            got = self._files[name] = (frozenset(by_file), by_file)
        return got

    def weight(self, name: str) -> float:
        """``_ref_weight`` of a name, by the number of files that define it."""
        w = self._weights.get(name)
        if w is None:
            ids = self.by_name[name]
            n_files = len(self.definers[ids[0]]) if len(ids) == 1 else len(self.files_of(name)[0])
            w = self._weights[name] = _ref_weight(name, n_files)
        return w

    def edges(
        self, i: int, refs: dict[str, int], imported: list[int]
    ) -> tuple[list[int], list[float]]:
        """Targets and weights of file ``i``'s edges: its references, then its imports.

        A reference (a bare name) goes to the definitions of that name in the same file, else
        to those in the files it imports, else to all of them (a name defined under many
        qualified names: to none, see ``MAX_FANOUT``)."""
        dst: list[int] = []
        weight: list[float] = []
        by_name, weights, files_of, n = self.by_name, self._weights, self._files, self.n
        near: set[int] | None = None  # the files it imports, on first need
        # dict order is the parse order: deterministic
        for name, count in refs.items():
            ids = by_name.get(name)
            if not ids:
                continue
            if len(ids) > 1:
                got = files_of.get(name)
                files, by_file = got if got is not None else self.files_of(name)
                local = by_file.get(i)  # this file's own definitions of the name
                if local is None:
                    # The definitions of the name in the files this one imports: checked from
                    # the name's side, so a file importing half the repository costs no more.
                    if near is None:
                        near = set(imported)
                    shared = near & files
                    if not shared:
                        local = []
                    elif len(shared) == 1:
                        local = by_file[shared.pop()]
                    else:  # ascending ids, each once (a symbol may be defined in two of them)
                        local = sorted({j for f in shared for j in by_file[f]})
                ids = local or (ids if len(ids) <= MAX_FANOUT else [])
                if not ids:
                    continue
            w = weights.get(name)
            if w is None:
                w = self.weight(name)
            w = math.sqrt(count) * w / len(ids)
            for j in ids:
                dst.append(n + j)
                weight.append(w)
        for t in imported:
            dst.append(t)
            weight.append(2.0)
        return dst, weight


def _doc_len(tf: dict[str, int], words: list[str]) -> float:
    return float(sum(tf.values()) + PATH_WEIGHT * len(words))


def build_graph(files: dict[str, Slim], keys: dict[str, str] | None = None) -> Graph:
    """Build the file/symbol graph and the BM25 statistics from every file's ``Slim``.

    Symbols are keyed by qualified name; references resolve as ``_Linker.edges`` says.
    ``keys`` (path -> tag-cache key) are kept so that ``patch_graph`` can update the graph."""
    paths = sorted(files)
    file_id = {p: i for i, p in enumerate(paths)}
    n = len(paths)
    definers: dict[str, list[int]] = {}
    for i, p in enumerate(paths):
        for key in files[p].names:
            definers.setdefault(key, []).append(i)
    symbols = sorted(definers)
    sym_definers = [definers[key] for key in symbols]
    linker = _Linker(n, symbols, sym_definers)

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
    for i, p in enumerate(paths):
        _lang, _own, refs, _specs, tf, _n, _err = files[p]
        targets_i, weights_i = linker.edges(i, refs, imports[i])
        src.extend([i] * len(targets_i))
        dst.extend(targets_i)
        weight.extend(weights_i)
        words = path_terms(p)
        terms_of.append(tf)
        path_terms_of.append(words)
        doc_len.append(_doc_len(tf, words))
    # definitions: symbol -> file
    for j, key in enumerate(symbols):
        for i in definers[key]:
            src.append(n + j)
            dst.append(i)
            weight.append(1.0)
    graph = Graph(
        paths=paths,
        langs=[files[p].lang for p in paths],
        tests=[is_test_path(p) for p in paths],
        symbols=symbols,
        definers=sym_definers,
        src=src.tobytes(),
        dst=dst.tobytes(),
        weight=weight.tobytes(),
        imports=imports,
        terms=terms_of,
        path_terms=path_terms_of,
        doc_len=doc_len.tobytes(),
        ndefs=[files[p].n_defs for p in paths],
        errors=[files[p].error for p in paths],
        keys=[keys[p] for p in paths] if keys is not None else [],
    )
    graph.by_name = linker.by_name
    return graph


PATCH_MAX_FILES = 64
"""Beyond this many changed files a full build is about as fast as patching."""


def patch_graph(
    old: Graph, keys: dict[str, str], slims: Callable[[set[str]], dict[str, Slim]]
) -> Graph | None:
    """``old`` updated to the files now under ``keys`` (path -> tag-cache key), or None when
    only a full build can say: a file added, removed or renamed, a definition or an import
    changed, too many files changed, or a slim no longer cached.

    A change inside bodies alters only the changed files' own reference edges and BM25 terms:
    every symbol id, every import and every other file's edges stay as they were, so the
    result equals ``build_graph`` of the new files (the tests check it)."""
    if not old.keys or old.paths != sorted(keys):
        return None
    changed = [i for i, p in enumerate(old.paths) if old.keys[i] != keys[p]]
    if len(changed) > PATCH_MAX_FILES:
        return None
    wanted = {old.keys[i] for i in changed} | {keys[old.paths[i]] for i in changed}
    got = slims(wanted)
    if not wanted <= set(got):
        return None
    for i in changed:
        before, after = got[old.keys[i]], got[keys[old.paths[i]]]
        if (before.lang, before.names, before.imports) != (after.lang, after.names, after.imports):
            return None
    n = len(old.paths)
    # A patch keeps every symbol, so the old graph's name index (when it has one) still holds.
    linker = _Linker(n, old.symbols, old.definers, old.by_name)
    src, dst, weight = array("i"), array("i"), array("d")
    src.frombytes(old.src)
    dst.frombytes(old.dst)
    weight.frombytes(old.weight)
    terms_of, ndefs, errors, new_keys = (
        list(old.terms),
        list(old.ndefs),
        list(old.errors),
        list(old.keys),
    )
    doc_len = array("d")
    doc_len.frombytes(old.doc_len)
    # Edge sources ascend (files in order, then symbols), so a file's edges are one slice;
    # patching from the last file back keeps the earlier slices where they are.
    for i in reversed(changed):
        after = got[keys[old.paths[i]]]
        targets_i, weights_i = linker.edges(i, after.refs, old.imports[i])
        lo, hi = bisect_left(src, i), bisect_left(src, i + 1)
        src[lo:hi] = array("i", [i] * len(targets_i))
        dst[lo:hi] = array("i", targets_i)
        weight[lo:hi] = array("d", weights_i)
        terms_of[i] = after.terms
        doc_len[i] = _doc_len(after.terms, old.path_terms[i])
        ndefs[i], errors[i] = after.n_defs, after.error
        new_keys[i] = keys[old.paths[i]]
    graph = replace(
        old,
        src=src.tobytes(),
        dst=dst.tobytes(),
        weight=weight.tobytes(),
        terms=terms_of,
        doc_len=doc_len.tobytes(),
        ndefs=ndefs,
        errors=errors,
        keys=new_keys,
        index=None,
    )
    graph.by_name = linker.by_name
    return graph


def importers(graph: Graph) -> list[list[int]]:
    """Reverse of ``graph.imports``: for each file, the files that import it."""
    out: list[list[int]] = [[] for _ in graph.paths]
    for i, targets in enumerate(graph.imports):
        for t in targets:
            out[t].append(i)
    return out
