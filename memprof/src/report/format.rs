//! Plain formatters shared by the summary and the dashboard: counts,
//! percentages, durations, byte sizes, and cutting to a width.

/// `1234567` → `1,234,567`.
pub fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A number that may be unknown (an estimate not good enough to show),
/// formatted with `f`, or `?`.
pub fn maybe(n: Option<u64>, f: impl Fn(u64) -> String) -> String {
    n.map_or_else(|| "?".to_string(), f)
}

/// A latency, or `<N ns` when below the `resolution` it was measured
/// with (the probes' calibrated spread: nothing smaller can be told from
/// zero).
pub fn format_latency(ns: u64, resolution_ns: Option<u64>) -> String {
    match resolution_ns {
        Some(r) if ns < r => format!("<{}", format_ns(r)),
        _ => format_ns(ns),
    }
}

/// A latency the report gives as None below `resolution_ns`.
pub fn format_measured(ns: Option<u64>, resolution_ns: Option<u64>) -> String {
    match (ns, resolution_ns) {
        (Some(ns), _) => format_latency(ns, resolution_ns),
        (None, Some(r)) => format!("<{}", format_ns(r)),
        (None, None) => "?".to_string(),
    }
}

/// A median that is either measured like [`format_measured`] or, when
/// `from_loop`, the allocator's untraced cost (`~N ns`: an estimate from
/// another measurement, shown below the probes' resolution).
pub fn format_median(ns: Option<u64>, from_loop: bool, resolution_ns: Option<u64>) -> String {
    match (ns, from_loop) {
        (Some(ns), true) => format!("~{}", format_ns(ns)),
        _ => format_measured(ns, resolution_ns),
    }
}

/// `part` as a percentage of `whole`; 0 when `whole` is 0.
pub fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// A share in [0, 1] as a percentage with `decimals` decimals, which says
/// 100% only when it is whole: 0.9996 is "99.9%" (one decimal), not
/// "100.0%".
pub fn share_percent(share: f64, decimals: usize) -> String {
    let share = if share.is_finite() {
        share.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let step = 10f64.powi(-(decimals as i32));
    let mut p = (share * 100.0 / step).round() * step;
    if share < 1.0 && p >= 100.0 {
        p = 100.0 - step;
    }
    format!("{p:.decimals$}%")
}

/// `3.25` → `3.2 s`, `125.0` → `2m05s`.
pub fn format_duration(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "?".into();
    }
    if secs < 60.0 {
        format!("{secs:.1} s")
    } else {
        let whole = secs.round() as u64;
        format!("{}m{:02}s", whole / 60, whole % 60)
    }
}

/// Nanoseconds with a unit, three significant digits: `850 ns`,
/// `1.23 µs`, `45.6 ms`, `2.00 s`.
pub fn format_ns(ns: u64) -> String {
    const UNITS: [(f64, &str); 3] = [(1e3, "µs"), (1e6, "ms"), (1e9, "s")];
    if ns < 1000 {
        return format!("{ns} ns");
    }
    let ns = ns as f64;
    let (scale, unit) = UNITS
        .iter()
        .rev()
        .find(|(scale, _)| ns >= *scale * 0.9995)
        .copied()
        .unwrap_or(UNITS[0]);
    let value = ns / scale;
    if value < 9.995 {
        format!("{value:.2} {unit}")
    } else if value < 99.95 {
        format!("{value:.1} {unit}")
    } else {
        format!("{value:.0} {unit}")
    }
}

/// Bytes with a binary unit.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Cuts `s` to at most `max` characters, ending with `…` when cut.
pub fn ellipsize(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_below_the_resolution_are_bounds() {
        assert_eq!(
            format_latency(45, Some(120)),
            format!("<{}", format_ns(120))
        );
        assert_eq!(format_latency(450, Some(120)), format_ns(450));
        assert_eq!(format_latency(0, None), format_ns(0));
        assert_eq!(maybe(None, group), "?");
        assert_eq!(maybe(Some(1234), group), "1,234");
    }

    #[test]
    fn a_share_is_whole_only_when_it_is() {
        assert_eq!(share_percent(1.0, 0), "100%");
        assert_eq!(share_percent(0.996, 0), "99%");
        assert_eq!(share_percent(0.9996, 1), "99.9%");
        assert_eq!(share_percent(0.6, 1), "60.0%");
        assert_eq!(share_percent(1.7, 0), "100%");
        assert_eq!(share_percent(f64::NAN, 0), "0%");
    }

    #[test]
    fn formatting_helpers() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(1234567), "1,234,567");
        assert_eq!(percent(1, 0), 0.0);
        assert_eq!(percent(1, 4), 25.0);
        assert_eq!(format_duration(3.25), "3.2 s");
        assert_eq!(format_duration(125.0), "2m05s");
        assert_eq!(format_duration(f64::NAN), "?");
        assert_eq!(format_ns(0), "0 ns");
        assert_eq!(format_ns(999), "999 ns");
        assert_eq!(format_ns(1000), "1.00 µs");
        assert_eq!(format_ns(1234), "1.23 µs");
        assert_eq!(format_ns(12_345), "12.3 µs");
        assert_eq!(format_ns(123_456), "123 µs");
        assert_eq!(format_ns(999_400), "999 µs");
        assert_eq!(format_ns(999_600), "1.00 ms");
        assert_eq!(format_ns(45_600_000), "45.6 ms");
        assert_eq!(format_ns(2_000_000_000), "2.00 s");
        assert_eq!(format_ns(u64::MAX), "18446744074 s");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(20 << 20), "20.0 MiB");
        assert_eq!(ellipsize("abcdef", 4), "abc…");
        assert_eq!(ellipsize("abc", 4), "abc");
    }
}
