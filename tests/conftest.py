"""Shared test settings: an isolated cache directory per test session."""

from __future__ import annotations

import os
import tempfile

# A private cache per session, so tests neither read nor pollute the user's compiled-module cache.
os.environ.setdefault("HYBRID_CACHE_DIR", tempfile.mkdtemp(prefix="hybrid-test-cache-"))
os.environ.setdefault("HYBRID_STATE_DIR", tempfile.mkdtemp(prefix="hybrid-test-state-"))
