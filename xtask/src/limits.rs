//! The size limits the loader's sources keep, so that no file grows back
//! into a hub: at most [`MAX_FILE_LINES`] lines before a file's
//! `#[cfg(test)]` module, at most [`MAX_FN_LINES`] lines per function.
//! Part of `cargo xtask lint`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Lines of a source file before its `#[cfg(test)]` module.
pub const MAX_FILE_LINES: usize = 600;
/// Lines of a function, from its `fn` line to its closing brace.
pub const MAX_FN_LINES: usize = 80;

/// Checks every `.rs` file under `dir`; fails with the list of files and
/// functions over their limit.
pub fn check(dir: &Path) -> Result<()> {
    let mut files = Vec::new();
    collect(dir, &mut files)?;
    let mut over = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        over.extend(
            violations(&text)
                .into_iter()
                .map(|v| format!("{}: {v}", path.display())),
        );
    }
    if !over.is_empty() {
        bail!(
            "over the size limits ({MAX_FILE_LINES} lines a file before its tests, \
             {MAX_FN_LINES} a function):\n  {}",
            over.join("\n  ")
        );
    }
    Ok(())
}

pub fn collect(dir: &Path, files: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, files)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    Ok(())
}

/// What in `text` is over a limit.
fn violations(text: &str) -> Vec<String> {
    let code: Vec<&str> = text
        .lines()
        .take_while(|l| l.trim() != "#[cfg(test)]")
        .collect();
    let mut over = Vec::new();
    if code.len() > MAX_FILE_LINES {
        over.push(format!("{} lines before its tests", code.len()));
    }
    for (name, lines) in functions(&code) {
        if lines > MAX_FN_LINES {
            over.push(format!("fn {name} is {lines} lines"));
        }
    }
    over
}

/// The functions with a body in `lines`, and their length in lines.
fn functions(lines: &[&str]) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else { continue };
        let mut depth = 0i64;
        let mut opened = false;
        for (i, l) in lines.iter().enumerate().skip(start) {
            for delta in braces(l) {
                depth += delta;
                opened = true;
            }
            if opened && depth == 0 {
                found.push((name.to_string(), i - start + 1));
                break;
            }
            if !opened && l.trim_end().ends_with(';') {
                break; // a declaration without a body
            }
        }
    }
    found
}

/// The name of the function a line starts, if it starts one.
fn fn_name(line: &str) -> Option<&str> {
    let mut words = line.split_whitespace().peekable();
    while let Some(w) = words.next() {
        match w {
            "fn" => {
                let rest = words.next()?;
                let end = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                return Some(&rest[..end]).filter(|n| !n.is_empty());
            }
            "pub" | "async" | "unsafe" | "const" | "extern" | "\"C\"" => {}
            w if w.starts_with("pub(") => {}
            _ => return None,
        }
    }
    None
}

/// +1 and -1 for each brace of a line outside strings, characters and
/// comments.
fn braces(line: &str) -> Vec<i64> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '/' if chars.peek() == Some(&'/') => break,
            '\'' => {
                // A character literal ('{', '\n'), or a lifetime ('a).
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with('\\') {
                    chars.nth(2);
                } else if rest.chars().nth(1) == Some('\'') {
                    chars.nth(1);
                }
            }
            '{' => out.push(1),
            '}' => out.push(-1),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_are_measured_from_fn_to_closing_brace() {
        let src = "fn short() {\n    let s = \"}\";\n    let c = '{';\n}\n\
                   pub(crate) async fn longer<'a>(x: &'a str) -> u8 {\n    if true {\n        1\n    } else {\n        2\n    }\n}\n\
                   trait T {\n    fn declared(&self);\n    fn body(&self) { }\n}\n";
        let lines: Vec<&str> = src.lines().collect();
        assert_eq!(
            functions(&lines),
            [
                ("short".to_string(), 4),
                ("longer".to_string(), 7),
                ("body".to_string(), 1)
            ]
        );
    }

    #[test]
    fn limits_count_only_code_before_the_tests() {
        let long_fn = format!("fn f() {{\n{}}}\n", "    x();\n".repeat(MAX_FN_LINES));
        assert_eq!(violations(&long_fn), ["fn f is 82 lines"]);
        let long_tests = format!(
            "fn f() {{}}\n#[cfg(test)]\nmod tests {{\n{}}}\n",
            "// test\n".repeat(MAX_FILE_LINES * 2)
        );
        assert!(violations(&long_tests).is_empty());
        let long_file = "const X: u8 = 0;\n".repeat(MAX_FILE_LINES + 1);
        assert_eq!(violations(&long_file), ["601 lines before its tests"]);
    }

    #[test]
    fn the_loader_keeps_its_limits() {
        check(&crate::root().join("memprof/src")).unwrap();
    }
}
