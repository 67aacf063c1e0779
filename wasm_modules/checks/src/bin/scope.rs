//! `scope`: parse a unified diff (git or plain), list the touched paths and decide whether the
//! patch is reviewable or blocked against allowed prefixes and denied globs.
//!
//! Request: {"allow": ["src/"], "deny": ["docs/**"], "allow_lockfiles": false,
//!           "default_deny": true}. Data: the diff on stdin. A malformed diff exits 2.

use hybrid_checks::{clip, fail, request, Glob};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    #[serde(default)]
    allow_lockfiles: bool,
    #[serde(default = "default_true")]
    default_deny: bool,
}

fn default_true() -> bool {
    true
}

const ENV_FILES: &[&str] = &[".env*", "*.env"];
const CI_FILES: &[&str] = &[
    ".github/workflows/**",
    ".github/actions/**",
    ".gitlab-ci.yml",
    ".gitlab-ci/**",
    ".circleci/**",
    ".travis.yml",
    "azure-pipelines.yml",
    ".azure-pipelines/**",
    "Jenkinsfile",
    ".buildkite/**",
    "bitbucket-pipelines.yml",
    ".drone.yml",
    ".woodpecker.yml",
    ".woodpecker/**",
    "appveyor.yml",
    ".appveyor.yml",
    "cloudbuild.yaml",
    ".ci/**",
];
const CREDENTIAL_FILES: &[&str] = &[
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
    "*.kdbx",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    ".npmrc",
    ".pypirc",
    ".netrc",
    ".git-credentials",
    ".htpasswd",
    ".dockercfg",
    "credentials*",
    "**/.aws/**",
    "**/.ssh/**",
    "**/.docker/config.json",
    "*.tfvars",
];
const LOCKFILES: &[&str] = &[
    "package-lock.json",
    "npm-shrinkwrap.json",
    "yarn.lock",
    "pnpm-lock.yaml",
    "bun.lockb",
    "poetry.lock",
    "Pipfile.lock",
    "pdm.lock",
    "uv.lock",
    "Cargo.lock",
    "go.sum",
    "Gemfile.lock",
    "composer.lock",
    "mix.lock",
    "flake.lock",
    "packages.lock.json",
    "pubspec.lock",
    "Podfile.lock",
    "gradle.lockfile",
];
const GIT_INTERNALS: &[&str] = &["**/.git/**"];

#[derive(Default)]
struct FileChange {
    /// 1-based line of the section's first line, for error messages.
    line: usize,
    git: bool,
    old: Option<String>,
    new: Option<String>,
    added: bool,
    deleted: bool,
    renamed: bool,
    copied: bool,
    binary: bool,
    additions: u64,
    deletions: u64,
    old_mode: Option<String>,
    new_mode: Option<String>,
    similarity: Option<String>,
    rename_from: Option<String>,
    rename_to: Option<String>,
    /// The `---`/`+++` pair was seen; extended headers end there.
    headers_done: bool,
    /// Some extended header (mode, index, rename, binary) was seen.
    saw_header: bool,
}

fn malformed(line: usize, message: &str) -> ! {
    fail("diff", &format!("malformed diff at line {}: {}", line, message))
}

/// Undo git's C-style quoting of a path with unusual characters.
fn unquote(s: &str) -> String {
    if s.len() < 2 || !s.ends_with('"') {
        return s.trim_start_matches('"').to_string();
    }
    let inner = &s[1..s.len() - 1];
    let bytes = inner.as_bytes();
    let mut out: Vec<u8> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 1 < bytes.len() {
            let c = bytes[i + 1];
            match c {
                b'n' => out.push(b'\n'),
                b't' => out.push(b'\t'),
                b'"' => out.push(b'"'),
                b'\\' => out.push(b'\\'),
                b'0'..=b'3'
                    if i + 4 <= bytes.len()
                        && bytes[i + 2..i + 4].iter().all(|d| (b'0'..=b'7').contains(d)) =>
                {
                    let v = (c - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
                    out.push(v);
                    i += 4;
                    continue;
                }
                _ => out.push(c),
            }
            i += 2;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A path from a `---`/`+++`, `rename from` or similar line: unquoted, timestamp dropped.
fn header_path(raw: &str) -> String {
    let raw = raw.trim_end_matches('\r');
    if raw.starts_with('"') {
        if let Some(end) = closing_quote(raw) {
            return unquote(&raw[..=end]);
        }
    }
    raw.split('\t').next().unwrap_or(raw).trim_end().to_string()
}

fn closing_quote(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut i = 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// The two paths of `diff --git a/X b/Y` (before any `---`/`+++` refines them).
fn git_paths(rest: &str, line: usize) -> (String, String) {
    let rest = rest.trim_end_matches('\r');
    if rest.starts_with('"') {
        let end =
            closing_quote(rest).unwrap_or_else(|| malformed(line, "unterminated quoted path"));
        let a = unquote(&rest[..=end]);
        let b = rest[end + 1..].trim_start();
        let b = if b.starts_with('"') {
            match closing_quote(b) {
                Some(end) => unquote(&b[..=end]),
                None => malformed(line, "unterminated quoted path"),
            }
        } else {
            b.to_string()
        };
        return (a, b);
    }
    // Unquoted names may contain spaces: prefer the split where both sides name the same file.
    let candidates: Vec<usize> = rest.match_indices(' ').map(|(i, _)| i).collect();
    if candidates.is_empty() {
        malformed(line, "'diff --git' needs two paths");
    }
    let strip = |p: &str| -> String {
        p.strip_prefix("a/").or_else(|| p.strip_prefix("b/")).unwrap_or(p).to_string()
    };
    for &i in &candidates {
        let (a, b) = (&rest[..i], &rest[i + 1..]);
        if strip(a) == strip(b) {
            return (a.to_string(), b.to_string());
        }
    }
    let i = candidates[candidates.len() / 2];
    (rest[..i].to_string(), rest[i + 1..].to_string())
}

fn strip_git_prefix(path: &str, prefix: &str) -> String {
    path.strip_prefix(prefix).unwrap_or(path).to_string()
}

fn parse_range(text: &str, line: usize) -> (u64, u64) {
    let (start, count) = match text.split_once(',') {
        Some((s, c)) => (s, c),
        None => (text, "1"),
    };
    match (start.parse::<u64>(), count.parse::<u64>()) {
        (Ok(s), Ok(c)) => (s, c),
        _ => malformed(line, &format!("bad hunk range {:?}", text)),
    }
}

fn parse_hunk_header(l: &str, line: usize) -> (u64, u64) {
    // @@ -a[,b] +c[,d] @@ optional section heading
    let body = l.strip_prefix("@@ ").unwrap_or("");
    let end =
        body.find(" @@").unwrap_or_else(|| malformed(line, "hunk header without closing '@@'"));
    let mut parts = body[..end].split(' ');
    let old = parts.next().and_then(|p| p.strip_prefix('-'));
    let new = parts.next().and_then(|p| p.strip_prefix('+'));
    match (old, new, parts.next()) {
        (Some(o), Some(n), None) => (parse_range(o, line).1, parse_range(n, line).1),
        _ => malformed(line, &format!("bad hunk header {:?}", clip(l, 80))),
    }
}

struct Parser<'a> {
    lines: Vec<&'a str>,
    files: Vec<FileChange>,
    current: Option<FileChange>,
}

impl<'a> Parser<'a> {
    fn finish(&mut self) {
        if let Some(mut f) = self.current.take() {
            if f.rename_from.is_some() != f.rename_to.is_some() {
                malformed(f.line, "'rename from' and 'rename to' must come together");
            }
            if let Some(from) = f.rename_from.take() {
                f.old = Some(from);
            }
            if let Some(to) = f.rename_to.take() {
                f.new = Some(to);
            }
            if f.git && !f.headers_done && !f.saw_header {
                malformed(f.line, "'diff --git' section without any header or change");
            }
            if f.old.is_none() && f.new.is_none() {
                malformed(f.line, "file section names no path");
            }
            self.files.push(f);
        }
    }

    /// Skip the literal/delta blocks of a `GIT binary patch` starting at line index `i`.
    fn binary_patch(&self, mut i: usize) -> usize {
        let start = i;
        let mut blocks = 0;
        while i < self.lines.len() {
            let l = self.lines[i].trim_end_matches('\r');
            if !(l.starts_with("literal ") || l.starts_with("delta ")) {
                break;
            }
            if l.split(' ').nth(1).map(|n| n.parse::<u64>().is_err()).unwrap_or(true) {
                malformed(i + 1, "bad size in GIT binary patch");
            }
            blocks += 1;
            i += 1;
            while i < self.lines.len() && !self.lines[i].trim_end_matches('\r').is_empty() {
                let first = self.lines[i].as_bytes()[0];
                if !first.is_ascii_alphabetic() {
                    malformed(i + 1, "bad data line in GIT binary patch");
                }
                i += 1;
            }
            if i < self.lines.len() {
                i += 1; // the blank line after a block
            }
        }
        if blocks == 0 {
            malformed(start, "'GIT binary patch' without a literal or delta block");
        }
        i
    }

    fn run(&mut self) {
        let n = self.lines.len();
        let mut i = 0;
        while i < n {
            let l = self.lines[i].trim_end_matches('\r');
            let lineno = i + 1;
            if let Some(rest) = l.strip_prefix("diff --git ") {
                self.finish();
                let (a, b) = git_paths(rest, lineno);
                self.current = Some(FileChange {
                    line: lineno,
                    git: true,
                    old: Some(strip_git_prefix(&a, "a/")),
                    new: Some(strip_git_prefix(&b, "b/")),
                    ..FileChange::default()
                });
                i += 1;
                continue;
            }
            if l.starts_with("--- ") && i + 1 < n && self.lines[i + 1].starts_with("+++ ") {
                let old = header_path(&l[4..]);
                let new = header_path(&self.lines[i + 1][4..]);
                let continues_git = matches!(&self.current, Some(f) if f.git && !f.headers_done);
                if !continues_git {
                    self.finish();
                    // `diff -N` names a missing side with the epoch as its timestamp.
                    // Both names still decide which leading directory to strip.
                    let (mut old, mut new) = plain_paths(&old, &new, lineno);
                    if is_epoch(l) && new.is_some() {
                        old = None;
                    } else if is_epoch(self.lines[i + 1]) && old.is_some() {
                        new = None;
                    }
                    self.current = Some(FileChange { line: lineno, ..FileChange::default() });
                    let f = self.current.as_mut().expect("current");
                    f.old = old;
                    f.new = new;
                } else {
                    let f = self.current.as_mut().expect("current");
                    if old == "/dev/null" {
                        f.added = true;
                    } else {
                        f.old = Some(strip_git_prefix(&old, "a/"));
                    }
                    if new == "/dev/null" {
                        f.deleted = true;
                    } else {
                        f.new = Some(strip_git_prefix(&new, "b/"));
                    }
                }
                let f = self.current.as_mut().expect("current");
                f.headers_done = true;
                if f.old.is_none() {
                    f.added = true;
                }
                if f.new.is_none() {
                    f.deleted = true;
                }
                i += 2;
                continue;
            }
            if l.starts_with("@@ ") || l == "@@" {
                let header_ok = matches!(&self.current, Some(f) if f.headers_done);
                if !header_ok {
                    malformed(lineno, "hunk without a '---'/'+++' file header");
                }
                let (mut old_left, mut new_left) = parse_hunk_header(l, lineno);
                i += 1;
                let f = self.current.as_mut().expect("current");
                while old_left > 0 || new_left > 0 {
                    if i >= n {
                        malformed(
                            lineno,
                            &format!(
                                "hunk ends early: {} old and {} new lines missing",
                                old_left, new_left
                            ),
                        );
                    }
                    let body = self.lines[i].trim_end_matches('\r');
                    let kind = body.chars().next().unwrap_or(' ');
                    match kind {
                        ' ' => {
                            if old_left == 0 || new_left == 0 {
                                malformed(i + 1, "more context lines than the hunk header says");
                            }
                            old_left -= 1;
                            new_left -= 1;
                        }
                        '-' => {
                            if old_left == 0 {
                                malformed(i + 1, "more removed lines than the hunk header says");
                            }
                            old_left -= 1;
                            f.deletions += 1;
                        }
                        '+' => {
                            if new_left == 0 {
                                malformed(i + 1, "more added lines than the hunk header says");
                            }
                            new_left -= 1;
                            f.additions += 1;
                        }
                        '\\' => {}
                        _ => malformed(
                            i + 1,
                            &format!("unexpected line in hunk: {:?}", clip(body, 60)),
                        ),
                    }
                    i += 1;
                }
                while i < n && self.lines[i].starts_with('\\') {
                    i += 1;
                }
                continue;
            }
            if l == "-- " {
                // A format-patch signature ends one patch; a series may follow with its own
                // message, whose lines must not be read as stray changes of the last file.
                self.finish();
                i += 1;
                continue;
            }
            let in_git_header = matches!(&self.current, Some(f) if f.git && !f.headers_done);
            if in_git_header {
                let f = self.current.as_mut().expect("current");
                let had_header = f.saw_header;
                f.saw_header = true;
                if let Some(m) = l.strip_prefix("new file mode ") {
                    f.added = true;
                    f.new_mode = Some(m.to_string());
                } else if let Some(m) = l.strip_prefix("deleted file mode ") {
                    f.deleted = true;
                    f.old_mode = Some(m.to_string());
                } else if let Some(m) = l.strip_prefix("old mode ") {
                    f.old_mode = Some(m.to_string());
                } else if let Some(m) = l.strip_prefix("new mode ") {
                    f.new_mode = Some(m.to_string());
                } else if let Some(s) = l.strip_prefix("similarity index ") {
                    f.similarity = Some(s.to_string());
                } else if let Some(s) = l.strip_prefix("dissimilarity index ") {
                    f.similarity = Some(s.to_string());
                } else if let Some(p) = l.strip_prefix("rename from ") {
                    f.renamed = true;
                    f.rename_from = Some(header_path(p));
                } else if let Some(p) = l.strip_prefix("rename to ") {
                    f.renamed = true;
                    f.rename_to = Some(header_path(p));
                } else if let Some(p) = l.strip_prefix("copy from ") {
                    f.copied = true;
                    f.rename_from = Some(header_path(p));
                } else if let Some(p) = l.strip_prefix("copy to ") {
                    f.copied = true;
                    f.rename_to = Some(header_path(p));
                } else if l.starts_with("index ") {
                } else if l.starts_with("Binary files ") && l.ends_with(" differ") {
                    f.binary = true;
                    if l.starts_with("Binary files /dev/null ") {
                        f.added = true;
                    } else if l.ends_with(" and /dev/null differ") {
                        f.deleted = true;
                    }
                } else if l == "GIT binary patch" {
                    f.binary = true;
                    i = self.binary_patch(i + 1);
                    continue;
                } else if l.starts_with("--- ") {
                    malformed(lineno, "'---' line without a following '+++' line");
                } else if had_header {
                    // A section without ---/+++ (rename, mode change, binary) ends at the first
                    // line that is not a header: `git log -p` puts the next commit there.
                    self.finish();
                } else {
                    malformed(
                        lineno,
                        &format!("unexpected line in git file header: {:?}", clip(l, 60)),
                    );
                }
                i += 1;
                continue;
            }
            let after_hunks = matches!(&self.current, Some(f) if f.headers_done);
            if after_hunks && (l.starts_with('+') || l.starts_with('-')) {
                malformed(lineno, "changed line outside any hunk (hunk counts do not match)");
            }
            if l.starts_with("--- ") {
                malformed(lineno, "'---' line without a following '+++' line");
            }
            // Anything else (a commit message, `diff -ruN` or `Only in` lines) is commentary.
            i += 1;
        }
        self.finish();
    }
}

fn is_epoch(header: &str) -> bool {
    match header.split_once('\t') {
        Some((_, stamp)) => stamp.starts_with("1970-01-01 00:00:00") || stamp.ends_with(" 1970"),
        None => false,
    }
}

/// Old and new paths of a plain `---`/`+++` pair, with a shared leading directory removed the
/// way `patch -p1` would (`a/x` `b/x`, or `proj.orig/x` `proj/x`).
fn plain_paths(old: &str, new: &str, line: usize) -> (Option<String>, Option<String>) {
    let old = if old == "/dev/null" { None } else { Some(old.to_string()) };
    let new = if new == "/dev/null" { None } else { Some(new.to_string()) };
    let first = |p: &str| p.split_once('/').map(|(a, rest)| (a.to_string(), rest.to_string()));
    match (&old, &new) {
        (Some(o), Some(n)) => match (first(o), first(n)) {
            (Some((oa, orest)), Some((na, nrest))) if oa != na => (Some(orest), Some(nrest)),
            _ => (old, new),
        },
        (Some(o), None) => (Some(strip_git_prefix(o, "a/")), None),
        (None, Some(n)) => (None, Some(strip_git_prefix(n, "b/"))),
        (None, None) => malformed(line, "both sides are /dev/null"),
    }
}

struct Rules {
    groups: Vec<(&'static str, Vec<Glob>)>,
    allow: Vec<String>,
}

impl Rules {
    fn new(req: &Request) -> Rules {
        let compile = |pats: &[&str]| -> Vec<Glob> {
            pats.iter().map(|p| Glob::new(p).expect("built-in glob")).collect()
        };
        let mut groups = Vec::new();
        if req.default_deny {
            groups.push(("env-file", compile(ENV_FILES)));
            groups.push(("ci-config", compile(CI_FILES)));
            groups.push(("credential-file", compile(CREDENTIAL_FILES)));
            if !req.allow_lockfiles {
                groups.push(("lockfile", compile(LOCKFILES)));
            }
        }
        groups.push(("git-internals", compile(GIT_INTERNALS)));
        let mut user = Vec::new();
        for p in &req.deny {
            match Glob::new(p) {
                Ok(g) => user.push(g),
                Err(err) => fail("request", &format!("bad deny glob: {}", err)),
            }
        }
        groups.push(("denied-glob", user));
        let allow = req
            .allow
            .iter()
            .map(|p| p.trim_start_matches("./").trim_end_matches('/').to_string())
            .collect();
        Rules { groups, allow }
    }

    fn check(&self, path: &str, violations: &mut Vec<Value>) {
        let parts: Vec<&str> = path.split('/').collect();
        if path.starts_with('/') || parts.iter().any(|p| *p == "..") {
            violations.push(json!({
                "path": path, "rule": "path-escape", "pattern": Value::Null,
                "message": format!("{} leaves the repository (absolute or '..')", path),
            }));
            return;
        }
        for (rule, globs) in &self.groups {
            if let Some(g) = globs.iter().find(|g| g.matches(path)) {
                violations.push(json!({
                    "path": path, "rule": rule, "pattern": g.source,
                    "message": format!("{} is denied by {} rule {:?}", path, rule, g.source),
                }));
                return;
            }
        }
        if !self.allow.is_empty() {
            let inside = self.allow.iter().any(|p| {
                p.is_empty() || p == "." || path == p || path.starts_with(&format!("{}/", p))
            });
            if !inside {
                violations.push(json!({
                    "path": path, "rule": "outside-allowed-prefixes", "pattern": Value::Null,
                    "message": format!("{} is outside the allowed prefixes {}", path, self.allow.join(", ")),
                }));
            }
        }
    }
}

fn main() {
    let req: Request = request();
    let rules = Rules::new(&req);
    let data = hybrid_checks::read_stdin();
    let text = match std::str::from_utf8(&data) {
        Ok(t) => t.to_string(),
        Err(_) => String::from_utf8_lossy(&data).into_owned(),
    };
    if text.trim().is_empty() {
        fail("diff", "empty diff: nothing to review");
    }
    let mut parser = Parser { lines: text.split('\n').collect(), files: Vec::new(), current: None };
    if parser.lines.last() == Some(&"") {
        parser.lines.pop();
    }
    parser.run();
    if parser.files.is_empty() {
        fail("diff", "no file changes found (expected 'diff --git' or '---'/'+++' headers)");
    }

    let mut violations = Vec::new();
    let mut files = Vec::new();
    let (mut additions, mut deletions) = (0u64, 0u64);
    for f in &parser.files {
        let status = if f.added {
            "added"
        } else if f.deleted {
            "deleted"
        } else if f.renamed {
            "renamed"
        } else if f.copied {
            "copied"
        } else {
            "modified"
        };
        let path = if f.deleted { f.old.clone() } else { f.new.clone().or_else(|| f.old.clone()) };
        let path = path.unwrap_or_default();
        let old_path = if f.renamed || f.copied { f.old.clone() } else { None };
        rules.check(&path, &mut violations);
        if let Some(old) = &old_path {
            if f.renamed {
                rules.check(old, &mut violations);
            }
        }
        additions += f.additions;
        deletions += f.deletions;
        files.push(json!({
            "path": path,
            "old_path": old_path,
            "status": status,
            "binary": f.binary,
            "additions": f.additions,
            "deletions": f.deletions,
            "old_mode": f.old_mode,
            "new_mode": f.new_mode,
            "similarity": f.similarity,
        }));
    }
    let blocked = !violations.is_empty();
    hybrid_checks::emit(&json!({
        "ok": !blocked,
        "decision": if blocked { "blocked" } else { "reviewable" },
        "files": files,
        "violations": violations,
        "additions": additions,
        "deletions": deletions,
    }));
}
