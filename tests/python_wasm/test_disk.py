"""python-wasm has no writable directory at all: a snippet that tries to fill a disk writes nothing."""

from __future__ import annotations

import os

from hybrid import Termination, run_python
from hybrid.wasm.python import staging

FILL = """
block = b"x" * (1 << 20)
for path in ("big.bin", "/big.bin", "/tmp/big.bin", "/workspace/big.bin"):
    try:
        with open(path, "wb") as handle:
            for _ in range(512):
                handle.write(block)
        print(path, "written")
    except OSError as exc:
        print(path, "refused:", type(exc).__name__)
"""


def _bytes_under(root: str) -> int:
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(root) for f in files)


def test_a_snippet_cannot_write_a_big_file_anywhere() -> None:
    for files in (None, {"data.csv": "a,b\n1,2\n"}):
        result = run_python(FILL, files=files)
        assert result.termination is Termination.OK, result
        lines = result.stdout.splitlines()
        assert len(lines) == 4 and all("refused" in line for line in lines), lines
        root = str(staging.scratch_root())
        assert _bytes_under(root) < 1024**2  # only pipes and the staged input files
