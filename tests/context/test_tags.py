"""Definitions and references per language, from this project's tags queries."""

from __future__ import annotations

import pytest

from hybrid.context.languages import GRAMMARS, language_for, query_source
from hybrid.context.tags import FileTags, extract

CASES = {
    "python": (
        "import os\nfrom pkg.mod import thing\n\nLIMIT = 3\n\n"
        "class Greeter(Base):\n    def greet(self, name):\n        return format_name(name)\n\n"
        "def helper():\n    return Greeter().greet('x')\n",
        {"Greeter": "class", "greet": "method", "helper": "function", "LIMIT": "constant"},
        {"format_name", "Greeter", "Base"},
        {"os", "pkg.mod"},
    ),
    "javascript": (
        "import { render } from './view.js';\nconst API_URL = 'https://example.invalid';\n"
        "class Widget extends Base {\n  draw() { return render(this); }\n}\n"
        "function mount(el) { return new Widget(el); }\nconst unmount = (el) => cleanup(el);\n",
        {"Widget": "class", "draw": "method", "mount": "function", "unmount": "function"},
        {"render", "Widget", "cleanup", "Base"},
        {"./view.js"},
    ),
    "typescript": (
        "import { Store } from './store';\ninterface Shape { area(): number }\n"
        "type Id = string;\nenum Color { Red }\n"
        "export class Circle implements Shape {\n  area(): number { return compute(this.r); }\n}\n"
        "export function makeCircle(r: number): Circle { return new Circle(); }\n",
        {
            "Shape": "interface",
            "Id": "type",
            "Color": "type",
            "Circle": "class",
            "makeCircle": "function",
            "area": "method",
        },
        {"compute", "Circle", "Shape"},
        {"./store"},
    ),
    "tsx": (
        "import React from 'react';\nexport function App(props: Props) { return <Button label={props.x} />; }\n",
        {"App": "function"},
        {"Props"},
        {"react"},
    ),
    "go": (
        'package main\n\nimport "fmt"\n\nconst Version = "1"\n\ntype Server struct { addr string }\n\n'
        "func (s *Server) Start() error { return listen(s.addr) }\n\n"
        "func main() { fmt.Println(Version); NewServer() }\n",
        {"Server": "type", "Start": "method", "main": "function", "Version": "constant"},
        {"listen", "Println", "NewServer", "Server"},
        {"fmt"},
    ),
    "rust": (
        "use crate::net::Socket;\nmod util;\n\npub struct Conn { s: Socket }\n"
        "pub trait Reader { fn read(&self) -> u8; }\n"
        "impl Conn {\n    pub fn open() -> Conn { connect(); Conn { s: Socket::new() } }\n}\n"
        'const MAX: u32 = 3;\nfn main() { println!("hi"); Conn::open(); }\n',
        {
            "Conn": "class",
            "Reader": "interface",
            "open": "method",
            "main": "function",
            "MAX": "constant",
        },
        {"connect", "Socket", "println", "open"},
        {"crate::net::Socket", "util"},
    ),
    "java": (
        "package a.b;\nimport java.util.List;\n\npublic class Repo extends Base implements Store {\n"
        "  static final int LIMIT = 3;\n  public Repo() {}\n"
        "  public List<Item> load(String q) { return query(q, new Parser()); }\n}\n"
        "interface Store { void save(); }\n",
        {"Repo": "class", "load": "method", "Store": "interface", "LIMIT": "constant"},
        {"query", "Parser", "Base", "Item"},
        {"java.util.List"},
    ),
    "c": (
        '#include "list.h"\n#include <stdio.h>\n#define MAX_ITEMS 16\n'
        "struct node { int v; };\ntypedef struct node node_t;\n"
        "static int count_nodes(node_t *n) { return walk(n, 0); }\n"
        'int main(void) { printf("%d", count_nodes(0)); return 0; }\n',
        {
            "node": "class",
            "node_t": "type",
            "count_nodes": "function",
            "main": "function",
            "MAX_ITEMS": "constant",
        },
        {"walk", "printf", "count_nodes", "node_t"},
        {"list.h", "stdio.h"},
    ),
    "cpp": (
        '#include "shape.hpp"\nnamespace geo {\nclass Square : public Shape {\n public:\n'
        "  double area() const { return side * side; }\n  double side;\n};\n}\n"
        "double geo::total(const Square& s) { return compute(s.area()); }\n",
        {"geo": "module", "Square": "class", "area": "method", "total": "method"},
        {"compute", "area", "Shape", "Square"},
        {"shape.hpp"},
    ),
    "ruby": (
        "require 'json'\nrequire_relative 'lib/store'\n\nTIMEOUT = 5\n\nmodule Billing\n"
        "  class Invoice < Record\n    def total\n      compute_sum(lines)\n    end\n"
        "    def self.build(x)\n      Invoice.new(x)\n    end\n  end\nend\n",
        {
            "Billing": "module",
            "Invoice": "class",
            "total": "method",
            "build": "method",
            "TIMEOUT": "constant",
        },
        {"compute_sum", "Record", "Invoice"},
        {"json", "lib/store"},
    ),
}


@pytest.mark.parametrize("lang", sorted(CASES))
def test_definitions_references_imports(lang: str) -> None:
    source, defs, refs, imports = CASES[lang]
    tags = FileTags.from_payload("x", extract(source.encode(), lang))
    found = {(d.name, d.kind) for d in tags.definitions}
    for name, kind in defs.items():
        assert (name, kind) in found, (name, kind, found)
    assert refs <= set(tags.references), set(tags.references)
    assert imports <= set(tags.imports), tags.imports
    for d in tags.definitions:
        assert d.line >= 1 and d.end_line >= d.line and d.signature


def test_every_grammar_has_a_case_and_a_query() -> None:
    assert set(GRAMMARS) == set(CASES)
    for lang in GRAMMARS:
        assert "@definition." in query_source(lang)


def test_signatures_and_lines() -> None:
    source, *_ = CASES["python"]
    tags = FileTags.from_payload("x", extract(source.encode(), "python"))
    greet = next(d for d in tags.definitions if d.name == "greet")
    assert greet.signature == "def greet(self, name):"
    assert (greet.line, greet.end_line) == (7, 8)


@pytest.mark.parametrize(
    ("lang", "source", "signature"),
    [
        # requests' Session.__init__: the `#:` notes before the first statement.
        (
            "python",
            "class S:\n    def __init__(self) -> None:\n        #: headers sent\n"
            "        #: on each request\n        self.headers = {}\n",
            "def __init__(self) -> None:",
        ),
        ("python", "def bypass(host: str) -> bool:  # noqa\n    return True\n", None),
        ("python", "def f(a,  # the first\n      b):\n    pass\n", "def f(a, b):"),
        ("rust", "fn main(a: u32 /* the a */, b: u32) -> u32 { a }\n", None),
        ("go", "func Run(a int, // first\n\tb int) error {\n\treturn nil\n}\n", None),
    ],
)
def test_signatures_leave_comments_out(lang: str, source: str, signature: str | None) -> None:
    defs = extract(source.encode(), lang).defs
    shown = [d[4] for d in defs]
    assert not any(mark in s for s in shown for mark in ("#", "//", "/*")), shown
    if signature is not None:
        assert signature in shown


def test_language_detection() -> None:
    assert language_for("a/b.py") == "python"
    assert language_for("x.tsx") == "tsx"
    assert language_for("x.hpp") == "cpp"
    assert language_for("x.lua") == "ctags:Lua"
    assert language_for("README.md") is None


def test_public_names_resolve() -> None:
    import hybrid.context as ctx

    for name in ctx.__all__:
        assert getattr(ctx, name) is not None, name
