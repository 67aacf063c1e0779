"""A tiny ledger kept in Postgres, reached through ``DATABASE_URL``."""

from __future__ import annotations

import os
from urllib.parse import urlparse

import pg8000.native


def connect(url: str | None = None) -> pg8000.native.Connection:
    """A connection to the database ``url`` (default: ``$DATABASE_URL``) names."""
    parts = urlparse(url or os.environ["DATABASE_URL"])
    return pg8000.native.Connection(
        parts.username or "postgres",
        password=parts.password,
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        database=parts.path.lstrip("/") or None,
    )


def migrate(conn: pg8000.native.Connection) -> None:
    conn.run(
        "CREATE TABLE IF NOT EXISTS entries ("
        " id serial PRIMARY KEY, account text NOT NULL, cents bigint NOT NULL)"
    )


def record(conn: pg8000.native.Connection, account: str, cents: int) -> None:
    conn.run("INSERT INTO entries (account, cents) VALUES (:a, :c)", a=account, c=cents)


def balance(conn: pg8000.native.Connection, account: str) -> int:
    rows = conn.run("SELECT COALESCE(SUM(cents), 0) FROM entries WHERE account = :a", a=account)
    return int(rows[0][0])
