//! `json`: parse (line:column of a syntax error) and validate against a small schema, reporting
//! the JSON path (`$.items[2].name`) of every failure.
//!
//! Request: {"schema": {...} | null, "max_errors": 100}. Data: the document on stdin.
//! Schema keywords: type, required, properties, additionalProperties (bool), items, enum, const,
//! minimum, maximum, minLength, maxLength, minItems, maxItems; annotations are ignored.

use hybrid_checks::{clip, fail, request};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    #[serde(default)]
    schema: Option<Value>,
    #[serde(default = "default_max_errors")]
    max_errors: usize,
}

fn default_max_errors() -> usize {
    100
}

const TYPES: [&str; 7] = ["object", "array", "string", "number", "integer", "boolean", "null"];
const ANNOTATIONS: [&str; 8] =
    ["$schema", "$id", "$comment", "title", "description", "default", "examples", "format"];

#[derive(Default)]
struct Schema {
    types: Option<Vec<String>>,
    required: Vec<String>,
    properties: BTreeMap<String, Schema>,
    additional: Option<bool>,
    items: Option<Box<Schema>>,
    allowed: Option<Vec<Value>>,
    minimum: Option<f64>,
    maximum: Option<f64>,
    min_length: Option<u64>,
    max_length: Option<u64>,
    min_items: Option<u64>,
    max_items: Option<u64>,
}

fn bad_schema(at: &str, message: &str) -> ! {
    fail("schema", &format!("bad schema at {}: {}", at, message))
}

fn compile(value: &Value, at: &str, depth: usize) -> Schema {
    if depth > 64 {
        bad_schema(at, "nested too deeply");
    }
    let object = match value {
        Value::Object(o) => o,
        Value::Bool(true) => return Schema::default(),
        _ => bad_schema(at, "a schema must be an object"),
    };
    let mut s = Schema::default();
    for (key, v) in object {
        let here = format!("{}.{}", at, key);
        match key.as_str() {
            "type" => {
                let names: Vec<String> = match v {
                    Value::String(t) => vec![t.clone()],
                    Value::Array(ts) => ts
                        .iter()
                        .map(|t| match t.as_str() {
                            Some(t) => t.to_string(),
                            None => bad_schema(&here, "type names must be strings"),
                        })
                        .collect(),
                    _ => bad_schema(&here, "type must be a string or a list of strings"),
                };
                for n in &names {
                    if !TYPES.contains(&n.as_str()) {
                        bad_schema(
                            &here,
                            &format!("unknown type {:?} (use {})", n, TYPES.join(", ")),
                        );
                    }
                }
                s.types = Some(names);
            }
            "required" => match v.as_array() {
                Some(list) => {
                    for k in list {
                        match k.as_str() {
                            Some(k) => s.required.push(k.to_string()),
                            None => bad_schema(&here, "required must list strings"),
                        }
                    }
                }
                None => bad_schema(&here, "required must be a list of strings"),
            },
            "properties" => match v.as_object() {
                Some(props) => {
                    for (name, sub) in props {
                        let sub_at = format!("{}.{}", here, name);
                        s.properties.insert(name.clone(), compile(sub, &sub_at, depth + 1));
                    }
                }
                None => bad_schema(&here, "properties must be an object"),
            },
            "additionalProperties" => match v.as_bool() {
                Some(b) => s.additional = Some(b),
                None => bad_schema(&here, "only true or false is supported"),
            },
            "items" => s.items = Some(Box::new(compile(v, &here, depth + 1))),
            "enum" => match v.as_array() {
                Some(list) => s.allowed = Some(list.clone()),
                None => bad_schema(&here, "enum must be a list"),
            },
            "const" => s.allowed = Some(vec![v.clone()]),
            "minimum" | "maximum" => {
                let n = v.as_f64().unwrap_or_else(|| bad_schema(&here, "must be a number"));
                if key == "minimum" {
                    s.minimum = Some(n)
                } else {
                    s.maximum = Some(n)
                }
            }
            "minLength" | "maxLength" | "minItems" | "maxItems" => {
                let n = v
                    .as_u64()
                    .unwrap_or_else(|| bad_schema(&here, "must be a non-negative integer"));
                match key.as_str() {
                    "minLength" => s.min_length = Some(n),
                    "maxLength" => s.max_length = Some(n),
                    "minItems" => s.min_items = Some(n),
                    _ => s.max_items = Some(n),
                }
            }
            k if ANNOTATIONS.contains(&k) => {}
            k => bad_schema(&here, &format!("unsupported keyword {:?}", k)),
        }
    }
    s
}

fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn has_type(v: &Value, t: &str) -> bool {
    match (t, v) {
        ("number", Value::Number(_)) => true,
        ("integer", Value::Number(n)) => {
            n.is_i64() || n.is_u64() || n.as_f64().map(|f| f.fract() == 0.0).unwrap_or(false)
        }
        _ => type_of(v) == t,
    }
}

fn child_path(path: &str, key: &str) -> String {
    let simple = !key.is_empty()
        && !key.starts_with(|c: char| c.is_ascii_digit())
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if simple {
        format!("{}.{}", path, key)
    } else {
        format!("{}[{}]", path, Value::String(key.to_string()))
    }
}

struct Validator {
    errors: Vec<Value>,
    max: usize,
    total: usize,
}

impl Validator {
    fn error(&mut self, path: &str, keyword: &str, message: String) {
        self.total += 1;
        if self.errors.len() < self.max {
            self.errors.push(json!({ "path": path, "keyword": keyword, "message": message }));
        }
    }

    fn check(&mut self, s: &Schema, v: &Value, path: &str) {
        if let Some(types) = &s.types {
            if !types.iter().any(|t| has_type(v, t)) {
                let want = types.join(" or ");
                self.error(path, "type", format!("expected {}, got {}", want, type_of(v)));
                return;
            }
        }
        if let Some(allowed) = &s.allowed {
            if !allowed.contains(v) {
                let shown: Vec<String> = allowed.iter().map(|a| clip(&a.to_string(), 40)).collect();
                self.error(
                    path,
                    "enum",
                    format!("{} is not one of {}", clip(&v.to_string(), 60), shown.join(", ")),
                );
            }
        }
        match v {
            Value::Object(map) => self.check_object(s, map, path),
            Value::Array(items) => {
                let n = items.len() as u64;
                if let Some(min) = s.min_items {
                    if n < min {
                        self.error(
                            path,
                            "minItems",
                            format!("{} items, at least {} required", n, min),
                        );
                    }
                }
                if let Some(max) = s.max_items {
                    if n > max {
                        self.error(
                            path,
                            "maxItems",
                            format!("{} items, at most {} allowed", n, max),
                        );
                    }
                }
                if let Some(item) = &s.items {
                    for (i, element) in items.iter().enumerate() {
                        self.check(item, element, &format!("{}[{}]", path, i));
                    }
                }
            }
            Value::String(text) => {
                let n = text.chars().count() as u64;
                if let Some(min) = s.min_length {
                    if n < min {
                        self.error(path, "minLength", format!("length {} is below {}", n, min));
                    }
                }
                if let Some(max) = s.max_length {
                    if n > max {
                        self.error(path, "maxLength", format!("length {} is above {}", n, max));
                    }
                }
            }
            Value::Number(num) => {
                let x = num.as_f64().unwrap_or(0.0);
                if let Some(min) = s.minimum {
                    if x < min {
                        self.error(
                            path,
                            "minimum",
                            format!("{} is below the minimum {}", num, min),
                        );
                    }
                }
                if let Some(max) = s.maximum {
                    if x > max {
                        self.error(
                            path,
                            "maximum",
                            format!("{} is above the maximum {}", num, max),
                        );
                    }
                }
            }
            _ => {}
        }
    }

    fn check_object(&mut self, s: &Schema, map: &Map<String, Value>, path: &str) {
        for key in &s.required {
            if !map.contains_key(key) {
                let at = child_path(path, key);
                self.error(&at, "required", format!("required key {:?} is missing", key));
            }
        }
        for (key, value) in map {
            let at = child_path(path, key);
            match s.properties.get(key) {
                Some(sub) => self.check(sub, value, &at),
                None if s.additional == Some(false) => {
                    self.error(&at, "additionalProperties", format!("unexpected key {:?}", key))
                }
                None => {}
            }
        }
    }
}

fn main() {
    let req: Request = request();
    let schema = req.schema.as_ref().map(|s| compile(s, "$", 0));
    let data = hybrid_checks::read_stdin();
    let doc: Value = match serde_json::from_slice(&data) {
        Ok(doc) => doc,
        Err(err) => {
            let text = err.to_string();
            let message = match text.rfind(" at line ") {
                Some(idx) => text[..idx].to_string(),
                None => text,
            };
            hybrid_checks::emit(&json!({
                "ok": false,
                "valid_json": false,
                "syntax_error": { "line": err.line(), "column": err.column(), "message": message },
                "errors": [],
                "error_count": 0,
            }));
            return;
        }
    };
    let mut validator = Validator { errors: Vec::new(), max: req.max_errors.max(1), total: 0 };
    if let Some(schema) = &schema {
        validator.check(schema, &doc, "$");
    }
    hybrid_checks::emit(&json!({
        "ok": validator.total == 0,
        "valid_json": true,
        "syntax_error": Value::Null,
        "root_type": type_of(&doc),
        "schema_checked": schema.is_some(),
        "errors": validator.errors,
        "error_count": validator.total,
    }));
}
