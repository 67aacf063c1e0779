"""Evidence markers that only look like markers: neutralised before the ``redact`` check wraps text.

The ``redact`` module neutralises any ``<untrusted-evidence ...>`` or ``</untrusted-evidence>``
inside the text it wraps, so sandbox output cannot close the wrapper and speak as the system. A
model reads the closing marker with a zero-width space before its ``>``, with fullwidth angle
brackets (U+FF1C, U+FF1E) or with a Cyrillic ``e`` (U+0435) as the same marker, while the
module's ASCII pattern does not. So the text is first read through a skeleton of the same length:
compatibility forms (NFKC: fullwidth, small forms), look-alike letters and punctuation mapped to
ASCII, invisible characters (format controls, combining marks, variation selectors) mapped to a
filler the pattern skips; each span that reads as a marker there is replaced in the original.
"""

from __future__ import annotations

import re
import unicodedata

REPLACEMENT = "[evidence-marker removed]"
_FILLER = "\0"
# Look-alikes that NFKC keeps apart from ASCII (a subset of Unicode's confusables, enough for
# the characters of the marker): Cyrillic, Greek and Armenian letters, dashes, slashes, angles.
_LOOKALIKE = dict(
    zip(
        "\u0430\u0435\u043e\u0440\u0441\u0443\u0445\u0456\u0458\u0455\u0501\u04bb"
        "\u03bd\u03c5\u03bf\u03b9\u03c4\u03b5\u0578\u057d\u057c\u0581\u0251\u0131"
        "\u1d1c\u1d20\u0274\u0280\u1d1b\u1d05\u1d07\ua731\u2010\u2011\u2012\u2013"
        "\u2014\u2015\u2212\u2043\u2215\u2044\u29f8\u2571\u2039\u3008\u27e8\u02c2"
        "\u1438\u276e\u27ea\u227a\u203a\u3009\u27e9\u02c3\u1433\u276f\u27eb\u227b",
        "aeopcyxijsdhvuoitenungaiuvnrtdes--------////<<<<<<<<>>>>>>>>",
        strict=True,
    )
)
_GAP = f"[{_FILLER}]*"
_MARKER = re.compile(
    f"<[\\s{_FILLER}]*(?:/[\\s{_FILLER}]*)?"
    + _GAP.join(re.escape(c) for c in "untrusted-evidence")
    + "[^>]*>",
    re.I,
)


def _skeleton_char(char: str) -> str:
    if char in _LOOKALIKE:
        return _LOOKALIKE[char]
    if unicodedata.category(char) in ("Cf", "Mn", "Me", "Cc") or 0xFE00 <= ord(char) <= 0xFE0F:
        return _FILLER
    folded = unicodedata.normalize("NFKC", char)
    if len(folded) == 1 and folded.isascii():
        return _LOOKALIKE.get(folded, folded)
    if len(folded) == 1 and folded in _LOOKALIKE:
        return _LOOKALIKE[folded]
    return char


def neutralise(text: str) -> tuple[str, int]:
    """``text`` with every marker look-alike replaced, and how many there were.

    Plain ASCII markers are left to the module (it counts them); only text with characters
    outside ASCII is read through the skeleton.
    """
    if text.isascii():
        return text, 0
    odd = {c for c in set(text) if not c.isascii() or c == _FILLER}
    table = {ord(c): _skeleton_char(c) for c in odd}
    skeleton = text.translate(table)
    spans = [m.span() for m in _MARKER.finditer(skeleton)]
    if not spans:
        return text, 0
    out, at = [], 0
    for start, end in spans:
        out += [text[at:start], REPLACEMENT]
        at = end
    out.append(text[at:])
    return "".join(out), len(spans)


__all__ = ["REPLACEMENT", "neutralise"]
