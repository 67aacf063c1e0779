"""Word and identifier tokenization shared by BM25, task parsing and token budgets."""

from __future__ import annotations

import re

IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WORD_RE = re.compile(r"[A-Za-z][a-z]+|[A-Z]+(?![a-z])|[0-9]+")
STOPWORDS = frozenset(
    """a an and are as at be been but by can could do does did for from has have had if in
    into is it its of on or not no so such that the their then there these this those to
    was were will with when where which while who why how what all any also may might must
    should would use used using via we you your our i me my he she they them than too very
    just only self cls none true false return def class import none null nil new var let
    const fn func get set add fix fixed fixes fixing bug bugs issue issues error errors
    make makes made work works change changes changed update updated support supports case
    cases pr closes""".split()  # noqa: SIM905
)


_STEM_MEMO: dict[str, str] = {}


def stem(word: str) -> str:
    """A tiny suffix stripper: enough to match "parsing"/"parser"/"parse" in BM25."""
    got = _STEM_MEMO.get(word)
    if got is None:
        got = _STEM_MEMO[word] = _stem(word) if len(_STEM_MEMO) < 500_000 else word
    return got


def _stem(word: str) -> str:
    for suffix in ("ations", "ation", "ings", "ing", "ers", "er", "ies", "es", "ed", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return word


def split_identifier(name: str) -> list[str]:
    """``parseHTTPResponse_v2`` -> ["parse", "http", "response", "v", "2"] (lower case)."""
    return [part.lower() for part in _WORD_RE.findall(name)]


_NAME_MEMO: dict[str, list[str]] = {}


def name_terms(name: str) -> list[str]:
    """BM25 terms of one identifier (memoized: names repeat a lot)."""
    got = _NAME_MEMO.get(name)
    if got is None:
        parts = split_identifier(name)
        got = [stem(p) for p in parts if len(p) > 1 and p not in STOPWORDS]
        if len(parts) > 1:
            got.append(name.lower())
        if len(_NAME_MEMO) < 500_000:
            _NAME_MEMO[name] = got
    return got


_IDENT_MEMO: dict[str, list[str]] = {}


def ident_terms(ident: str) -> list[str]:
    """BM25 terms of one identifier as ``terms`` splits it (memoized)."""
    got = _IDENT_MEMO.get(ident)
    if got is None:
        got = []
        parts = split_identifier(ident)
        if len(parts) > 1:
            whole = ident.lower()
            if whole not in STOPWORDS:
                got.append(whole)
        for part in parts:
            if len(part) > 1 and part not in STOPWORDS:
                got.append(stem(part))
        if len(_IDENT_MEMO) < 500_000:
            _IDENT_MEMO[ident] = got
    return got


def terms(text: str) -> list[str]:
    """BM25 terms of free text or code: identifiers split into stemmed sub-words, plus the
    whole identifier when it is compound."""
    out: list[str] = []
    for ident in IDENT_RE.findall(text):
        out.extend(ident_terms(ident))
    return out


def count_tokens(text: str) -> int:
    """Approximate LLM tokens: one per four characters (rounded up), at least one per line.

    A model-free estimate that is close to BPE tokenizers on source code; every budget in
    hybrid.context is enforced with it.
    """
    return max((len(text) + 3) // 4, text.count("\n"))
