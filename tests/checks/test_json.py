"""json check: syntax errors with line:column, schema failures with their JSON path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybrid.checks import check_json
from hybrid.errors import InvalidInput

SCHEMA = {
    "type": "object",
    "required": ["name", "items"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "status": {"enum": ["draft", "final"]},
        "items": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "qty"],
                "properties": {
                    "name": {"type": "string"},
                    "qty": {"type": "integer", "minimum": 1},
                },
            },
        },
    },
}


def test_valid_document_passes() -> None:
    doc = {"name": "order", "status": "final", "items": [{"name": "a", "qty": 2}]}
    report = check_json(json.dumps(doc), schema=SCHEMA)
    assert report.ok and report.valid_json and report.schema_checked
    assert report.errors == []


def test_each_failure_has_its_json_path() -> None:
    doc = {
        "status": "sent",
        "items": [
            {"name": "a", "qty": 1},
            {"name": "b", "qty": 0},
            {"name": 7, "qty": 1.0},
            {"qty": 2},
        ],
        "extra": True,
    }
    report = check_json(json.dumps(doc), schema=SCHEMA)
    assert not report.ok
    found = {(e.path, e.keyword) for e in report.errors}
    assert found == {
        ("$.name", "required"),
        ("$.status", "enum"),
        ("$.items[1].qty", "minimum"),
        ("$.items[2].name", "type"),
        ("$.items[3].name", "required"),
        ("$.extra", "additionalProperties"),
    }
    assert report.error_count == 6


def test_odd_keys_are_quoted_in_paths() -> None:
    report = check_json(
        '{"a b": {"x": 1}}',
        schema={"properties": {"a b": {"properties": {"x": {"type": "string"}}}}},
    )
    assert [e.path for e in report.errors] == ['$["a b"].x']


def test_syntax_error_has_line_and_column() -> None:
    report = check_json('{\n  "a": 1,\n  "b": [1, 2,]\n}\n')
    assert not report.ok and not report.valid_json
    assert report.syntax_error is not None
    assert (report.syntax_error.line, report.syntax_error.column) == (3, 14)


def test_bad_schema_is_invalid_input(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"bad schema at \$.properties.a.type: unknown type"):
        check_json("{}", schema={"properties": {"a": {"type": "str"}}})
    with pytest.raises(InvalidInput, match="unsupported keyword"):
        check_json("{}", schema={"patternProperties": {}})
    bad = tmp_path / "schema.json"
    bad.write_text("{not json")
    with pytest.raises(InvalidInput, match="schema is not valid JSON"):
        check_json("{}", schema=bad)


def test_cli_schema_file(hybrid_cli, tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps({"name": "x", "items": [{"name": "a", "qty": "2"}]}))
    code, out, _ = hybrid_cli("check", "json", str(doc), "--schema", str(schema))
    assert code == 1
    assert "$.items[0].qty: expected integer, got string" in out
    code, out, _ = hybrid_cli("check", "json", str(doc), "--json")
    assert code == 0 and json.loads(out)["ok"] is True
    doc.write_text("[1,")
    code, out, _ = hybrid_cli("check", "json", str(doc))
    assert code == 1 and f"{doc}:1:3: not valid JSON" in out
    code, _, err = hybrid_cli("check", "json", str(doc), "--schema", str(tmp_path / "none.json"))
    assert code == 2 and err.count("\n") == 1 and "no such schema file" in err


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    report = check_json("[" * 5000 + "]" * 5000)
    assert report.termination.value == "ok"
    assert not report.valid_json
    assert report.syntax_error is not None and "recursion" in report.syntax_error.message
