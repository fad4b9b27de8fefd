//! Each analysis is a slice: no directory of `memprof/src/features/`
//! names another. What they share (the heap, code bytes, names) is a
//! service of the session outside `features/`. Part of `cargo xtask lint`.

use std::path::Path;

use anyhow::{bail, Context, Result};

/// Checks every feature directory under `features`; fails with each path
/// from one into another.
pub fn check(features: &Path) -> Result<()> {
    let mut dirs = Vec::new();
    for entry in
        std::fs::read_dir(features).with_context(|| format!("listing {}", features.display()))?
    {
        let path = entry?.path();
        if path.is_dir() {
            dirs.push(
                path.file_name()
                    .context("a directory name")?
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    dirs.sort();
    let mut found = Vec::new();
    for dir in &dirs {
        let mut files = Vec::new();
        crate::limits::collect(&features.join(dir), &mut files)?;
        for path in files {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let rel = path.strip_prefix(features).unwrap_or(&path);
            let depth = module_depth(rel);
            for other in named_features(&text, depth, &dirs) {
                if other != *dir {
                    found.push(format!("{} names features::{other}", path.display()));
                }
            }
        }
    }
    if !found.is_empty() {
        bail!(
            "a feature directory uses another (share through a session service, \
             e.g. memprof/src/heap, instead):\n  {}",
            found.join("\n  ")
        );
    }
    Ok(())
}

/// How many `super::` lead from the file at `rel` (relative to
/// `features/`) to `features`: 1 for `x/mod.rs`, 2 for `x/y.rs`.
fn module_depth(rel: &Path) -> usize {
    let parts = rel.components().count();
    if rel.file_name().is_some_and(|n| n == "mod.rs") {
        parts - 1
    } else {
        parts
    }
}

/// The first path segments after `features::`, or after `depth`
/// `super::` (which is `features` from this file), in `text`'s code
/// (its tests too: a fixture borrowed from another slice ties them).
fn named_features(text: &str, depth: usize, known: &[String]) -> Vec<String> {
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let relative = "super::".repeat(depth);
    let mut names = Vec::new();
    // `features::` however reached (`crate::features::`, or inside
    // `crate::{features::{..}}`), or the `super::` chain to it.
    for prefix in ["features::", relative.as_str()] {
        let mut from = 0;
        while let Some(at) = code[from..].find(prefix) {
            let start = from + at;
            from = start + prefix.len();
            let before = code[..start].chars().next_back();
            // Not `cpu_features::`; and `super::super::x` from a deeper
            // file is not `features::x`.
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                || code[..start].ends_with("super::")
            {
                continue;
            }
            names.extend(first_segments(&code[from..]));
        }
    }
    names.retain(|n| known.contains(n));
    names
}

/// `x` of `x::...`, or each item's first segment of `{x::a, y, z::b}`.
fn first_segments(rest: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let Some(group) = rest.strip_prefix('{') else {
        return vec![ident(rest)];
    };
    let mut depth = 0;
    let mut items = vec![String::new()];
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => items.push(String::new()),
            _ => {}
        }
        if depth == 0 && c != ',' && c != '}' {
            items.last_mut().expect("one item").push(c);
        }
    }
    items.iter().map(|i| ident(i)).collect()
}

#[cfg(test)]
mod tests {
    use super::{module_depth, named_features};
    use std::path::Path;

    fn known() -> Vec<String> {
        ["alloc", "cache", "locks"].map(String::from).to_vec()
    }

    #[test]
    fn paths_into_features_are_found_however_written() {
        let text = "use super::{alloc::analysis::AllocProfile, FastMap, cache};\n\
                    let x = crate::features::locks::holds::Section {};\n";
        assert_eq!(
            named_features(text, 1, &known()),
            ["locks", "alloc", "cache"]
        );
        // From x/y.rs, `super::alloc` is x's own submodule.
        let own = "use super::alloc::Thing;\nuse super::super::{FastMap, Feature};\n";
        assert!(named_features(own, 2, &known()).is_empty());
        assert_eq!(
            named_features("use super::super::cache::Thing;", 2, &known()),
            ["cache"]
        );
    }

    #[test]
    fn comments_do_not_count_and_tests_do() {
        let text = "/// see [`super::alloc::x`]\nfn f() {}\n";
        assert!(named_features(text, 1, &known()).is_empty());
        let test = "fn f() {}\n#[cfg(test)]\nmod tests { use crate::features::alloc::x; }\n";
        assert_eq!(named_features(test, 1, &known()), ["alloc"]);
    }

    /// The tree itself keeps the rule (also checked by `cargo xtask lint`).
    #[test]
    fn no_feature_directory_uses_another() {
        super::check(&crate::root().join("memprof/src/features")).expect("the slices");
    }

    #[test]
    fn depth_counts_the_steps_to_features() {
        assert_eq!(module_depth(Path::new("locks/mod.rs")), 1);
        assert_eq!(module_depth(Path::new("locks/report.rs")), 2);
        assert_eq!(module_depth(Path::new("locks/ulcp/mod.rs")), 2);
        assert_eq!(module_depth(Path::new("locks/ulcp/report.rs")), 3);
    }
}
