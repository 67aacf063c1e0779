"""The gate's secret scan: credentials a patch adds, judged precisely enough to block on.

Evidence redaction (the ``redact`` check) errs towards scrubbing: any ``token: ...`` is hidden
from a model. A gate that blocks a patch must err the other way, or correct fixes are refused
(semver's ``token: Optional[str] = "rc"``). So this scan looks for credentials by their known
formats (AWS, GitHub, Slack, Google, Stripe, OpenAI/Anthropic keys, private key blocks, JWTs) and
for assignments of a long, high-entropy literal to a credential-like name (``*_KEY``, ``*_TOKEN``,
``*_SECRET``, ``password``), never for names alone. It reads what git writes: each added line
of a text file, the whole content of a binary one. Every pattern is linear: the assignment rule
finds the name words first and looks a bounded distance around each.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from collections.abc import Iterable

# (kind, literals one of which every match contains, pattern). A pattern starts with a literal
# where it can (Python's re then skips ahead to it); the word boundary before a match is checked
# on the match, not by a look-behind that would run at every position.
FORMATS: list[tuple[str, tuple[str, ...], re.Pattern[str]]] = [
    ("private_key", ("PRIVATE KEY",), re.compile(r"-----BEGIN (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----")),
    (
        "aws_access_key_id",
        ("AKIA", "ASIA", "AGPA", "AIDA", "AROA", "AIPA", "ANPA", "ANVA", "ABIA", "ACCA"),
        re.compile(r"A(?:KIA|SIA|GPA|IDA|ROA|IPA|NPA|NVA|BIA|CCA)[A-Z0-9]{16}(?![A-Z0-9])"),
    ),
    ("github_token", ("gh", "github_pat_"), re.compile(r"(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})")),
    ("slack_token", ("xox",), re.compile(r"xox[abposr]-[A-Za-z0-9-]{10,}")),
    ("slack_webhook", ("hooks.slack.com",), re.compile(r"hooks\.slack\.com/services/T[A-Za-z0-9]{6,}/B[A-Za-z0-9]{6,}/[A-Za-z0-9]{16,}")),
    ("gcp_api_key", ("AIza",), re.compile(r"AIza[0-9A-Za-z_-]{35}")),
    ("stripe_key", ("k_live_",), re.compile(r"[sr]k_live_[0-9A-Za-z]{16,}")),
    ("api_key", ("sk-",), re.compile(r"sk-(?:ant-|proj-)?[A-Za-z0-9_-]{32,}")),
    ("jwt", ("eyJ",), re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
]  # fmt: skip
_WORD_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_NAME_HINTS = ("pass", "pwd", "secret", "token", "key", "credential")

_NAME_WORD = re.compile(
    r"passw(?:or)?d|passwd|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|"
    r"private[_-]?key|auth[_-]?key|signing[_-]?key|encryption[_-]?key|credential|"
    r"client[_-]?secret|_key\b|_KEY\b",
    re.I,
)
_IDENT_RUN = re.compile(r"[A-Za-z0-9_.\-]{0,64}")
_VALUE = re.compile(
    # An optional annotation (`SECRET_KEY: str = "..."`), the operator, then the value.
    r"""\s*["']?(?:\s*:\s*[A-Za-z_][A-Za-z0-9_.\[\], |]{0,64}?(?=\s*=[^=]))?"""
    r"""\s*(?:=>|:=|=(?!=)|:)\s*(?:[a-zA-Z]{0,2}(?P<q>["'`])(?P<quoted>[^"'`\n]{1,512})(?P=q)|(?P<bare>[^\s"'`,;#]{1,512}))"""
)
_PLACEHOLDER = re.compile(
    r"example|placeholder|changeme|dummy|sample|your[_-]|redacted|xxxx|\*\*\*|\$\{|\{\{|%\(|^<.*>$",
    re.I,
)
_CONFIG_SUFFIXES = (".env", ".ini", ".cfg", ".conf", ".properties", ".yml", ".yaml", ".toml")


def _entropy(value: str) -> float:
    counts = Counter(value)
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def _switches(value: str) -> float:
    letters = [c.isupper() for c in value if c.isalpha()]
    return sum(a != b for a, b in itertools.pairwise(letters)) / max(len(letters) - 1, 1)


def looks_secret(value: str) -> bool:
    """A value long and random enough to be a credential, not a word, path or expression."""
    if len(value) < 16 or any(c.isspace() for c in value) or _PLACEHOLDER.search(value):
        return False
    if value.startswith(("/", "./", "../", "http://", "https://")) or "://" in value:
        return False
    classes = sum(
        (
            any(c.isupper() for c in value),
            any(c.islower() for c in value),
            any(c.isdigit() for c in value),
        )
    )
    if classes < 2 or sum(c.isalnum() for c in value) < 0.75 * len(value):
        return False
    # Words and CamelCase names (BearerTokenTypeForAuth) switch case only at word starts;
    # random tokens carry digits, or are long and switch case at most characters.
    if not any(c.isdigit() for c in value) and (len(value) < 32 or _switches(value) < 0.4):
        return False
    return _entropy(value) >= (3.0 if len(value) < 24 else 3.5)


def _assignments(text: str, bare_ok: bool) -> Iterable[str]:
    last = -1
    for hit in _NAME_WORD.finditer(text):
        if hit.start() < last:
            continue  # a second name word inside the same name (SECRET_KEY)
        ident = _IDENT_RUN.match(text, hit.end())
        last = ident.end() if ident else hit.end()
        value = _VALUE.match(text, last)
        if value is None:
            continue
        if value["quoted"] is not None:
            yield value["quoted"]
        elif bare_ok and value["bare"] is not None:
            yield value["bare"]


def scan_text(text: str, path: str = "") -> Counter[str]:
    """Credential kinds found in ``text`` (the added lines of one file), with their counts."""
    found: Counter[str] = Counter()
    bare_ok = path.rsplit("/", 1)[-1].startswith(".env") or path.endswith(_CONFIG_SUFFIXES)
    for kind, hints, pattern in FORMATS:
        if any(h in text for h in hints):
            found[kind] += sum(
                m.start() == 0 or text[m.start() - 1] not in _WORD_CHARS
                for m in pattern.finditer(text)
            )
    lower = text.lower()
    if any(h in lower for h in _NAME_HINTS):
        lines = [line for line in text.splitlines() if any(h in line.lower() for h in _NAME_HINTS)]
        found["assignment"] += sum(looks_secret(v) for v in _assignments("\n".join(lines), bare_ok))
    return +found


def added_text(old: bytes | None, new: bytes) -> str:
    """What ``new`` adds over ``old``: its lines not in ``old`` (text), or all of it (binary)."""
    binary = b"\0" in new[:8192] or b"\0" in (old or b"")[:8192]
    try:
        text = new.decode("utf-8")
    except UnicodeDecodeError:
        binary = True
    if binary:
        # Credentials are ASCII: a byte-for-byte view keeps them findable inside any binary.
        return new.decode("latin-1")
    before = Counter((old or b"").decode("utf-8", "replace").splitlines())
    kept = []
    for line in text.splitlines():
        if before[line] > 0:
            before[line] -= 1
        else:
            kept.append(line)
    return "\n".join(kept)


__all__ = ["FORMATS", "added_text", "looks_secret", "scan_text"]
