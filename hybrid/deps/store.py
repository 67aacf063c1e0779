"""The content-addressed artifact store under the cache directory.

``<cache>/deps/store/<sha256[:2]>/<sha256>``: a file's name is its digest, so an artifact can be
neither renamed into another nor silently changed (``verify`` re-hashes before anything enters).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from hybrid.deps.models import Artifact
from hybrid.paths import cache_dir


def root() -> Path:
    """The store directory (created on demand)."""
    return cache_dir("deps", "store")


def path_of(sha256: str) -> Path:
    """Where the artifact with this digest lives (it may be absent)."""
    return root() / sha256[:2] / sha256


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def add(path: Path) -> tuple[str, int]:
    """Copy ``path`` into the store (atomically); returns (sha256, size)."""
    digest = sha256_file(path)
    target = path_of(digest)
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".incoming-")
        os.close(fd)
        try:
            shutil.copyfile(path, tmp)
            if sha256_file(Path(tmp)) != digest:  # changed while being copied
                raise OSError(f"{path} changed while it was stored")
            os.chmod(tmp, 0o444)
            os.replace(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return digest, target.stat().st_size


def add_bytes(data: bytes) -> tuple[str, int]:
    """Store ``data`` (atomically); returns (sha256, size)."""
    with tempfile.NamedTemporaryFile(dir=root(), prefix=".bytes-", delete=False) as tmp:
        tmp.write(data)
    try:
        return add(Path(tmp.name))
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp.name)


def problems(artifacts: Iterable[Artifact]) -> list[str]:
    """Every artifact that is missing from the store or whose bytes no longer hash to its pin."""
    found = []
    for artifact in artifacts:
        where = path_of(artifact.sha256)
        if not where.is_file():
            found.append(
                f"deps: {artifact.filename}: not in the artifact store (run hybrid deps lock)"
            )
            continue
        actual = sha256_file(where)
        if actual != artifact.sha256:
            found.append(
                f"deps: {artifact.filename}: sha256 mismatch (pinned {artifact.sha256[:16]}..., "
                f"the stored file hashes to {actual[:16]}...); refused"
            )
    return found


def stage(artifacts: Iterable[Artifact], directory: Path) -> None:
    """Lay the artifacts out under their file names in ``directory``, verified as they are copied."""
    for artifact in artifacts:
        target = directory / artifact.filename
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".stage-")
        os.close(fd)
        shutil.copyfile(path_of(artifact.sha256), tmp)
        if sha256_file(Path(tmp)) != artifact.sha256:
            os.unlink(tmp)
            raise ValueError(f"{artifact.filename}: sha256 mismatch while staging")
        os.chmod(tmp, 0o444)
        os.replace(tmp, target)


def size() -> int:
    """Bytes the store holds."""
    return sum(p.stat().st_size for p in root().glob("*/*") if p.is_file())


def remove_unused(keep: set[str]) -> int:
    """Delete every stored artifact whose digest is not in ``keep``; returns the bytes freed."""
    freed = 0
    for path in root().glob("*/*"):
        if path.is_file() and path.name not in keep:
            freed += path.stat().st_size
            path.unlink()
    return freed
