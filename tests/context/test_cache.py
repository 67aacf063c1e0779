"""The incremental cache: unchanged trees parse nothing, edits/adds/deletes/renames parse
only what changed, inside and outside git."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from hybrid.context.cache import TagCache
from hybrid.context.index import build_index
from hybrid.context.repomap import load_graph


def _names(root: Path, path: str) -> set[str]:
    index = build_index(root)
    return {d.name for d in index.tags(path).definitions}


def test_second_run_parses_nothing(shop_repo: Path) -> None:
    first = build_index(shop_repo)
    assert first.stats.parsed == first.stats.files == 5
    second = build_index(shop_repo)
    assert second.stats.parsed == 0
    assert second.stats.hashed == 0  # blob ids from git: no file was read
    assert second.stats.cached == 5


def test_edit_parses_one_file(shop_repo: Path, git: Any, write: Any) -> None:
    build_index(shop_repo)
    (shop_repo / "shop/shipping.py").write_text("def express_cost(kg):\n    return 9\n")
    index = build_index(shop_repo)
    assert (index.stats.parsed, index.stats.hashed) == (1, 1)
    assert {d.name for d in index.tags("shop/shipping.py").definitions} == {"express_cost"}
    git(shop_repo, "commit", "-qam", "express")
    again = build_index(shop_repo)
    assert again.stats.parsed == 0  # committed blob id equals the hash we computed


def test_add_delete_rename(shop_repo: Path, git: Any, write: Any) -> None:
    build_index(shop_repo)
    write(shop_repo, {"shop/returns.py": "def refund(order):\n    return order\n"})
    added = build_index(shop_repo)
    assert added.stats.parsed == 1
    assert "shop/returns.py" in {f.path for f in added.files}

    (shop_repo / "shop/shipping.py").unlink()
    deleted = build_index(shop_repo)
    assert deleted.stats.parsed == 0
    assert "shop/shipping.py" not in {f.path for f in deleted.files}

    git(shop_repo, "add", "-A")
    git(shop_repo, "mv", "shop/pricing.py", "shop/prices.py")
    renamed = build_index(shop_repo)
    assert renamed.stats.parsed == 0  # same content, same blob id: nothing to parse
    paths = {f.path for f in renamed.files}
    assert "shop/prices.py" in paths and "shop/pricing.py" not in paths
    assert "apply_discount" in {d.name for d in renamed.tags("shop/prices.py").definitions}


def test_graph_follows_changes(shop_repo: Path) -> None:
    graph = load_graph(shop_repo)
    assert "shop/shipping.py" in graph.paths
    (shop_repo / "shop/shipping.py").unlink()
    graph = load_graph(shop_repo)
    assert "shop/shipping.py" not in graph.paths
    assert "shipping_cost" not in graph.symbols


def test_stored_rows_stay_plain_tuples_and_a_dict(shop_repo: Path) -> None:
    """The typed views (Payload, Slim, Graph) store exactly what the untyped code stored, so
    caches of the same SCHEMA stay readable."""
    import marshal
    import sqlite3

    from hybrid.context.cache import SCHEMA, default_cache_path
    from hybrid.context.graph import Graph, Slim
    from hybrid.context.tags import Payload

    cold = load_graph(shop_repo)
    cold.repo_index.payloads(["shop/shipping.py"])  # Python tags are parsed when first asked for
    db = sqlite3.connect(default_cache_path())
    tags = [marshal.loads(d) for (d,) in db.execute("SELECT data FROM tags")]
    slims = [marshal.loads(d) for (d,) in db.execute("SELECT data FROM slims")]
    (stored,) = [marshal.loads(d) for (d,) in db.execute("SELECT data FROM repo_graphs")]
    db.close()
    assert tags and all(type(t) is tuple and len(t) == len(Payload._fields) for t in tags)
    assert slims and all(type(s) is tuple and len(s) == len(Slim._fields) for s in slims)
    assert type(stored) is dict and set(stored) == set(cold.data()) and "index" not in stored
    assert SCHEMA == 16  # 16: signatures leave comments out
    import hybrid.context.repomap as repomap

    repomap._recent = None  # not the graph this process holds: the stored dict this time
    warm = load_graph(shop_repo)
    assert isinstance(warm, Graph) and warm.data() == cold.data()
    assert warm.repo_index.root == shop_repo
    assert isinstance(warm.repo_index.payloads(["shop/shipping.py"])["shop/shipping.py"], Payload)


def test_plain_directory_without_git(shop_repo: Path, tmp_path: Path) -> None:
    build_index(shop_repo)
    plain = tmp_path / "plain"
    shutil.copytree(shop_repo, plain, ignore=shutil.ignore_patterns(".git"))
    first = build_index(plain)
    # identical contents were already parsed for the git checkout: content keys are shared
    assert first.stats.parsed == 0 and first.stats.hashed == 5
    (plain / "shop/cart.py").write_text("class Basket:\n    pass\n")
    second = build_index(plain)
    assert second.stats.parsed == 1
    assert {d.name for d in second.tags("shop/cart.py").definitions} == {"Basket"}


def test_parallel_cold_parse_matches_serial(tmp_path: Path, git: Any, write: Any) -> None:
    # enough bytes to be worth a pool (1.2 MB to scan, their tags parsed in a pool too)
    pad = "# " + "padding " * 1250 + "\n"
    files = {
        f"pkg/mod{i}.py": f"{pad}def func_{i}(x):\n    return helper_{i % 7}(x)\n"
        for i in range(120)
    }
    write(tmp_path / "repo", files)
    parallel = build_index(tmp_path / "repo", cache=TagCache(tmp_path / "a.sqlite"), workers=2)
    serial = build_index(tmp_path / "repo", cache=TagCache(tmp_path / "b.sqlite"), workers=1)
    assert parallel.stats.workers == 2 and serial.stats.workers == 1
    assert parallel.slims(set(parallel.cache.existing_slims(_keys(parallel)))) == serial.slims(
        set(serial.cache.existing_slims(_keys(serial)))
    )
    assert parallel.payloads() == serial.payloads()


def test_a_small_tree_is_read_without_a_pool(tmp_path: Path, git: Any, write: Any) -> None:
    files = {f"pkg/mod{i}.py": f"def func_{i}(x):\n    return x\n" for i in range(120)}
    write(tmp_path / "repo", files)
    index = build_index(tmp_path / "repo", workers=2)
    assert index.stats.parsed == 120 and index.stats.workers == 1  # forking costs more


def _keys(index: Any) -> list[str]:
    return [TagCache.key(f.content_id, f.lang) for f in index.files]


def test_files_without_symbols_are_reported(tmp_path: Path, git: Any, write: Any) -> None:
    write(
        tmp_path,
        {"a.py": "def f():\n    pass\n", "empty.py": "# nothing here\n", "b.go": "package b\n"},
    )
    index = build_index(tmp_path)
    assert dict(index.empty_files()) == {
        "b.go": "no definitions found",
        "empty.py": "no definitions found",
    }


def _project_clone(tmp_path: Path, git: Any) -> Path:
    """A clone of this project's own checkout: a real repository of a few hundred files."""
    here = Path(__file__).resolve().parents[2]
    clone = tmp_path / "project"
    git(tmp_path, "clone", "-q", "--no-hardlinks", str(here), str(clone))
    return clone


def test_a_body_edit_patches_the_graph_exactly_as_a_full_build(tmp_path: Path, git: Any) -> None:
    """One file's bodies change (new calls, new words): the stored graph is patched, not
    rebuilt, and the patch equals a full build of the new contents field by field. A change
    of what a file defines or imports falls back to the full build."""
    from hybrid.context.graph import build_graph, patch_graph

    repo = _project_clone(tmp_path, git)
    before = load_graph(repo)
    target = repo / "hybrid/context/ranking.py"
    text = target.read_text()
    body = "    paths = graph.paths\n"
    assert body in text
    # new references (to names defined once and many times over), new BM25 words
    target.write_text(
        text.replace(
            body, body + '    if not paths:  # zebra\n        slim(qualified(bare("a"), "b"))\n', 1
        )
    )
    cache = TagCache()
    index = build_index(repo, cache=cache)
    keys = {f.path: TagCache.key(f.content_id, f.lang) for f in index.files}

    def slims(wanted: set[str]) -> dict[str, Any]:
        from hybrid.context.graph import slim

        found = cache.slims(wanted)
        for path, payload in index.payloads(
            [p for p, k in keys.items() if k in wanted and k not in found]
        ).items():
            found[keys[path]] = slim(payload)
        return found

    patched = patch_graph(before, keys, slims)
    assert patched is not None
    got = slims(set(keys.values()))
    full = build_graph({p: got[k] for p, k in keys.items()}, keys)
    assert patched.data() == full.data()
    assert len(patched.src) > len(before.src) and patched.terms != before.terms
    loaded = load_graph(repo, cache=cache)
    assert loaded.data() == full.data()

    # a new definition: the patch declines, and load_graph's full build sees the new symbol
    target.write_text(target.read_text() + "\n\ndef zebra_ranking():\n    return 1\n")
    index = build_index(repo, cache=cache)
    keys = {f.path: TagCache.key(f.content_id, f.lang) for f in index.files}
    assert patch_graph(loaded, keys, slims) is None
    assert "zebra_ranking" in load_graph(repo, cache=cache).symbols


def test_a_process_patches_the_graph_it_holds(tmp_path: Path, git: Any, monkeypatch: Any) -> None:
    """After an edit, a process that built the graph (a server worker) patches its own copy
    without reading the stored one, and gets what a fresh process builds from scratch."""
    import hybrid.context.repomap as repomap

    repo = _project_clone(tmp_path, git)
    before = load_graph(repo)
    target = repo / "hybrid/context/ranking.py"
    body = "    paths = graph.paths\n"
    edit = '    if not paths:\n        slim(qualified(bare("a"), "b"))\n'
    target.write_text(target.read_text().replace(body, body + edit, 1))

    def unread(*args: object) -> None:
        raise AssertionError("the stored graph was read")

    with monkeypatch.context() as patched:
        patched.setattr(TagCache, "last_graph", unread)
        patched.setattr(TagCache, "get_graph", lambda *args: None)
        held = load_graph(repo)
    monkeypatch.setattr(repomap, "_recent", None)
    fresh = load_graph(repo, cache=TagCache(tmp_path / "fresh.sqlite"))
    assert held.data() == fresh.data()
    assert held.src != before.src


def test_a_taskless_map_is_kept_until_the_contents_change(
    shop_repo: Path, monkeypatch: Any
) -> None:
    """The same map comes back from the cache (under the root as the caller spelled it),
    without ranking anything; an edit, or other arguments, compute it again."""
    import hybrid.context.ranking as ranking
    from hybrid.context.repomap import repo_map

    first = repo_map(shop_repo, "", 500)
    monkeypatch.chdir(shop_repo)

    def no_ranking(*args: object, **kwargs: object) -> None:
        raise AssertionError("a stored map was ranked again")

    with monkeypatch.context() as patched:
        patched.setattr(ranking, "rank", no_ranking)
        again = repo_map(".", "", 500)
    assert again.root == "." and again.model_copy(update={"root": first.root}) == first
    assert repo_map(".", "", 400).budget == 400  # other arguments: computed
    (shop_repo / "shop/shipping.py").write_text("def express_cost(kg):\n    return 9\n")
    edited = repo_map(".", "", 500)
    assert "express_cost" in edited.text and "express_cost" not in first.text
