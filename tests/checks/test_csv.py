"""csv check: the rate-card example, types, ragged rows, delimiters, via the library and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hybrid.checks import check_csv
from hybrid.cli import cli
from hybrid.errors import InvalidInput
from hybrid.results import Termination

RATE_CARD = Path(__file__).resolve().parents[2] / "examples" / "rate_card.csv"


def test_rate_card_reports_the_missing_column_and_the_existing_ones() -> None:
    report = check_csv(RATE_CARD, require=["weight_kg", "zone", "cost_usd"])
    assert report.ok is False
    assert report.termination is Termination.OK
    assert report.missing == ["weight_kg"]
    assert report.columns == ["weight", "zone", "cost_usd"]
    assert report.rows == RATE_CARD.read_text().count("\n") - 1
    assert report.problems == ["missing column weight_kg; the columns are weight, zone, cost_usd"]
    assert report.usage.fuel_used and report.usage.fuel_used > 0


def test_rate_card_via_cli_json() -> None:
    result = CliRunner().invoke(
        cli, ["check", "csv", str(RATE_CARD), "--require", "weight_kg,zone,cost_usd", "--json"]
    )
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["ok"] is False
    assert data["missing"] == ["weight_kg"]
    assert data["columns"] == ["weight", "zone", "cost_usd"]


def test_rate_card_via_cli_human(hybrid_cli) -> None:
    code, out, _ = hybrid_cli(
        "check", "csv", str(RATE_CARD), "--require", "weight_kg,zone,cost_usd"
    )
    assert code == 1
    assert "missing: weight_kg" in out
    assert "columns: weight, zone, cost_usd" in out


def test_passing_check_exits_zero(hybrid_cli) -> None:
    code, out, _ = hybrid_cli(
        "check",
        "csv",
        str(RATE_CARD),
        "--require",
        "weight,zone",
        "--types",
        "weight=float,cost_usd=float,zone=string",
    )
    assert code == 0, out
    assert out.splitlines()[-1].startswith("ok")


def test_first_bad_type_has_its_line_number() -> None:
    data = "id,when,price,active\n1,2024-01-31,9.5,true\n2,2024-02-30,3,no\n3,2024-03-01,x,yes\n"
    report = check_csv(
        data, types={"id": "int", "when": "date", "price": "float", "active": "bool"}
    )
    assert not report.ok
    assert report.bad_rows == 2
    bad = report.first_bad_row
    assert bad is not None
    assert (bad.line, bad.row, bad.column, bad.value, bad.expected) == (
        3,
        2,
        "when",
        "2024-02-30",
        "date",
    )


def test_ragged_row_and_quoted_newlines_keep_line_numbers() -> None:
    data = 'a,b\n1,"two\nlines"\n3\n4,5\n'
    report = check_csv(data.encode())
    assert report.rows == 3
    assert report.first_bad_row is not None
    assert report.first_bad_row.line == 4
    assert "ragged row: 1 fields, expected 2" in report.first_bad_row.reason


def test_empty_cells_fail_typed_columns_unless_allowed() -> None:
    data = "a,b\n1,\n"
    assert not check_csv(data, types={"b": "int"}).ok
    assert check_csv(data, types={"b": "int"}, allow_empty=True).ok


def test_delimiter_and_bom() -> None:
    data = "\ufeffweight;zone\n1.5;z1\n".encode()
    report = check_csv(data, delimiter=";", require=["weight"], types={"weight": "float"})
    assert report.ok, report.problems
    assert report.columns == ["weight", "zone"]
    assert check_csv("a\tb\n1\t2\n", delimiter="tab", types={"b": "int"}).ok


def test_empty_input_is_a_failed_check() -> None:
    report = check_csv(b"", require=["a"])
    assert not report.ok
    assert report.missing == ["a"]


def test_bad_requests_raise_invalid_input(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="unknown type"):
        check_csv(RATE_CARD, types={"zone": "uuid"})
    with pytest.raises(InvalidInput, match="delimiter"):
        check_csv(RATE_CARD, delimiter=";;")
    with pytest.raises(InvalidInput, match="no such file"):
        check_csv(tmp_path / "absent.csv")


def test_missing_file_is_one_line_and_exit_2(hybrid_cli, tmp_path: Path) -> None:
    code, out, err = hybrid_cli("check", "csv", str(tmp_path / "absent.csv"))
    assert code == 2
    assert out == ""
    assert err.strip().count("\n") == 0 and "no such file" in err
    code, _, err = hybrid_cli("check", "csv", str(RATE_CARD), "--types", "weight")
    assert code == 2 and "COLUMN=TYPE" in err


def test_csv_from_stdin(hybrid_cli) -> None:
    code, out, _ = hybrid_cli("check", "csv", "-", "--require", "x", "--json", stdin=b"x,y\n1,2\n")
    assert code == 0
    assert json.loads(out)["rows"] == 1


def test_fuel_budget_stops_a_large_file() -> None:
    from hybrid.policy import Budget

    data = "a,b\n" + "1,2\n" * 20000
    report = check_csv(data, types={"a": "int"}, budget=Budget(fuel=200_000))
    assert report.termination is Termination.OUT_OF_FUEL
    assert not report.ok


def test_whole_process_console_script() -> None:
    import shutil
    import subprocess

    exe = shutil.which("hybrid")
    if exe is None:
        pytest.skip("the hybrid console script is not installed")
    done = subprocess.run(
        [exe, "check", "csv", str(RATE_CARD), "--require", "weight_kg,zone,cost_usd", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["missing"] == ["weight_kg"]
    assert done.stderr == ""


@pytest.mark.parametrize(
    ("data", "line"),
    [
        ("a,b\n1,2\n\n3\n", 4),  # a blank line before the bad row still counts
        ("a,b\r\n1,2\r\n3\r\n", 3),  # CRLF
        ("a,b\r\n1,2\r\n\r\n3\r\n", 4),
        ('a,b\n1,"x\ny"\n3\n', 4),  # a quoted newline spans two lines
    ],
)
def test_line_numbers_are_file_lines(data: str, line: int) -> None:
    bad = check_csv(data).first_bad_row
    assert bad is not None and bad.line == line


def test_memory_cap_below_the_module_minimum(hybrid_cli) -> None:
    from hybrid.policy import Budget

    report = check_csv(RATE_CARD, budget=Budget(memory="100k"))
    assert report.termination is Termination.OUT_OF_MEMORY and not report.ok
    code, out, err = hybrid_cli("check", "csv", str(RATE_CARD), "--memory", "100k")
    assert code == 4 and out == ""
    assert err.startswith("hybrid: error: check ended with out_of_memory")


def test_a_path_string_is_never_checked_as_csv_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """check_csv("examples/rate_card.csv") used to pass as a one-column CSV with no rows."""
    monkeypatch.chdir(RATE_CARD.parents[1])
    with pytest.raises(InvalidInput, match=r"is the name of a file, not CSV text: pass path="):
        check_csv("examples/rate_card.csv", require=["weight_kg"])
    by_path = check_csv(path="examples/rate_card.csv", require=["weight_kg"])
    assert by_path.missing == ["weight_kg"] and by_path.columns == ["weight", "zone", "cost_usd"]
    assert check_csv(RATE_CARD).columns == by_path.columns  # a Path positional: still a file
    text = check_csv("weight_kg,zone\n1,a\n", require=["weight_kg"])  # text: still text
    assert text.ok and text.rows == 1
    assert check_csv("examples-not-a-file.csv").columns == ["examples-not-a-file.csv"]
    with pytest.raises(InvalidInput, match="not both or neither"):
        check_csv("a\n", path=RATE_CARD)
    with pytest.raises(InvalidInput, match="not both or neither"):
        check_csv()
