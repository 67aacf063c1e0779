"""Polling for the tests: one wait loop for every package (the root conftest puts tests/ on
sys.path, as --import-mode=importlib does not)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(check: Callable[[], Any], timeout: float, step: float = 0.1) -> Any:
    """Poll ``check`` until it returns something true or ``timeout`` passes; its last value."""
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > end:
            return value
        time.sleep(step)
