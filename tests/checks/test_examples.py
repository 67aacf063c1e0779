"""The examples shipped for the README give the results the README promises."""

from __future__ import annotations

from pathlib import Path

from hybrid.checks import check_json, redact, scope

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_order_json_fails_its_schema_at_two_paths() -> None:
    report = check_json(EXAMPLES / "order.json", schema=EXAMPLES / "order.schema.json")
    assert not report.ok
    assert sorted(e.path for e in report.errors) == ["$.items[2].qty", "$.items[2].weight_kg"]


def test_build_log_is_scrubbed() -> None:
    report = redact(EXAMPLES / "build.log", label="build.log")
    assert report.counts == {"aws_access_key_id": 1, "bearer_token": 1, "url_credentials": 1}
    for secret in ("AKIAZ7QW3ERT5YUI9OPA", "tok_9f8e7d6c5b4a39281706", "pa55w0rd"):
        assert secret not in report.text
    assert "ERROR: upload failed: 403 Forbidden" in report.text


def test_change_diff_is_blocked_by_the_ci_rule() -> None:
    report = scope(EXAMPLES / "change.diff", allow=["src"])
    assert report.decision == "blocked"
    assert [(v.path, v.rule) for v in report.violations] == [
        (".github/workflows/ci.yml", "ci-config")
    ]
