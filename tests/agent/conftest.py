"""tests/agent: the vendored project under data/ is test input, not tests to collect."""

collect_ignore_glob = ["data/*"]
