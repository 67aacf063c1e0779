//! `grep`: linear-time regex search over a read-only directory preopened at `root` (default /data).
//!
//! Request: {"pattern": "...", "ignore_case": false, "context": 0, "max_matches": 1000,
//!           "globs": ["*.py"], "paths": ["sub/dir", "file.txt"], "max_file_bytes": 16777216}.
//! One entry per matching line: path, 1-based line and column (in characters), the line and its
//! context. Binary files (a NUL in the first 8 KiB) and `.git` directories are skipped.

use hybrid_checks::{clip, fail, request, Glob};
use regex::{Regex, RegexBuilder};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    pattern: String,
    #[serde(default)]
    ignore_case: bool,
    #[serde(default)]
    context: usize,
    #[serde(default = "default_max_matches")]
    max_matches: usize,
    #[serde(default)]
    globs: Vec<String>,
    #[serde(default)]
    paths: Vec<String>,
    #[serde(default = "default_root")]
    root: String,
    #[serde(default = "default_max_file_bytes")]
    max_file_bytes: u64,
}

fn default_max_matches() -> usize {
    1000
}
fn default_root() -> String {
    "/data".to_string()
}
fn default_max_file_bytes() -> u64 {
    16 * 1024 * 1024
}

const LINE_LIMIT: usize = 400;

struct Search {
    regex: Regex,
    globs: Vec<Glob>,
    context: usize,
    max_matches: usize,
    max_file_bytes: u64,
    root: String,
    matches: Vec<Value>,
    files_scanned: u64,
    files_matched: u64,
    binary_skipped: u64,
    large_skipped: u64,
    unreadable: Vec<String>,
    truncated: bool,
}

impl Search {
    fn relative<'a>(&self, full: &'a str) -> &'a str {
        full.strip_prefix(&self.root).map(|r| r.trim_start_matches('/')).unwrap_or(full)
    }

    fn shown<'a>(&self, dir: &'a str) -> &'a str {
        match self.relative(dir) {
            "" => ".",
            rel => rel,
        }
    }

    fn walk(&mut self, dir: &str) {
        let mut entries: Vec<(String, bool)> = Vec::new();
        match std::fs::read_dir(dir) {
            Ok(iter) => {
                for entry in iter {
                    // An entry WASI cannot represent (a name that is not UTF-8) ends the listing:
                    // say so instead of reporting a silently shorter search.
                    let e = match entry {
                        Ok(e) => e,
                        Err(err) => {
                            self.unreadable.push(format!("{}: cannot list: {}", self.shown(dir), err));
                            break;
                        }
                    };
                    let kind = match e.file_type() {
                        Ok(kind) => kind,
                        Err(_) => continue,
                    };
                    let name = e.file_name().to_string_lossy().into_owned();
                    if kind.is_dir() {
                        entries.push((name, true));
                    } else if kind.is_file() {
                        entries.push((name, false));
                    } // symlinks and devices are not followed
                }
            }
            Err(err) => {
                self.unreadable.push(format!("{}: {}", self.shown(dir), err));
                return;
            }
        };
        entries.sort();
        for (name, is_dir) in entries {
            if self.truncated {
                return;
            }
            let path = format!("{}/{}", dir.trim_end_matches('/'), name);
            if is_dir {
                if name != ".git" {
                    self.walk(&path);
                }
            } else {
                self.file(&path, false);
            }
        }
    }

    fn file(&mut self, path: &str, explicit: bool) {
        let rel = self.relative(path).to_string();
        if !explicit && !self.globs.is_empty() && !self.globs.iter().any(|g| g.matches(&rel)) {
            return;
        }
        match std::fs::metadata(path) {
            Ok(meta) if meta.len() > self.max_file_bytes => {
                self.large_skipped += 1;
                return;
            }
            Ok(_) => {}
            Err(err) => {
                self.unreadable.push(format!("{}: {}", rel, err));
                return;
            }
        }
        let data = match std::fs::read(path) {
            Ok(d) => d,
            Err(err) => {
                self.unreadable.push(format!("{}: {}", rel, err));
                return;
            }
        };
        if data[..data.len().min(8192)].contains(&0) {
            self.binary_skipped += 1;
            return;
        }
        self.files_scanned += 1;
        let text = String::from_utf8_lossy(&data);
        let lines: Vec<&str> =
            text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).collect();
        // "a\nb\n" is two lines, "" none (like grep: an empty file has no empty line to match).
        let count = if text.is_empty() {
            0
        } else if text.ends_with('\n') {
            lines.len() - 1
        } else {
            lines.len()
        };
        let mut matched = false;
        for i in 0..count {
            let line = lines[i];
            if let Some(m) = self.regex.find(line) {
                if self.matches.len() >= self.max_matches {
                    self.truncated = true;
                    break;
                }
                matched = true;
                let column = line[..m.start()].chars().count() + 1;
                let before: Vec<String> = lines[i.saturating_sub(self.context)..i]
                    .iter()
                    .map(|l| clip(l, LINE_LIMIT))
                    .collect();
                let end = (i + 1 + self.context).min(count);
                let after: Vec<String> =
                    lines[i + 1..end].iter().map(|l| clip(l, LINE_LIMIT)).collect();
                self.matches.push(json!({
                    "path": rel,
                    "line": i + 1,
                    "column": column,
                    "text": clip(line, LINE_LIMIT),
                    "match": clip(m.as_str(), 200),
                    "before": before,
                    "after": after,
                }));
            }
        }
        if matched {
            self.files_matched += 1;
        }
    }
}

fn one_line_regex_error(pattern: &str, err: regex::Error) -> String {
    match err {
        regex::Error::Syntax(text) => {
            let reason = text
                .lines()
                .rev()
                .find(|l| l.trim_start().starts_with("error:"))
                .map(|l| l.trim_start().trim_start_matches("error:").trim().to_string())
                .unwrap_or_else(|| text.lines().last().unwrap_or("syntax error").to_string());
            format!("invalid pattern {:?}: {}", pattern, reason)
        }
        regex::Error::CompiledTooBig(limit) => {
            format!(
                "pattern {:?} is too large to compile (limit {} bytes)",
                clip(pattern, 80),
                limit
            )
        }
        other => format!("invalid pattern {:?}: {}", pattern, other),
    }
}

fn main() {
    let req: Request = request();
    if req.pattern.is_empty() {
        fail("pattern", "empty pattern");
    }
    // Bounded compilation: a pattern like `\w{1000}{1000}` fails with a clear error, not a blowup.
    let regex = match RegexBuilder::new(&req.pattern)
        .case_insensitive(req.ignore_case)
        .size_limit(4 * 1024 * 1024)
        .dfa_size_limit(4 * 1024 * 1024)
        .nest_limit(100)
        .build()
    {
        Ok(r) => r,
        Err(err) => fail("pattern", &one_line_regex_error(&req.pattern, err)),
    };
    let mut globs = Vec::new();
    for g in &req.globs {
        match Glob::new(g) {
            Ok(glob) => globs.push(glob),
            Err(err) => fail("request", &err),
        }
    }
    let root = req.root.trim_end_matches('/').to_string();
    let mut search = Search {
        regex,
        globs,
        context: req.context.min(50),
        max_matches: req.max_matches,
        max_file_bytes: req.max_file_bytes,
        root: root.clone(),
        matches: Vec::new(),
        files_scanned: 0,
        files_matched: 0,
        binary_skipped: 0,
        large_skipped: 0,
        unreadable: Vec::new(),
        truncated: false,
    };
    if req.paths.is_empty() {
        search.walk(&root);
    } else {
        for p in &req.paths {
            if p.split('/').any(|part| part == "..") || p.starts_with('/') {
                fail(
                    "request",
                    &format!("path {:?} must be relative to the searched directory", p),
                );
            }
            let full = format!("{}/{}", root, p.trim_start_matches("./"));
            match std::fs::metadata(&full) {
                Ok(meta) if meta.is_dir() => search.walk(&full),
                Ok(_) => search.file(&full, true),
                Err(err) => fail("input", &format!("{}: {}", p, err)),
            }
        }
    }
    hybrid_checks::emit(&json!({
        "ok": true,
        "pattern": req.pattern,
        "found": !search.matches.is_empty(),
        "matches": search.matches,
        "files_scanned": search.files_scanned,
        "files_matched": search.files_matched,
        "binary_skipped": search.binary_skipped,
        "large_skipped": search.large_skipped,
        "unreadable": search.unreadable,
        "truncated": search.truncated,
    }));
}
