"""Scoped symbol keys, task-chosen symbols in the map, and symbol-ordered body packing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hybrid.context.pack import context_pack
from hybrid.context.repomap import repo_map
from hybrid.context.tags import Definition, extract, qualified_signature

TASK = "Session.request should merge environment proxies when trust_env is set"


def _filler(prefix: str, n: int) -> str:
    """Unrelated functions that make a file too big to pack whole."""
    return "".join(
        f"\n\ndef {prefix}_{k}(value, factor=2):\n"
        f'    """Scale a {prefix} value by a factor."""\n'
        + "".join(f"    value = value * factor + {j}\n" for j in range(12))
        + "    return value\n"
        for k in range(n)
    )


REQUESTS_LIKE = {
    "reqs/__init__.py": "from .sessions import Session\n",
    "reqs/utils.py": (
        "import os\n\n\n"
        "def resolve_proxies(request, proxies, trust_env=True):\n"
        '    """Proxies for a request, from the environment when trust_env is set."""\n'
        "    proxies = proxies if proxies is not None else {}\n"
        "    if trust_env:\n"
        "        proxies.setdefault('https', os.environ.get('HTTPS_PROXY'))\n"
        "    return proxies\n" + _filler("checksum", 25)
    ),
    "reqs/sessions.py": (
        "from collections import OrderedDict\n"
        "from .utils import resolve_proxies\n"
        "import json\n\n\n"
        "class SessionRedirectMixin:\n"
        '    """Redirect handling."""\n\n'
        "    def send(self, request):\n"
        "        return request\n\n"
        "    def rebuild_proxies(self, prepared_request, proxies):\n"
        '        """Re-evaluate proxies for a redirect."""\n'
        "        return resolve_proxies(prepared_request, proxies, self.trust_env)\n\n\n"
        "class Session(SessionRedirectMixin):\n"
        '    """A session."""\n\n'
        "    def __init__(self):\n"
        "        self.trust_env = True\n"
        "        self.proxies = OrderedDict()\n\n"
        "    def send(self, request):\n"
        "        return json.dumps(request)\n\n"
        "    def request(self, method, url, params=None, data=None, headers=None, cookies=None,"
        " files=None, auth=None, timeout=None, allow_redirects=True, proxies=None, hooks=None,"
        " stream=None, verify=None, cert=None, json=None):\n"
        "        settings = self.merge_environment_settings(url, proxies or {}, stream, verify, cert)\n"
        "        return self.send((method, url, settings))\n\n"
        "    def merge_environment_settings(self, url, proxies, stream, verify, cert):\n"
        '        """Merge the environment into the request settings."""\n'
        "        if self.trust_env:\n"
        "            proxies = resolve_proxies(url, proxies, self.trust_env)\n"
        "        return {'proxies': proxies, 'stream': stream}\n\n"
        + "".join(
            f"    def {verb}(self, url, **kwargs):\n"
            f"        return self.request('{verb.upper()}', url, **kwargs)\n\n"
            for verb in ("get", "post", "put", "patch", "delete", "options", "head")
        )
        + "    def close(self):\n        pass\n\n"
        "    def mount(self, prefix, adapter):\n        pass\n" + _filler("adapter", 30)
    ),
    "tests/test_sessions.py": (
        "from reqs.sessions import Session\n\n\n"
        "def test_session_environment_proxies():\n"
        "    assert Session().merge_environment_settings('u', {}, None, None, None)\n"
    ),
}


@pytest.fixture
def requests_like(tmp_path: Path, git: Any, write: Any) -> Path:
    repo = tmp_path / "reqs"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write(repo, REQUESTS_LIKE)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    return repo


def _defs(source: str, lang: str) -> list[Definition]:
    return [Definition(*d) for d in extract(source.encode(), lang)[1]]


@pytest.mark.parametrize(
    ("lang", "source", "expected"),
    [
        ("python", "class A:\n    def send(self):\n        pass\n", {"A", "A.send"}),
        (
            "go",
            "package m\n\ntype Command struct{}\n\nfunc (c *Command) Execute() error { return nil }\n",
            {"Command", "Command.Execute"},
        ),
        (
            "rust",
            "struct S;\nimpl S {\n    fn build(&self) -> u8 { 1 }\n}\n",
            {"S", "S.build"},
        ),
        (
            "java",
            "class Gson {\n  String toJson(Object o) { return null; }\n}\n",
            {"Gson", "Gson.toJson"},
        ),
        (
            "javascript",
            "class Router {\n  route(p) { return p; }\n}\nres.send = function send(b) { return b; };\n",
            {"Router", "Router.route", "res.send"},
        ),
        (
            "ruby",
            "module Rack\n  class Request\n    def ip\n    end\n  end\nend\n",
            {"Rack", "Rack.Request", "Rack.Request.ip"},
        ),
    ],
)
def test_definitions_carry_their_scope(lang: str, source: str, expected: set[str]) -> None:
    assert {d.qualified for d in _defs(source, lang)} == expected


def test_qualified_signature_keeps_go_receivers() -> None:
    py = _defs("class A:\n    def send(self, x):\n        pass\n", "python")[1]
    assert qualified_signature(py) == "def A.send(self, x):"
    go = _defs("package m\n\nfunc (c *Command) Execute() error { return nil }\n", "go")[0]
    assert qualified_signature(go) == "func (c *Command) Execute() error"


def test_map_shows_task_symbols_scoped_and_whole(requests_like: Path) -> None:
    result = repo_map(requests_like, TASK, tokens=2048)
    text = result.text
    for name in (
        "Session.merge_environment_settings",
        "SessionRedirectMixin.rebuild_proxies",
        "resolve_proxies",
        "Session.request",
    ):
        assert name in text, text
    # two `send` methods, each under its class
    assert "SessionRedirectMixin.send" in text or "Session.send" in text
    assert "def send(" not in text
    # the long signature is wrapped, never cut
    assert "..." not in text
    request_lines = text.split("def Session.request(", 1)[1].split("\n")
    assert "json=None):" in "".join(request_lines[:6])
    assert all(len(line) <= 100 for line in text.splitlines())


def test_pack_holds_the_task_bodies_with_context(requests_like: Path) -> None:
    pack = context_pack(requests_like, TASK, tokens=2000)
    assert pack.tokens <= 2000
    bodies = {item.path: item for item in pack.items if item.kind == "symbols"}
    sessions = bodies["reqs/sessions.py"].text
    assert "def merge_environment_settings(" in sessions
    assert "resolve_proxies(prepared_request, proxies, self.trust_env)" in sessions
    assert "class Session(SessionRedirectMixin):" in sessions  # the enclosing class header
    assert "from .utils import resolve_proxies" in sessions  # the import the body uses
    order = bodies["reqs/sessions.py"].reason.split("bodies of ", 1)[1]
    assert order.startswith("Session.merge_environment_settings"), order  # best symbol first
    assert "if trust_env:" in bodies["reqs/utils.py"].text
    spans = bodies["reqs/sessions.py"].spans
    line = (
        REQUESTS_LIKE["reqs/sessions.py"]
        .splitlines()
        .index("    def merge_environment_settings(self, url, proxies, stream, verify, cert):")
    )
    assert any(a <= line + 1 <= b for a, b in spans)
    # the map of the pack points at the same symbols
    assert "Session.merge_environment_settings" in pack.items[0].text


def test_symbol_order_is_the_same_under_any_hash_seed(requests_like: Path, tmp_path: Path) -> None:
    code = (
        "import sys; from hybrid.context.pack import context_pack; "
        f"p = context_pack(sys.argv[1], {TASK!r}, tokens=1500); "
        "print(p.model_dump_json())"
    )
    outs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "HYBRID_CACHE_DIR": str(tmp_path / seed)}
        proc = subprocess.run(
            [sys.executable, "-c", code, str(requests_like)],
            capture_output=True,
            text=True,
            env=env,
            cwd=str(tmp_path),
            check=True,
        )
        outs.add(proc.stdout)
    assert len(outs) == 1


def test_top_files_reranked_by_their_best_symbol(tmp_path: Path, git: Any, write: Any) -> None:
    """A file whose path and names match the task loosely ranks below one whose function
    body holds the task's words once the symbols are ranked."""
    from functools import partial

    from hybrid.context.grep import grep_words
    from hybrid.context.ranking import rank
    from hybrid.context.repomap import load_graph
    from hybrid.context.symbols import rank_symbols, rerank_files

    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write(
        repo,
        {
            "app/retry.py": '"""Retry policy."""\n\n\ndef retry_policy(n):\n    return n\n',
            "app/client.py": (
                "def fetch(url):\n"
                "    # retry with exponential backoff and jitter on timeout\n"
                "    backoff = 1\n"
                "    jitter = 0.1\n"
                "    timeout = 5\n"
                "    return url, backoff, jitter, timeout\n" + _filler("parse", 3)
            ),
        },
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    task = "retry: exponential backoff with jitter after a timeout"
    graph = load_graph(repo)
    ranking = rank(graph, task, "fused", None, partial(grep_words, repo))
    hits = rank_symbols(graph, ranking, repo)
    assert hits[0].definition.name == "fetch"
    reranked = rerank_files(graph, ranking, hits)
    assert graph.paths[reranked.order[0]] == "app/client.py"
    assert sorted(reranked.order) == sorted(ranking.order)  # a permutation


def test_js_member_assigned_function_spans_its_body() -> None:
    """``res.send = function send() {...}``: the definition is the whole assignment, so a
    packed body holds the function's lines, not just ``res.send``."""
    source = (
        "var res = {};\nres.send = function send(body) {\n  var chunk = body;\n  return this;\n};\n"
    )
    (d,) = [d for d in _defs(source, "javascript") if d.name == "send"]
    assert (d.line, d.end_line, d.qualified) == (2, 5, "res.send")


def test_graph_keys_definitions_by_qualified_name_and_resolves_references(
    tmp_path: Path, git: Any, write: Any
) -> None:
    """``Session.send`` and ``Adapter.send`` are two symbols; a file's reference to ``send``
    goes to the definition in the same file, else to the one in a file it imports."""
    import numpy as np

    from hybrid.context.graph import names_index
    from hybrid.context.repomap import load_graph

    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write(
        repo,
        {
            "pkg/__init__.py": "",
            "pkg/sessions.py": (
                "class Session:\n    def send(self, r):\n        return self.send_all(r)\n\n"
                "    def send_all(self, r):\n        return r\n"
            ),
            "pkg/adapters.py": "class Adapter:\n    def send(self, r):\n        return r\n",
            "pkg/api.py": (
                "from pkg.sessions import Session\n\n\ndef call(r):\n    return Session().send(r)\n"
            ),
        },
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    graph = load_graph(repo)
    symbols = graph.symbols
    assert {"Session.send", "Adapter.send", "Session", "Adapter", "call"} <= set(symbols)
    assert sorted(symbols[j] for j in names_index(graph)["send"]) == [
        "Adapter.send",
        "Session.send",
    ]
    n = len(graph.paths)
    src = np.frombuffer(graph.src, dtype=np.int32)
    dst = np.frombuffer(graph.dst, dtype=np.int32)

    def referenced(path: str) -> set[str]:
        i = graph.paths.index(path)
        return {symbols[d - n] for s, d in zip(src, dst, strict=True) if s == i and d >= n}

    assert "Session.send" in referenced("pkg/api.py")  # through its import
    assert "Adapter.send" not in referenced("pkg/api.py")
    assert "Adapter.send" not in referenced("pkg/sessions.py")  # its own send_all's caller


def test_packing_order_follows_scores_unless_size_is_penalized(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hybrid.context import bodies
    from hybrid.context.bodies import packing_order
    from hybrid.context.symbols import SymbolHit

    def hit(name: str, score: float) -> SymbolHit:
        return SymbolHit(0, "a.py", Definition(name, "function", 1, 2, f"def {name}()"), score)

    big, small, smaller = hit("big", 2.0), hit("small", 1.95), hit("smaller", 1.9)
    # the fitted default: no size penalty, a big body the task matches best goes first
    assert packing_order([big, small, smaller], [3000, 80, 120]) == [big, small, smaller]
    monkeypatch.setattr(bodies, "SIZE_PENALTY", 0.1)
    assert packing_order([big, small, smaller], [3000, 80, 120]) == [small, smaller, big]
    # equal sizes keep the score order
    assert packing_order([big, small, smaller], [90, 90, 90]) == [big, small, smaller]


def test_pack_spans_hold_the_imports_and_class_headers_it_shows(requests_like: Path) -> None:
    pack = context_pack(requests_like, TASK, tokens=2000)
    item = next(i for i in pack.items if i.kind == "symbols" and i.path == "reqs/sessions.py")
    lines = REQUESTS_LIKE["reqs/sessions.py"].splitlines()
    held = {n for a, b in item.spans for n in range(a, b + 1)}
    for text in ("from .utils import resolve_proxies", "class Session(SessionRedirectMixin):"):
        assert text in item.text
        assert lines.index(text) + 1 in held
    # every span is text the item really holds
    for a, b in item.spans:
        assert all(line in item.text for line in lines[a - 1 : b])


def test_a_big_files_frame_goes_with_its_bodies(tmp_path: Path, git: Any, write: Any) -> None:
    """A file too big to pack whole: the chosen body comes with the file's frame (its
    imports, module constants and class fields), every other function is elided as one
    marked line (``⋮``), and the spans name exactly the lines the text holds."""
    source = (
        "import os\n\nDEFAULT_TIMEOUT = 30\nRETRIES = 3\n\n\n"
        "class Client:\n"
        "    timeout = DEFAULT_TIMEOUT\n\n"
        "    def connect_with_retries(self, host):\n"
        "        for attempt in range(RETRIES):\n"
        "            if os.path.exists(host):\n"
        "                return attempt\n"
        "        return None\n" + _filler("checksum", 25)
    )
    write(tmp_path, {"net/client.py": source, "net/__init__.py": ""})
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "init")
    pack = context_pack(tmp_path, "Client.connect_with_retries gives up too early", tokens=2000)
    item = next(i for i in pack.items if i.path == "net/client.py")
    assert item.kind == "symbols"
    for text in ("DEFAULT_TIMEOUT = 30", "    timeout = DEFAULT_TIMEOUT", "import os"):
        assert text in item.text
    assert "for attempt in range(RETRIES):" in item.text
    # the budget left after the frame goes to other bodies; the rest are elided
    assert item.text.count("def checksum_") < 25 and "\n⋮\n" in item.text
    lines = source.splitlines()
    held = {n for a, b in item.spans for n in range(a, b + 1)}
    assert lines.index("RETRIES = 3") + 1 in held
    for a, b in item.spans:
        assert "\n".join(lines[a - 1 : b]) in item.text


def test_a_frame_too_big_goes_without_its_prose(tmp_path: Path, git: Any, write: Any) -> None:
    """When the frame with its comments and docstrings costs too much, the frame without
    them still brings the constants next to the body."""
    prose = "".join(f"# Line {k} of a long licence header that says nothing.\n" for k in range(80))
    source = (
        prose + '"""A module docstring.\n\n' + "More words about nothing.\n" * 60 + '"""\n\n'
        "RETRY_LIMIT = 3\n\n\n"
        "def connect_with_retries(host):\n"
        "    for attempt in range(RETRY_LIMIT):\n"
        "        if host:\n"
        "            return attempt\n"
        "    return None\n" + _filler("checksum", 25)
    )
    write(tmp_path, {"net.py": source})
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "init")
    pack = context_pack(tmp_path, "connect_with_retries gives up too early", tokens=2000)
    item = next(i for i in pack.items if i.path == "net.py")
    assert "RETRY_LIMIT = 3" in item.text and "for attempt in range(RETRY_LIMIT):" in item.text
    assert "licence header" not in item.text and "More words" not in item.text
    lines = source.splitlines()
    for a, b in item.spans:
        assert "\n".join(lines[a - 1 : b]) in item.text


def test_a_file_without_definitions_is_ranked_and_packed_whole(
    tmp_path: Path, git: Any, write: Any
) -> None:
    """An example app whose code is all at the top level (route handlers passed inline) has
    no symbol to rank; the file itself competes as one, so a task about it gets the file
    whole in the pack, while the map lists no pseudo-symbol for it."""
    app = (
        "var express = require('../../');\nvar path = require('path');\nvar app = express();\n\n"
        "app.get('/files/:file(*)', function (req, res, next) {\n"
        "  var filePath = path.join(__dirname, 'files', req.params.file);\n"
        "  res.download(filePath, function (err) {\n"
        "    if (!err) return;\n"
        "    next(err);\n"
        "  });\n"
        "});\n\napp.listen(3000);\n"
    )
    lib = "".join(
        f"function helper{k}(req, res) {{\n  var out = req.query.item{k};\n  return res.send(out);\n}}\n\n"
        for k in range(120)
    )
    write(tmp_path, {"examples/downloads/index.js": app, "lib/response.js": lib})
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "init")
    task = "examples: fix path traversal in downloads example"
    pack = context_pack(tmp_path, task, tokens=2000)
    item = next(i for i in pack.items if i.path == "examples/downloads/index.js")
    assert item.kind == "file" and item.spans == [(1, app.count("\n"))]
    assert "res.download(filePath" in item.text
    text = repo_map(tmp_path, task=task, tokens=1024).text
    assert "examples/downloads/index.js\n" in text and "index.js:\n" not in text
