//! `csv`: headers, required columns, column types, row count and the first bad row.
//!
//! Request: {"require": [..], "types": {"col": "int|float|bool|date|string"}, "delimiter": ",",
//!           "allow_empty": false}. Data: the CSV text on stdin.

use hybrid_checks::{clip, fail, request};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    #[serde(default)]
    require: Vec<String>,
    #[serde(default)]
    types: BTreeMap<String, String>,
    #[serde(default)]
    delimiter: Option<String>,
    /// Empty cells pass any type check (they are missing values, not bad ones).
    #[serde(default)]
    allow_empty: bool,
}

#[derive(Clone, Copy)]
enum Kind {
    Int,
    Float,
    Bool,
    Date,
    Str,
}

impl Kind {
    fn parse(name: &str) -> Option<Kind> {
        Some(match name {
            "int" | "integer" => Kind::Int,
            "float" | "number" => Kind::Float,
            "bool" | "boolean" => Kind::Bool,
            "date" => Kind::Date,
            "string" | "str" => Kind::Str,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Int => "int",
            Kind::Float => "float",
            Kind::Bool => "bool",
            Kind::Date => "date",
            Kind::Str => "string",
        }
    }

    fn accepts(self, value: &str) -> bool {
        let v = value.trim();
        match self {
            Kind::Int => v.parse::<i64>().is_ok(),
            Kind::Float => v.parse::<f64>().map(f64::is_finite).unwrap_or(false),
            Kind::Bool => matches!(
                v.to_ascii_lowercase().as_str(),
                "true" | "false" | "yes" | "no" | "1" | "0" | "t" | "f" | "y" | "n"
            ),
            Kind::Date => is_date(v),
            Kind::Str => true,
        }
    }
}

fn is_date(v: &str) -> bool {
    let b = v.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let num = |s: &str| -> Option<u32> {
        if s.bytes().all(|c| c.is_ascii_digit()) {
            s.parse().ok()
        } else {
            None
        }
    };
    let (y, m, d) = match (num(&v[0..4]), num(&v[5..7]), num(&v[8..10])) {
        (Some(y), Some(m), Some(d)) => (y, m, d),
        _ => return false,
    };
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&d)
}

fn delimiter(option: &Option<String>) -> u8 {
    match option.as_deref() {
        None | Some("") => b',',
        Some("\\t") | Some("tab") => b'\t',
        Some(d) if d.len() == 1 && d.is_ascii() => d.as_bytes()[0],
        Some(d) => fail("request", &format!("delimiter must be one ASCII character, got {:?}", d)),
    }
}

fn main() {
    let req: Request = request();
    let delim = delimiter(&req.delimiter);
    let mut typed: Vec<(String, Kind)> = Vec::new();
    for (column, name) in &req.types {
        match Kind::parse(name) {
            Some(kind) => typed.push((column.clone(), kind)),
            None => fail(
                "request",
                &format!(
                    "unknown type {:?} for column {:?} (use int, float, bool, date or string)",
                    name, column
                ),
            ),
        }
    }

    // In memory, so line numbers come from byte offsets: csv's own line counter skips blank
    // lines and miscounts CRLF files.
    let data = hybrid_checks::read_stdin();
    let mut reader = csv::ReaderBuilder::new()
        .delimiter(delim)
        .has_headers(false)
        .flexible(true)
        .from_reader(&data[..]);
    let mut counted_to = 0usize;
    let mut line_at = 1u64;
    let mut record = csv::ByteRecord::new();

    let header_read = match reader.read_byte_record(&mut record) {
        Ok(found) => found,
        Err(err) => fail("input", &format!("cannot read CSV: {}", err)),
    };
    if !header_read {
        hybrid_checks::emit(&json!({
            "ok": false,
            "columns": [],
            "missing": req.require,
            "rows": 0,
            "bad_rows": 0,
            "first_bad_row": Value::Null,
            "problems": ["empty input: no header row"],
        }));
        return;
    }
    let mut columns: Vec<String> =
        record.iter().map(|f| String::from_utf8_lossy(f).into_owned()).collect();
    if let Some(first) = columns.first_mut() {
        if let Some(stripped) = first.strip_prefix('\u{feff}') {
            *first = stripped.to_string();
        }
    }

    let mut missing: Vec<String> = Vec::new();
    for name in req.require.iter().chain(typed.iter().map(|(c, _)| c)) {
        if !columns.contains(name) && !missing.contains(name) {
            missing.push(name.clone());
        }
    }
    let mut duplicates: Vec<String> = Vec::new();
    for (i, name) in columns.iter().enumerate() {
        if columns[..i].contains(name) && !duplicates.contains(name) {
            duplicates.push(name.clone());
        }
    }
    let checks: Vec<(usize, &str, Kind)> = typed
        .iter()
        .filter_map(|(c, k)| columns.iter().position(|h| h == c).map(|i| (i, c.as_str(), *k)))
        .collect();

    let width = columns.len();
    let mut rows: u64 = 0;
    let mut bad_rows: u64 = 0;
    let mut first_bad: Value = Value::Null;
    loop {
        match reader.read_byte_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(err) => fail("input", &format!("cannot read CSV: {}", err)),
        }
        rows += 1;
        // A record's position is where reading began, before any blank lines (or the '\n' of a
        // CRLF) it skipped; the record itself starts after them.
        let mut offset =
            record.position().map(|p| p.byte() as usize).unwrap_or(counted_to).min(data.len());
        while offset < data.len() && (data[offset] == b'\n' || data[offset] == b'\r') {
            offset += 1;
        }
        if offset > counted_to {
            line_at += data[counted_to..offset].iter().filter(|&&b| b == b'\n').count() as u64;
            counted_to = offset;
        }
        let line = line_at;
        let mut problem: Option<Value> = None;
        if record.len() != width {
            problem = Some(json!({
                "line": line,
                "row": rows,
                "reason": format!("ragged row: {} fields, expected {}", record.len(), width),
            }));
        } else {
            for &(idx, column, kind) in &checks {
                let raw = record.get(idx).unwrap_or(b"");
                let value = match std::str::from_utf8(raw) {
                    Ok(v) => v,
                    Err(_) => {
                        problem = Some(json!({
                            "line": line, "row": rows, "column": column,
                            "reason": "invalid UTF-8",
                        }));
                        break;
                    }
                };
                if value.trim().is_empty() {
                    if req.allow_empty || matches!(kind, Kind::Str) {
                        continue;
                    }
                    problem = Some(json!({
                        "line": line, "row": rows, "column": column, "value": value,
                        "expected": kind.name(),
                        "reason": format!("empty value in {} column {:?}", kind.name(), column),
                    }));
                    break;
                }
                if !kind.accepts(value) {
                    problem = Some(json!({
                        "line": line, "row": rows, "column": column, "value": clip(value, 200),
                        "expected": kind.name(),
                        "reason": format!("{:?} is not a valid {} (column {:?})", clip(value, 60), kind.name(), column),
                    }));
                    break;
                }
            }
        }
        if let Some(p) = problem {
            bad_rows += 1;
            if first_bad.is_null() {
                first_bad = p;
            }
        }
    }

    let mut problems: Vec<String> = Vec::new();
    if !missing.is_empty() {
        problems.push(format!(
            "missing column{} {}; the columns are {}",
            if missing.len() == 1 { "" } else { "s" },
            missing.join(", "),
            columns.join(", ")
        ));
    }
    if bad_rows > 0 {
        let reason = first_bad.get("reason").and_then(Value::as_str).unwrap_or("");
        let line = first_bad.get("line").and_then(Value::as_u64).unwrap_or(0);
        problems.push(format!("{} bad row(s); first on line {}: {}", bad_rows, line, reason));
    }
    hybrid_checks::emit(&json!({
        "ok": problems.is_empty(),
        "columns": columns,
        "missing": missing,
        "duplicate_columns": duplicates,
        "rows": rows,
        "bad_rows": bad_rows,
        "first_bad_row": first_bad,
        "problems": problems,
    }));
}
