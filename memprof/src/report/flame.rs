//! Flame graphs: a profile's samples as folded stacks (`root;…;leaf N`),
//! drawn by `inferno` (the Rust port of Brendan Gregg's flamegraph.pl) as
//! an interactive SVG.

use std::collections::BTreeMap;

use super::profiles::{ProfileKind, StackProfile};

/// The folded stacks of `profile` weighted by the sample type `value`
/// (samples with a zero weight left out), in a stable order.
pub fn folded(profile: &StackProfile, value: &str) -> Vec<String> {
    let Some(index) = profile.sample_types.iter().position(|(t, _)| *t == value) else {
        return Vec::new();
    };
    let mut stacks: BTreeMap<String, i64> = BTreeMap::new();
    for s in &profile.samples {
        let weight = s.values.get(index).copied().unwrap_or(0);
        if weight <= 0 {
            continue;
        }
        let names: Vec<String> = s
            .frames
            .iter()
            .rev()
            .map(|f| f.function.replace([';', '\n'], ":"))
            .collect();
        *stacks.entry(names.join(";")).or_default() += weight;
    }
    stacks
        .into_iter()
        .map(|(stack, n)| format!("{stack} {n}"))
        .collect()
}

/// The SVG flame graph of `profile`'s `value`, or a one-line SVG saying
/// that there was nothing to draw.
pub fn svg(profile: Option<&StackProfile>, kind: ProfileKind, value: &str) -> String {
    let lines = profile.map(|p| folded(p, value)).unwrap_or_default();
    let (title, count) = match kind {
        ProfileKind::Cpu => ("CPU samples", "samples"),
        ProfileKind::Alloc => ("Allocated bytes (sampled, scaled)", "bytes"),
        ProfileKind::Lock => ("Lock wait delay", "ns"),
        ProfileKind::Sharing => ("Shared cache line accesses", "accesses"),
    };
    if lines.is_empty() {
        return empty_svg(&format!("{title}: no samples"));
    }
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = format!("memprof-ebpf: {title}");
    opts.count_name = count.into();
    let mut out = Vec::new();
    match inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut out) {
        Ok(()) => String::from_utf8_lossy(&out).into_owned(),
        Err(e) => empty_svg(&format!("{title}: cannot draw ({e})")),
    }
}

fn empty_svg(text: &str) -> String {
    let text = text
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    format!(
        "<?xml version=\"1.0\" standalone=\"no\"?>\n\
         <svg version=\"1.1\" width=\"600\" height=\"40\" xmlns=\"http://www.w3.org/2000/svg\">\
         <text x=\"10\" y=\"25\">{text}</text></svg>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::profiles::{StackFrame, StackSample};

    fn profile() -> StackProfile {
        let s = |frames: &[&str], values: Vec<i64>| StackSample {
            frames: frames.iter().map(|f| StackFrame::named(f)).collect(),
            values,
            labels: Vec::new(),
        };
        StackProfile {
            kind: ProfileKind::Cpu,
            sample_types: vec![("samples", "count"), ("cpu", "nanoseconds")],
            default_type: "cpu",
            period: None,
            samples: vec![
                s(&["leaf", "mid", "main"], vec![3, 30]),
                s(&["other;odd", "main"], vec![2, 20]),
                s(&["leaf", "mid", "main"], vec![1, 10]),
                s(&["never"], vec![0, 0]),
            ],
            duration_ns: 1,
            comments: Vec::new(),
        }
    }

    #[test]
    fn stacks_fold_root_first_and_merge() {
        assert_eq!(
            folded(&profile(), "samples"),
            vec![
                "main;mid;leaf 4".to_string(),
                "main;other:odd 2".to_string()
            ]
        );
        assert_eq!(folded(&profile(), "cpu")[0], "main;mid;leaf 40");
        assert!(folded(&profile(), "nothing").is_empty());
    }

    #[test]
    fn an_svg_is_drawn_with_every_function() {
        let svg = svg(Some(&profile()), ProfileKind::Cpu, "samples");
        assert!(svg.starts_with("<?xml"), "{}", &svg[..100.min(svg.len())]);
        for f in ["main", "mid", "leaf", "other:odd"] {
            assert!(svg.contains(f), "{f} missing");
        }
        let none = super::svg(None, ProfileKind::Lock, "delay");
        assert!(none.contains("no samples"), "{none}");
    }
}
