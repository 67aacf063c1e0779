"""Skeletons keep the outline, drop the bodies, and (for Python) parse again."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hybrid
from hybrid.context.skeletons import skeleton, skeleton_source
from hybrid.errors import InvalidInput

PY = '''"""Module doc."""
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

RETRIES = 3
TABLE = {
    "a": 1,
    "b": 2,
    "c": 3,
}


@decorate(level=2)
class Engine(Base):
    """Runs things."""

    speed: int = 5

    def start(self, fuel: int) -> bool:
        """Start the engine."""
        secret_body_marker = fuel * 2
        return secret_body_marker > 0

    @property
    def name(self) -> str:
        return "engine"


async def main(argv=None):
    for x in range(3):
        print(x)


print("side effect at import")
'''


def test_python_keeps_outline_and_parses() -> None:
    out = skeleton_source(PY.encode(), "python")
    ast.parse(out)
    for kept in (
        '"""Module doc."""',
        "import os",
        "from collections.abc import Iterator",
        "RETRIES = 3",
        "TABLE = ...",
        "@decorate(level=2)",
        "class Engine(Base):",
        '"""Runs things."""',
        "speed: int = 5",
        "def start(self, fuel: int) -> bool:",
        '"""Start the engine."""',
        "@property",
        "async def main(argv=None):",
    ):
        assert kept in out, kept
    for dropped in ("secret_body_marker", "print(x)", "side effect"):
        assert dropped not in out


def test_python_skeletons_of_this_package_parse() -> None:
    root = Path(hybrid.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert len(files) > 10
    for path in files:
        out = skeleton(path)
        ast.parse(out, filename=str(path))
        assert len(out) <= len(path.read_text()) + 200


@pytest.mark.parametrize(
    ("lang", "source", "kept", "dropped"),
    [
        (
            "javascript",
            "import x from './x';\nfunction f(a) {\n  const hidden = a + 1;\n  return hidden;\n}\n",
            "function f(a) { /* ... */ }",
            "hidden",
        ),
        (
            "go",
            "package m\n\nfunc Add(a, b int) int {\n\tsum := a + b\n\treturn sum\n}\n",
            "func Add(a, b int) int { /* ... */ }",
            "sum :=",
        ),
        (
            "rust",
            "pub fn area(r: f64) -> f64 {\n    let pi = 3.14;\n    pi * r * r\n}\n",
            "pub fn area(r: f64) -> f64 { /* ... */ }",
            "let pi",
        ),
        (
            "java",
            "class A {\n  int f(int x) {\n    int hidden = x;\n    return hidden;\n  }\n}\n",
            "int f(int x) { /* ... */ }",
            "hidden",
        ),
        (
            "c",
            "#include <stdio.h>\nint main(void) {\n  int hidden = 1;\n  return hidden;\n}\n",
            "int main(void) { /* ... */ }",
            "hidden",
        ),
        ("ruby", "class A\n  def run(x)\n    hidden = x\n  end\nend\n", "def run(x)", "hidden"),
        ("ruby", "class A\n  def opts; { hidden: 1 } end\nend\n", "def opts;", "hidden"),
        (
            "typescript",
            "class A {\n  run(x: number): number {\n    const hidden = x;\n    return hidden;\n  }\n}\n",
            "run(x: number): number { /* ... */ }",
            "hidden",
        ),
    ],
)
def test_other_languages_elide_bodies(lang: str, source: str, kept: str, dropped: str) -> None:
    out = skeleton_source(source.encode(), lang)
    assert kept in out
    assert dropped not in out
    assert _errors(out.encode(), lang) == 0, out  # the skeleton parses again


def _errors(source: bytes, lang: str) -> int:
    from hybrid.context.languages import grammar

    _, parser, _ = grammar(lang)
    stack = [parser.parse(source).root_node]
    found = 0
    while stack:
        node = stack.pop()
        found += node.type == "ERROR" or node.is_missing
        stack.extend(node.children)
    return found


def test_unsupported_file(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(InvalidInput):
        skeleton(tmp_path / "notes.txt")
