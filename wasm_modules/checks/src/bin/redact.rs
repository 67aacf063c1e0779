//! `redact`: scrub secrets from text, bound its length and wrap it as untrusted evidence.
//!
//! Request: {"literals": [...], "max_bytes": 32768, "entropy": true, "label": "pytest"}.
//! Data: the text on stdin. Output: the wrapped text and a count per kind; never a secret.
//! Order matters: literals, then private key blocks, then token formats, then key=value
//! assignments, then high-entropy runs; the length bound is applied last, so a cut can never
//! expose half of a secret that a rule would have matched whole.

use hybrid_checks::{fail, request};
use regex::{Captures, Regex};
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    #[serde(default)]
    literals: Vec<String>,
    #[serde(default = "default_max_bytes")]
    max_bytes: usize,
    #[serde(default = "default_true")]
    entropy: bool,
    #[serde(default)]
    label: Option<String>,
}

fn default_max_bytes() -> usize {
    32 * 1024
}
fn default_true() -> bool {
    true
}

const OPEN: &str = "<untrusted-evidence";
const CLOSE: &str = "</untrusted-evidence>";

fn marker(kind: &str) -> String {
    format!("[REDACTED:{}]", kind)
}

struct Rule {
    kind: &'static str,
    pattern: &'static str,
    /// The capture group holding the secret (0: the whole match).
    secret: usize,
    /// Lowercase words at least one of which every match contains.
    hints: &'static [&'static str],
}

const RULES: &[Rule] = &[
    Rule {
        kind: "private_key",
        pattern: r"(?s)-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z0-9 ]*-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY[A-Z0-9 ]*-----|\z)",
        secret: 0,
        hints: &["private key"],
    },
    Rule {
        kind: "aws_access_key_id",
        pattern: r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|ABIA|ACCA)[A-Z0-9]{16}\b",
        secret: 0,
        hints: &["akia", "asia", "agpa", "aida", "aroa", "aipa", "anpa", "anva", "abia", "acca"],
    },
    Rule {
        kind: "aws_secret_access_key",
        pattern: r#"(?i)(aws_?secret_?(?:access_?)?key["']?\s*(?:=|:|=>)\s*["']?)([A-Za-z0-9/+=]{40})"#,
        secret: 2,
        hints: &["aws"],
    },
    Rule { kind: "gcp_api_key", pattern: r"\bAIza[0-9A-Za-z_\-]{35}", secret: 0, hints: &["aiza"] },
    Rule {
        kind: "github_token",
        pattern: r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})",
        secret: 0,
        hints: &["ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"],
    },
    Rule {
        kind: "slack_token",
        pattern: r"\bxox[abposr]-[A-Za-z0-9\-]{10,}",
        secret: 0,
        hints: &["xox"],
    },
    Rule {
        kind: "api_key",
        pattern: r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_\-]{20,}",
        secret: 0,
        hints: &["sk-"],
    },
    Rule {
        kind: "jwt",
        pattern: r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
        secret: 0,
        hints: &["eyj"],
    },
    Rule {
        kind: "bearer_token",
        pattern: r"(?i)\bbearer\s+([A-Za-z0-9\-._~+/]{8,}=*)",
        secret: 1,
        hints: &["bearer"],
    },
    Rule {
        kind: "authorization",
        pattern: r"(?i)\b(authorization\s*[:=]\s*(?:basic|digest|token)\s+)([^\s]+)",
        secret: 2,
        hints: &["authorization"],
    },
    Rule {
        kind: "url_credentials",
        pattern: r"(?i)\b([a-z][a-z0-9+.\-]*://[^/\s:@]+:)([^@\s/]+)@",
        secret: 2,
        hints: &["://"],
    },
    // An unquoted value never starts with a bracket: `no passwd: [Errno 44]` and
    // `token: (none)` are prose about a secret, not one.
    Rule {
        kind: "assignment",
        pattern: r#"(?i)([A-Za-z0-9_.\-]*(?:password|passwd|pwd|secret|token|api[_\-]?key|apikey|access[_\-]?key|private[_\-]?key|credentials?|session[_\-]?id|cookie)[A-Za-z0-9_.\-]*["']?\s*(?:=|:|=>)\s*)("[^"\n]*"|'[^'\n]*'|[^\s,;'"\[(<{][^\s,;'"]*)"#,
        secret: 2,
        // Each spelling of the `key` names, not bare "key": KeyError and keys() are in most
        // Python evidence, and this pattern is the costliest to compile.
        hints: &[
            "passw",
            "pwd",
            "secret",
            "token",
            "apikey",
            "api_key",
            "api-key",
            "accesskey",
            "access_key",
            "access-key",
            "privatekey",
            "private_key",
            "private-key",
            "credential",
            "session",
            "cookie",
        ],
    },
];

struct Redactor {
    counts: BTreeMap<&'static str, u64>,
}

impl Redactor {
    /// Replace every match of `pattern`'s group `secret` (the whole match when 0), keeping the rest.
    fn rule(&mut self, text: String, kind: &'static str, pattern: &str, secret: usize) -> String {
        self.rule_if(text, kind, pattern, secret, |_| true)
    }

    /// Like `rule`, for matches that `keep` accepts (`keep` sees the captures).
    fn rule_if(
        &mut self,
        text: String,
        kind: &'static str,
        pattern: &str,
        secret: usize,
        keep: impl Fn(&Captures) -> bool,
    ) -> String {
        let re = Regex::new(pattern).expect("built-in pattern");
        let mut hits = 0u64;
        let out = re.replace_all(&text, |c: &Captures| {
            let whole = c.get(0).expect("match");
            let value = match c.get(secret) {
                Some(v) => v,
                None => return whole.as_str().to_string(),
            };
            if is_placeholder(value.as_str()) || !keep(c) {
                return whole.as_str().to_string();
            }
            hits += 1;
            let start = value.start() - whole.start();
            let end = value.end() - whole.start();
            let w = whole.as_str();
            format!("{}{}{}", &w[..start], marker(kind), &w[end..])
        });
        let out = out.into_owned();
        if hits > 0 {
            *self.counts.entry(kind).or_insert(0) += hits;
        }
        out
    }

    fn literals(&mut self, mut text: String, literals: &[String]) -> String {
        let mut sorted: Vec<&String> = literals.iter().filter(|l| !l.is_empty()).collect();
        sorted.sort_by_key(|l| std::cmp::Reverse(l.len())); // longest first: no partial leftovers
        for lit in sorted {
            let n = text.matches(lit.as_str()).count() as u64;
            if n > 0 {
                text = text.replace(lit.as_str(), &marker("literal"));
                *self.counts.entry("literal").or_insert(0) += n;
            }
        }
        text
    }

    fn entropy(&mut self, text: String) -> String {
        // Base64/base64url runs of 24+ chars, and hex runs of 32+; an optional digest prefix
        // (`sha256:`) marks a public content hash, which is kept. Most text has no such run:
        // then the pattern is not even compiled.
        if !has_run(&text, 24) {
            return text;
        }
        let re = Regex::new(r"(sha(?:1|256|384|512)[:=])?\b([A-Za-z0-9+/_\-]{24,}={0,2})")
            .expect("entropy");
        let mut hits = 0u64;
        let out = re.replace_all(&text, |c: &Captures| {
            let whole = c.get(0).expect("match").as_str();
            let token = c.get(2).expect("token").as_str();
            if c.get(1).is_some() || !looks_random(token) {
                return whole.to_string();
            }
            hits += 1;
            let prefix = &whole[..whole.len() - token.len()];
            format!("{}{}", prefix, marker("high_entropy"))
        });
        let out = out.into_owned();
        if hits > 0 {
            *self.counts.entry("high_entropy").or_insert(0) += hits;
        }
        out
    }
}

/// Whether `text` holds `min` consecutive base64/base64url characters (the entropy rule's token).
fn has_run(text: &str, min: usize) -> bool {
    let mut run = 0;
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'_' | b'-') {
            run += 1;
            if run >= min {
                return true;
            }
        } else {
            run = 0;
        }
    }
    false
}

fn is_placeholder(value: &str) -> bool {
    let v = value.trim_matches(|c| c == '"' || c == '\'');
    v.is_empty()
        || v.starts_with("[REDACTED:")
        || v.starts_with("${")
        || v.starts_with("$(")
        || v.starts_with("{{")
        || (v.starts_with('<') && v.ends_with('>'))
        || v.chars().all(|c| c == '*' || c == 'x' || c == 'X' || c == '.')
        || matches!(
            v.to_ascii_lowercase().as_str(),
            "null" | "none" | "true" | "false" | "nil" | "undefined"
        )
}

/// Keys that name a count or a tool, not a credential (`max_tokens: 4096`, `tokenizer = bert`).
fn counting_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "tokens",
        "tokenizer",
        "token_count",
        "token_limit",
        "token_type",
        "password_policy",
        "pwd_dir",
    ]
    .iter()
    .any(|w| k.contains(w))
        || k.trim_end_matches(|c: char| !c.is_ascii_alphanumeric()).ends_with("_len")
}

fn shannon(token: &str) -> f64 {
    let mut freq = [0u32; 256];
    for b in token.bytes() {
        freq[b as usize] += 1;
    }
    let n = token.len() as f64;
    freq.iter()
        .filter(|&&f| f > 0)
        .map(|&f| {
            let p = f as f64 / n;
            -p * p.log2()
        })
        .sum()
}

fn looks_random(token: &str) -> bool {
    let t = token.trim_end_matches('=');
    let hex = t.len() >= 32 && t.bytes().all(|b| b.is_ascii_hexdigit());
    if hex {
        // 40 hex digits is a git object id: public, and everywhere in build evidence.
        let mixed =
            t.bytes().any(|b| b.is_ascii_digit()) && t.bytes().any(|b| b.is_ascii_alphabetic());
        return t.len() != 40 && mixed && shannon(t) >= 3.0;
    }
    let upper = t.bytes().any(|b| b.is_ascii_uppercase());
    let lower = t.bytes().any(|b| b.is_ascii_lowercase());
    let digit = t.bytes().any(|b| b.is_ascii_digit());
    // Paths and CamelCase identifiers are long and mixed too, but switch between upper, lower
    // and digits only at word boundaries; random tokens switch at most characters.
    t.len() >= 24 && upper && lower && digit && shannon(t) >= 4.0 && class_switches(t) >= 0.4
}

fn class_switches(t: &str) -> f64 {
    let class = |b: u8| -> u8 {
        if b.is_ascii_uppercase() {
            0
        } else if b.is_ascii_lowercase() {
            1
        } else {
            2
        }
    };
    // Separators (`/`, `-`, `_`, `+`) are word boundaries in paths: judge the letters and digits.
    let bytes: Vec<u8> = t.bytes().filter(u8::is_ascii_alphanumeric).collect();
    let switches = bytes.windows(2).filter(|w| class(w[0]) != class(w[1])).count();
    switches as f64 / (bytes.len().max(2) - 1) as f64
}

fn floor_boundary(text: &str, mut idx: usize) -> usize {
    while idx > 0 && !text.is_char_boundary(idx) {
        idx -= 1;
    }
    idx
}

fn ceil_boundary(text: &str, mut idx: usize) -> usize {
    while idx < text.len() && !text.is_char_boundary(idx) {
        idx += 1;
    }
    idx
}

fn main() {
    let req: Request = request();
    if req.max_bytes < 64 {
        fail("request", "max_bytes must be at least 64");
    }
    let raw = hybrid_checks::read_stdin();
    let input_bytes = raw.len();
    let mut text = String::from_utf8_lossy(&raw).into_owned();
    drop(raw);
    let mut r = Redactor { counts: BTreeMap::new() };

    text = r.literals(text, &req.literals);
    // A rule whose hint words never occur is not even compiled: most evidence mentions few of
    // these formats, and compiling every pattern costs more than scanning for the hints. The
    // hints come from the text before any replacement, so they over-approximate, never miss.
    let lower = text.to_ascii_lowercase();
    for rule in RULES {
        if !rule.hints.iter().any(|h| lower.contains(h)) {
            continue;
        }
        text = if rule.kind == "assignment" {
            r.rule_if(text, rule.kind, rule.pattern, rule.secret, |c| {
                !counting_key(c.get(1).map(|k| k.as_str()).unwrap_or(""))
            })
        } else {
            r.rule(text, rule.kind, rule.pattern, rule.secret)
        };
    }
    if req.entropy {
        text = r.entropy(text);
    }

    // The wrapper must stay the only marker: neutralise any copy inside the text.
    let mut neutralised = 0u64;
    if lower.contains("untrusted-evidence") {
        let markers = Regex::new(r"(?i)<\s*/?\s*untrusted-evidence[^>]*>").expect("marker");
        neutralised = markers.find_iter(&text).count() as u64;
        if neutralised > 0 {
            text = markers.replace_all(&text, "[evidence-marker removed]").into_owned();
        }
    }

    if text.ends_with('\n') {
        text.pop(); // the wrapper puts its own newline before the closing marker
    }
    let mut cut = 0usize;
    if text.len() > req.max_bytes {
        let head_end = floor_boundary(&text, req.max_bytes / 2);
        let tail_start = ceil_boundary(&text, text.len() - (req.max_bytes - req.max_bytes / 2));
        cut = tail_start - head_end;
        text =
            format!("{}\n[... {} bytes cut ...]\n{}", &text[..head_end], cut, &text[tail_start..]);
    }

    let label = req.label.as_deref().map(|l| {
        l.chars()
            .filter(|c| c.is_ascii_alphanumeric() || "-_.:/ ".contains(*c))
            .take(80)
            .collect::<String>()
    });
    let open = match &label {
        Some(l) => format!("{} source=\"{}\">", OPEN, l),
        None => format!("{}>", OPEN),
    };
    let redactions: u64 = r.counts.values().sum();
    let wrapped = format!("{}\n{}\n{}", open, text, CLOSE);
    hybrid_checks::emit(&json!({
        "ok": true,
        "text": wrapped,
        "counts": r.counts,
        "redactions": redactions,
        "markers_neutralised": neutralised,
        "input_bytes": input_bytes,
        "truncated": cut > 0,
        "cut_bytes": cut,
    }));
}
