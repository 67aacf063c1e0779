import ledger
import pytest


@pytest.fixture
def conn():
    conn = ledger.connect()
    ledger.migrate(conn)
    conn.run("START TRANSACTION")
    yield conn
    conn.run("ROLLBACK")
    conn.close()


def test_balance_sums_the_entries(conn):
    ledger.record(conn, "alice", 1250)
    ledger.record(conn, "alice", -250)
    ledger.record(conn, "bob", 99)
    assert ledger.balance(conn, "alice") == 1000


def test_an_unknown_account_is_empty(conn):
    assert ledger.balance(conn, "nobody") == 0


def test_the_server_is_postgres(conn):
    assert conn.run("SELECT version()")[0][0].startswith("PostgreSQL")
