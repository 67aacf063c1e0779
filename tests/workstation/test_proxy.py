"""The egress proxy's allow-list and address rules (the proxy code itself, run in process)."""

from __future__ import annotations

import asyncio

from hybrid.workstation.proxy import _resolve, allowed


def test_allow_list_patterns_and_ports():
    patterns = ["mirror.example.org:80", "*.files.example.net", "index.example.com:*"]
    assert allowed("mirror.example.org", 80, patterns)
    assert allowed("MIRROR.example.org.", 80, patterns)
    assert not allowed("mirror.example.org", 443, patterns)
    assert allowed("cdn.files.example.net", 443, patterns)
    assert allowed("index.example.com", 8443, patterns)
    assert not allowed("evil.org", 80, patterns)
    assert not allowed("mirror.example.org.evil.org", 80, patterns)


def test_loopback_and_link_local_are_never_reached():
    assert asyncio.run(_resolve("localhost", 80)) is None
    assert asyncio.run(_resolve("127.0.0.1", 80)) is None
    assert asyncio.run(_resolve("169.254.169.254", 80)) is None  # cloud metadata
    assert asyncio.run(_resolve("192.0.2.10", 80)) == "192.0.2.10"
