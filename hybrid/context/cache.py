"""One SQLite file of per-file tags and graph inputs, keyed by content (the git blob id),
plus built graphs and maps.

Content keys make the cache shareable across checkouts, worktrees and renames: a file
whose bytes did not change is never parsed again, wherever it lives. Payloads and slims are
``marshal``-ed plain tuples (fast to load; read back as the named tuples ``Payload`` and
``Slim``), so the key also carries the Python version; a change to what is stored must bump
``SCHEMA``, so older rows are never read.
"""

from __future__ import annotations

import marshal
import sqlite3
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from hybrid.context.graph import GraphData, Slim
from hybrid.context.tags import Payload
from hybrid.errors import ContextError
from hybrid.paths import cache_dir

SCHEMA = 16
_VERSION = f"v{SCHEMA}-py{sys.version_info[0]}{sys.version_info[1]}"
_BATCH = 900  # stay under SQLite's host-parameter limit


def default_cache_path() -> Path:
    """``<cache dir>/context/tags.sqlite``."""
    return cache_dir("context") / "tags.sqlite"


class TagCache:
    """Per-file tags by content key, and one built graph per repository root."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_cache_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            # A cache: losing the last writes on power loss is fine, waiting for fsync is not.
            self._db.execute("PRAGMA synchronous=OFF")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS tags (key TEXT PRIMARY KEY, data BLOB) WITHOUT ROWID"
            )
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS slims (key TEXT PRIMARY KEY, data BLOB) WITHOUT ROWID"
            )
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS repo_graphs "
                "(root TEXT PRIMARY KEY, fingerprint TEXT, data BLOB)"
            )
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS repo_maps (root TEXT, args TEXT, fingerprint TEXT, "
                "data TEXT, PRIMARY KEY (root, args)) WITHOUT ROWID"
            )
        except sqlite3.Error as exc:
            raise ContextError(f"tag cache {self.path} is not usable: {exc}") from exc

    @staticmethod
    def key(content_id: str, lang: str) -> str:
        """Cache key of one file: its content id, its language and the schema version."""
        return f"{content_id}:{lang}:{_VERSION}"

    def payloads(self, keys: Iterable[str]) -> dict[str, Payload]:
        """The payloads cached under ``keys``; missing keys are simply absent."""
        return {key: Payload._make(row) for key, row in self._rows("tags", keys)}

    def slims(self, keys: Iterable[str]) -> dict[str, Slim]:
        """The graph inputs cached under ``keys``; missing keys are simply absent."""
        return {key: Slim._make(row) for key, row in self._rows("slims", keys)}

    def _rows(
        self, table: Literal["tags", "slims"], keys: Iterable[str]
    ) -> Iterable[tuple[str, tuple[object, ...]]]:
        wanted = list(keys)
        for start in range(0, len(wanted), _BATCH):
            chunk = wanted[start : start + _BATCH]
            marks = ",".join("?" * len(chunk))
            rows = self._db.execute(f"SELECT key, data FROM {table} WHERE key IN ({marks})", chunk)
            for key, data in rows:
                yield key, marshal.loads(data)

    def put_slims(self, items: Iterable[tuple[str, bytes]]) -> None:
        """Store already-marshalled graph inputs by content key (they never change for a key)."""
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR REPLACE INTO slims (key, data) VALUES (?, ?)", items)

    def existing(self, keys: Iterable[str]) -> set[str]:
        """The subset of ``keys`` whose tags are cached (without reading them)."""
        return self._existing("tags", keys)

    def existing_slims(self, keys: Iterable[str]) -> set[str]:
        """The subset of ``keys`` whose graph inputs are cached (without reading them)."""
        return self._existing("slims", keys)

    def _existing(self, table: Literal["tags", "slims"], keys: Iterable[str]) -> set[str]:
        wanted = list(keys)
        found: set[str] = set()
        for start in range(0, len(wanted), _BATCH):
            chunk = wanted[start : start + _BATCH]
            marks = ",".join("?" * len(chunk))
            rows = self._db.execute(f"SELECT key FROM {table} WHERE key IN ({marks})", chunk)
            found.update(key for (key,) in rows)
        return found

    def put_many(self, items: Iterable[tuple[str, bytes]]) -> None:
        """Store already-marshalled payloads."""
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR REPLACE INTO tags (key, data) VALUES (?, ?)", items)

    def get_graph(self, root: str, fingerprint: str) -> GraphData | None:
        """The graph built for ``root`` if the repository still has this fingerprint."""
        row = self._db.execute(
            "SELECT data FROM repo_graphs WHERE root = ? AND fingerprint = ?", (root, fingerprint)
        ).fetchone()
        if row is None:
            return None
        data: GraphData = marshal.loads(row[0])
        return data

    def last_graph(self, root: str) -> GraphData | None:
        """The graph last built for ``root``, whatever the repository held then (None if it
        was built by another schema: its fields are not this version's)."""
        row = self._db.execute("SELECT data FROM repo_graphs WHERE root = ?", (root,)).fetchone()
        if row is None:
            return None
        data: GraphData = marshal.loads(row[0])
        keys = data.get("keys") if isinstance(data, dict) else None
        if not keys or not str(keys[0]).endswith(_VERSION):
            return None
        return data

    def has_graph(self, root: str, fingerprint: str) -> bool:
        """Whether a graph for exactly this fingerprint is stored (without loading it)."""
        row = self._db.execute(
            "SELECT 1 FROM repo_graphs WHERE root = ? AND fingerprint = ?", (root, fingerprint)
        ).fetchone()
        return row is not None

    def put_graph(self, root: str, fingerprint: str, data: GraphData) -> None:
        """Remember the graph built for ``root`` (one per root, replaced on change)."""
        self._db.execute(
            "INSERT OR REPLACE INTO repo_graphs (root, fingerprint, data) VALUES (?, ?, ?)",
            (root, fingerprint, marshal.dumps(data)),
        )

    def get_map(self, root: str, args: str, fingerprint: str) -> str | None:
        """A map rendered for ``root`` with ``args`` if the repository still has this
        fingerprint (see ``repo_map``)."""
        row = self._db.execute(
            "SELECT data FROM repo_maps WHERE root = ? AND args = ? AND fingerprint = ?",
            (root, args, fingerprint),
        ).fetchone()
        return None if row is None else str(row[0])

    def put_map(self, root: str, args: str, fingerprint: str, data: str) -> None:
        """Remember a rendered map (one per root and arguments, replaced on change)."""
        self._db.execute(
            "INSERT OR REPLACE INTO repo_maps (root, args, fingerprint, data) VALUES (?, ?, ?, ?)",
            (root, args, fingerprint, data),
        )

    def close(self) -> None:
        """Close the database (idempotent)."""
        self._db.close()

    def __enter__(self) -> TagCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
