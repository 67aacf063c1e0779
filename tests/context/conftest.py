from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own tag cache, so cache hits and misses are its own."""
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("HYBRID_CACHE_DIR", str(cache))
    return cache


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        check=True,
        env={
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@example.invalid",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.invalid",
            "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
            "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z",
            "PATH": "/usr/bin:/bin:/usr/local/bin",
            "HOME": str(repo),
        },
    )
    return out.stdout


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture(name="git")
def _git_fixture() -> object:
    """``git(repo, *args)`` with a fixed identity and dates."""
    return git


@pytest.fixture(name="write")
def _write_fixture() -> object:
    """``write(root, {relative path: text})``."""
    return write


PROJECT = {
    "shop/__init__.py": '"""A tiny shop."""\nfrom .cart import Cart\n',
    "shop/cart.py": (
        '"""Shopping cart."""\n'
        "from shop.pricing import apply_discount, TAX_RATE\n\n\n"
        "class Cart:\n"
        '    """Items and their prices."""\n\n'
        "    def __init__(self):\n"
        "        self.items = []\n\n"
        "    def add_item(self, name, price):\n"
        "        self.items.append((name, price))\n\n"
        "    def total(self):\n"
        '        """Sum of prices after discount and tax."""\n'
        "        subtotal = sum(p for _, p in self.items)\n"
        "        return apply_discount(subtotal) * (1 + TAX_RATE)\n"
    ),
    "shop/pricing.py": (
        '"""Discounts and taxes."""\n\n'
        "TAX_RATE = 0.2\n\n\n"
        "def apply_discount(amount):\n"
        '    """Ten percent off above one hundred."""\n'
        "    if amount > 100:\n"
        "        return amount * 0.9\n"
        "    return amount\n"
    ),
    "shop/shipping.py": (
        '"""Parcel shipping rates."""\n\n\n'
        "def shipping_cost(weight_kg):\n"
        "    return 5 + weight_kg * 2\n"
    ),
    "tests/test_pricing.py": (
        "from shop.pricing import apply_discount\n\n\n"
        "def test_discount():\n"
        "    assert apply_discount(200) == 180\n"
    ),
}


@pytest.fixture
def shop_repo(tmp_path: Path) -> Path:
    """A small git repository with a few real commits."""
    repo = tmp_path / "shop"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write(repo, PROJECT)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial shop")
    return repo
