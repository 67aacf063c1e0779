//! Shared plumbing of the built-in check modules: the request/response protocol and a glob matcher.
//!
//! Protocol: the request is one JSON object in argv[1], data arrives on stdin (or a preopened
//! read-only directory), and the module prints exactly one JSON object on stdout. Exit status 0
//! means the check ran (its verdict is in the JSON), 2 means the request or input was unusable:
//! `{"error": "...", "kind": "request" | "pattern" | "diff" | "schema" | "input"}`.

use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::io::{Read, Write};

/// Parse argv[1] as the request (an absent argument is `{}`); a bad request exits 2.
pub fn request<T: DeserializeOwned>() -> T {
    let raw = std::env::args_os()
        .nth(1)
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_else(|| "{}".to_string());
    match serde_json::from_str(&raw) {
        Ok(req) => req,
        Err(err) => fail("request", &format!("bad request: {}", err)),
    }
}

/// Print the error object and exit 2.
pub fn fail(kind: &str, message: &str) -> ! {
    emit(&json!({ "error": message, "kind": kind }));
    std::process::exit(2)
}

/// Print the one response object.
pub fn emit(value: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer(&mut out, value);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// All of stdin as bytes.
pub fn read_stdin() -> Vec<u8> {
    let mut data = Vec::new();
    if let Err(err) = std::io::stdin().lock().read_to_end(&mut data) {
        fail("input", &format!("cannot read stdin: {}", err));
    }
    data
}

/// At most `limit` characters of `text`, with an ellipsis when cut (for values echoed in reports).
pub fn clip(text: &str, limit: usize) -> String {
    match text.char_indices().nth(limit) {
        Some((idx, _)) => format!("{}...", &text[..idx]),
        None => text.to_string(),
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Lit(char),
    /// `*`: any run of characters other than `/`.
    Star,
    /// `**` as a whole segment at the end or in `/**`: anything, `/` included.
    Any,
    /// `**/`: zero or more whole directories.
    Dirs,
    /// `?`: one character other than `/`.
    One,
    Class(Vec<(char, char)>, bool),
}

/// A gitignore-style glob: `*`, `**`, `?`, `[a-z]`, `[!x]`, `{a,b}`. A pattern without `/` matches
/// the file name at any depth; one with `/` is anchored at the root (a leading `/` is dropped).
#[derive(Clone, Debug)]
pub struct Glob {
    pub source: String,
    alternatives: Vec<Vec<Tok>>,
    basename: bool,
}

impl Glob {
    pub fn new(pattern: &str) -> Result<Glob, String> {
        if pattern.is_empty() {
            return Err("empty glob".to_string());
        }
        let trimmed = pattern.strip_prefix('/').unwrap_or(pattern);
        let basename = !trimmed.contains('/');
        let mut alternatives = Vec::new();
        for alt in expand_braces(trimmed, 0)? {
            alternatives.push(tokenize(&alt)?);
        }
        Ok(Glob { source: pattern.to_string(), alternatives, basename })
    }

    /// Does the relative path (with `/` separators) match?
    pub fn matches(&self, path: &str) -> bool {
        let subject = if self.basename { path.rsplit('/').next().unwrap_or(path) } else { path };
        let chars: Vec<char> = subject.chars().collect();
        self.alternatives.iter().any(|toks| match_tokens(toks, &chars))
    }
}

fn expand_braces(pattern: &str, depth: usize) -> Result<Vec<String>, String> {
    if depth > 8 {
        return Err(format!("glob {:?}: braces nested too deeply", pattern));
    }
    let chars: Vec<char> = pattern.chars().collect();
    let mut open = None;
    let mut level = 0usize;
    for (i, &c) in chars.iter().enumerate() {
        match c {
            '{' => {
                if level == 0 {
                    open = Some(i);
                }
                level += 1;
            }
            '}' if level > 0 => {
                level -= 1;
                if level == 0 {
                    let start = open.unwrap_or(0);
                    let prefix: String = chars[..start].iter().collect();
                    let suffix: String = chars[i + 1..].iter().collect();
                    let mut parts = Vec::new();
                    let mut part = String::new();
                    let mut inner = 0usize;
                    for &c in &chars[start + 1..i] {
                        match c {
                            '{' => {
                                inner += 1;
                                part.push(c)
                            }
                            '}' => {
                                inner = inner.saturating_sub(1);
                                part.push(c)
                            }
                            ',' if inner == 0 => parts.push(std::mem::take(&mut part)),
                            _ => part.push(c),
                        }
                    }
                    parts.push(part);
                    let mut out = Vec::new();
                    for p in parts {
                        for tail in expand_braces(&format!("{}{}{}", prefix, p, suffix), depth + 1)?
                        {
                            out.push(tail);
                            if out.len() > 256 {
                                return Err(format!("glob {:?}: too many alternatives", pattern));
                            }
                        }
                    }
                    return Ok(out);
                }
            }
            _ => {}
        }
    }
    if level != 0 {
        return Err(format!("glob {:?}: unclosed '{{'", pattern));
    }
    Ok(vec![pattern.to_string()])
}

fn tokenize(pattern: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '*' => {
                if i + 1 < chars.len() && chars[i + 1] == '*' {
                    let at_segment_start = i == 0 || chars[i - 1] == '/';
                    let mut j = i;
                    while j < chars.len() && chars[j] == '*' {
                        j += 1;
                    }
                    if at_segment_start && j < chars.len() && chars[j] == '/' {
                        toks.push(Tok::Dirs);
                        i = j + 1;
                    } else {
                        toks.push(Tok::Any);
                        i = j;
                    }
                } else {
                    toks.push(Tok::Star);
                    i += 1;
                }
            }
            '?' => {
                toks.push(Tok::One);
                i += 1;
            }
            '[' => {
                let mut j = i + 1;
                let negate = j < chars.len() && (chars[j] == '!' || chars[j] == '^');
                if negate {
                    j += 1;
                }
                let mut ranges = Vec::new();
                let mut first = true;
                while j < chars.len() && (chars[j] != ']' || first) {
                    first = false;
                    let lo = chars[j];
                    if j + 2 < chars.len() && chars[j + 1] == '-' && chars[j + 2] != ']' {
                        ranges.push((lo, chars[j + 2]));
                        j += 3;
                    } else {
                        ranges.push((lo, lo));
                        j += 1;
                    }
                }
                if j >= chars.len() {
                    return Err(format!("glob {:?}: unclosed '['", pattern));
                }
                toks.push(Tok::Class(ranges, negate));
                i = j + 1;
            }
            '\\' if i + 1 < chars.len() => {
                toks.push(Tok::Lit(chars[i + 1]));
                i += 2;
            }
            _ => {
                toks.push(Tok::Lit(c));
                i += 1;
            }
        }
    }
    Ok(toks)
}

/// Dynamic programming over (token, char) positions: linear in pattern x path, no backtracking blowup.
fn match_tokens(toks: &[Tok], s: &[char]) -> bool {
    let n = s.len();
    // reach[j]: the tokens consumed so far can end exactly before s[j].
    let mut reach = vec![false; n + 1];
    reach[0] = true;
    for tok in toks {
        let mut next = vec![false; n + 1];
        match tok {
            Tok::Lit(c) => {
                for j in 0..n {
                    if reach[j] && s[j] == *c {
                        next[j + 1] = true;
                    }
                }
            }
            Tok::One => {
                for j in 0..n {
                    if reach[j] && s[j] != '/' {
                        next[j + 1] = true;
                    }
                }
            }
            Tok::Class(ranges, negate) => {
                for j in 0..n {
                    if reach[j] && s[j] != '/' {
                        let hit = ranges.iter().any(|&(lo, hi)| lo <= s[j] && s[j] <= hi);
                        if hit != *negate {
                            next[j + 1] = true;
                        }
                    }
                }
            }
            Tok::Star => {
                let mut open = false;
                for j in 0..=n {
                    if reach[j] {
                        open = true;
                    }
                    if open {
                        next[j] = true;
                    }
                    if j < n && s[j] == '/' {
                        open = false;
                    }
                }
            }
            Tok::Any => {
                let mut open = false;
                for j in 0..=n {
                    open |= reach[j];
                    next[j] = open;
                }
            }
            Tok::Dirs => {
                // Zero directories, or anything that ends just after a '/'.
                let mut open = false;
                for j in 0..=n {
                    if reach[j] {
                        next[j] = true;
                        open = true;
                    }
                    if open && j < n && s[j] == '/' {
                        next[j + 1] = true;
                    }
                }
            }
        }
        reach = next;
    }
    reach[n]
}

#[cfg(test)]
mod tests {
    use super::Glob;

    fn m(p: &str, s: &str) -> bool {
        Glob::new(p).unwrap().matches(s)
    }

    #[test]
    fn globs() {
        assert!(m(".env*", ".env"));
        assert!(m(".env*", "a/b/.env.local"));
        assert!(!m(".env*", "a/env"));
        assert!(m(".github/workflows/**", ".github/workflows/ci.yml"));
        assert!(!m(".github/workflows/**", "x/.github/workflows/ci.yml"));
        assert!(m("src/**/*.rs", "src/a.rs"));
        assert!(m("src/**/*.rs", "src/x/y/a.rs"));
        assert!(!m("src/*.rs", "src/x/a.rs"));
        assert!(m("*.{pem,key}", "certs/a.key"));
        assert!(m("id_rsa*", "home/.ssh/id_rsa.pub"));
        assert!(m("[!a]b", "cb"));
        assert!(!m("[!a]b", "ab"));
        assert!(m("**/x", "x"));
        assert!(m("**/x", "a/b/x"));
    }
}
