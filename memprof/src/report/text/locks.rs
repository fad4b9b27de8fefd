//! The "Locks" section.

use std::fmt::Write as _;

use super::{wrap_into, WIDTH};
use crate::report::{
    format::{ellipsize, format_ns, group, share_percent},
    model::{source_label, ContentionClass, LockEntry, LockTracing, TraceMode},
};

/// Lock entries shown in the summary.
const TOP_LOCKS: usize = 6;
/// A lock whose waits are mostly needed also says the unnecessary rest
/// from this share on.
const ALSO_UNNECESSARY: f64 = 0.1;

/// The "Locks" section: the contended locks (then other waits), with the
/// code that waited and the code that released.
pub(super) fn write_locks(out: &mut String, locks: &[LockEntry], tracing: Option<&LockTracing>) {
    if locks.is_empty() {
        let _ = writeln!(out, "Locks: no thread waited for a lock");
        return;
    }
    let _ = writeln!(
        out,
        "Locks (waits seen from the kernel; lock contention first, then other waits)"
    );
    if let Some(line) = tracing.map(mode_line) {
        let _ = writeln!(out, "  {line}");
    }
    let _ = writeln!(
        out,
        "    {:<20} {:<9} {:>8} {:>9} {:>9} {:>9}",
        "lock", "kind", "waits", "total", "p99", "max"
    );
    for l in locks.iter().take(TOP_LOCKS) {
        let name = l.label();
        let _ = writeln!(
            out,
            "    {:<20} {:<9} {:>8} {:>9} {:>9} {:>9}",
            ellipsize(&name, 20),
            ellipsize(l.kind.name(), 9),
            group(l.contentions),
            format_ns(l.wait_total_ns),
            format_ns(l.wait_p99_ns),
            format_ns(l.wait_max_ns)
        );
        if name.chars().count() > 20 {
            // Cut short in the table: the whole name (a type and field
            // with its allocation site, a stripped file's address).
            let _ = writeln!(out, "{}", ellipsize(&format!("      {name}"), WIDTH));
        }
        if let Some(w) = l.waiters.first() {
            let at = source_label(w.file.as_deref(), w.line, &w.module);
            let line = format!("      waited in {} {at}", w.function);
            let _ = writeln!(out, "{line}");
        }
        if let Some(h) = l.holders.first() {
            let at = source_label(h.file.as_deref(), h.line, &h.module);
            let line = format!(
                "      released by {} {at} ({} wakes)",
                h.function,
                group(h.count)
            );
            let _ = writeln!(out, "{line}");
        }
        write_culprit(out, l);
        if l.owner_seen {
            let owners: Vec<String> = l.owners.iter().map(|o| o.tid.to_string()).collect();
            let line = format!("      held by thread(s) {}", owners.join(", "));
            let _ = writeln!(out, "{line}");
        }
        write_lock_holds(out, l);
        write_unnecessary(out, l);
    }
}

/// Whether the waits were needed: the class of the sections that
/// serialized, what it rests on, and the fix.
fn write_unnecessary(out: &mut String, l: &LockEntry) {
    let Some(u) = &l.unnecessary else {
        return;
    };
    let class = u.class.name();
    let pairs = group(u.pairs);
    let line = if u.class == ContentionClass::True {
        format!("      contention needed: the sections conflict ({pairs} hand-offs seen)")
    } else {
        let weak = if u.confidence_basis.starts_with("weak") {
            " (weak)"
        } else {
            ""
        };
        format!(
            "      unnecessary {class}: {} of waits ({}), confidence {:.2}{weak}",
            format_ns(u.wasted_wait_ns),
            share_percent(u.wasted_share, 0),
            u.confidence,
        )
    };
    let _ = writeln!(out, "{}", ellipsize(&line, WIDTH));
    if u.class != ContentionClass::True {
        wrap_into(out, "      fix: ", &u.advice);
    } else if u.wasted_share >= ALSO_UNNECESSARY {
        // Needed mostly, but not all: say what the rest is.
        let other = u.classes.iter().find(|c| c.class != ContentionClass::True);
        let line = format!(
            "      but {} of the waits unnecessary{} ({} in all)",
            share_percent(u.wasted_share, 0),
            other.map_or(String::new(), |c| format!(", mostly {}", c.class.name())),
            format_ns(u.wasted_wait_ns)
        );
        let _ = writeln!(out, "{}", ellipsize(&line, WIDTH));
    }
}

/// The critical section that caused the most waiting (the waits its
/// releases ended), when the wakes charged any.
fn write_culprit(out: &mut String, l: &LockEntry) {
    let Some(s) = l.sections.iter().find(|s| s.delay_caused_ns > 0) else {
        return;
    };
    let caused: u64 = l.sections.iter().map(|s| s.delay_caused_ns).sum();
    let share = s.delay_caused_ns as f64 / caused.max(1) as f64 * 100.0;
    let released = s.released_at.as_deref().unwrap_or("?");
    let section = if s.count > 0 {
        let at = source_label(s.file.as_deref(), s.line, &s.module);
        format!("{} {at} → {released}", s.function)
    } else {
        format!("the sections released in {} {released}", s.function)
    };
    let line = format!(
        "      delay caused: {} ({share:.0}%) by {section}",
        format_ns(s.delay_caused_ns)
    );
    let _ = writeln!(out, "{}", ellipsize(&line, WIDTH));
}

/// What was traced of the lock calls: "every call" only when the probes
/// were attached all the time.
fn mode_line(t: &LockTracing) -> String {
    if t.mode == TraceMode::Sampled && t.windows == 0 {
        "lock calls not traced: no thread waited on a futex".into()
    } else if t.estimates() {
        let traced = format!(
            "lock calls traced {:.1}% of the time",
            t.traced_fraction * 100.0
        );
        match t.acquisitions_error {
            Some(e) if t.too_rough() => format!(
                "{traced}: acquisitions unknown (±{:.0}%, too rough)",
                e * 100.0
            ),
            Some(e) => format!("{traced}: acquisitions are estimates (±{:.0}%)", e * 100.0),
            None => format!("{traced}: acquisitions are estimates"),
        }
    } else if t.traced_fraction >= 1.0 {
        "lock calls: every call traced".into()
    } else {
        format!(
            "lock calls traced {} of the time",
            share_percent(t.traced_fraction, 2)
        )
    }
}

/// What the lock uprobes add: acquisitions, contention rate, hold times
/// and the critical section holding it longest.
fn write_lock_holds(out: &mut String, l: &LockEntry) {
    let Some(acquisitions) = l.acquisitions else {
        return;
    };
    let mut line = format!("      {} acquisitions", group(acquisitions));
    if let Some(rate) = l.contention_rate {
        let _ = write!(line, ", {} contended", share_percent(rate, 0));
    }
    if let (Some(mean), Some(p99), Some(max)) = (l.hold_mean_ns, l.hold_p99_ns, l.hold_max_ns) {
        let _ = write!(
            line,
            "; held mean {} p99 {} max {}",
            format_ns(mean),
            format_ns(p99),
            format_ns(max)
        );
    }
    let _ = writeln!(out, "{}", ellipsize(&line, WIDTH));
    if let Some(s) = l.sections.first() {
        let at = source_label(s.file.as_deref(), s.line, &s.module);
        let released = s
            .released_at
            .as_deref()
            .map(|r| format!(" → {r}"))
            .unwrap_or_default();
        let line = format!(
            "      held in {} {at}{released} ({}, {} total)",
            s.function,
            group(s.count),
            format_ns(s.hold_ns)
        );
        let _ = writeln!(out, "{}", ellipsize(&line, WIDTH));
    }
}

#[cfg(test)]
mod tests {
    use crate::report::{
        fixtures::{report_with_locks, sample_report, trace_hot_lock},
        model::{ContentionClass, LockTracing, TraceMode},
        text::{render, WIDTH},
    };

    #[test]
    fn unnecessary_contention_shows_its_class_waste_confidence_and_fix() {
        let mut r = report_with_locks();
        trace_hot_lock(&mut r);
        let text = render(&r);
        assert!(
            text.contains("unnecessary disjoint-write: 1.63 s of waits (90%), confidence 0.97\n"),
            "{text}"
        );
        assert!(text.contains("      fix: the sections write different shared words"));
        let u = r.locks[0].unnecessary.as_mut().unwrap();
        u.confidence = 0.2;
        u.confidence_basis = "weak: 4 sampled accesses".into();
        assert!(render(&r).contains("confidence 0.20 (weak)\n"));
        let u = r.locks[0].unnecessary.as_mut().unwrap();
        u.class = ContentionClass::True;
        let text = render(&r);
        assert!(text.contains("contention needed: the sections conflict (41,200 hand-offs"));
        assert!(!text.contains("fix: the sections write"), "{text}");
        assert!(
            text.contains("but 90% of the waits unnecessary, mostly disjoint-write (1.63 s"),
            "{text}"
        );
    }

    #[test]
    fn locks_section_shows_acquisitions_holds_and_sections_when_traced() {
        let mut r = report_with_locks();
        trace_hot_lock(&mut r);
        r.lock_tracing = Some(LockTracing {
            mode: TraceMode::Full,
            library: "/lib/libc.so.6".into(),
            traced_fraction: 1.0,
            acquisitions_error: None,
            windows: 1,
            functions: vec![],
            always_traced: vec![],
            sections_lost: 0,
            unmatched_unlocks: 0,
            held_overflow: 0,
        });
        let text = render(&r);
        let section: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("Locks"))
            .collect();
        assert!(section[1].contains("every call traced"), "{}", section[1]);
        let holds = section.iter().find(|l| l.contains("acquisitions")).unwrap();
        assert!(
            holds.contains("65,880 acquisitions, 60% contended"),
            "{holds}"
        );
        assert!(holds.contains("p99 28.5 µs"), "{holds}");
        let held = section.iter().find(|l| l.contains("held in")).unwrap();
        assert!(
            held.contains("contend_hot locks.c:166 → locks.c:169"),
            "{held}"
        );
        assert!(text.lines().all(|l| l.chars().count() <= WIDTH));
        // Windows whose estimate is too rough: no number, and the mode
        // line says why.
        let t = r.lock_tracing.as_mut().unwrap();
        (t.mode, t.traced_fraction, t.acquisitions_error) = (TraceMode::Sampled, 0.02, Some(0.68));
        r.locks[0].acquisitions = None;
        let text = render(&r);
        assert!(
            text.contains(
                "lock calls traced 2.0% of the time: acquisitions unknown (±68%, too rough)"
            ),
            "{text}"
        );
        assert!(!text.contains("65,880 acquisitions"), "{text}");
        // The default mode's probes never attached (no futex wait): no
        // share of the time is claimed.
        let t = r.lock_tracing.as_mut().unwrap();
        (t.traced_fraction, t.acquisitions_error, t.windows) = (0.0, None, 0);
        let text = render(&r);
        assert!(
            text.contains("lock calls not traced: no thread waited on a futex"),
            "{text}"
        );
        assert!(!text.contains("of the time"), "{text}");
    }

    /// A name cut short in the table (redis's jemalloc mutexes were all
    /// `libjemalloc.so.2+0x…`) is also given whole, on the next line.
    #[test]
    fn a_long_lock_name_is_given_whole_under_its_row() {
        let mut r = report_with_locks();
        r.locks[0].name = Some("libjemalloc.so.2+0x1d2c80".into());
        let text = render(&r);
        let lines: Vec<&str> = text.lines().collect();
        let row = lines
            .iter()
            .position(|l| l.starts_with("    libjemalloc.so.2+0x…"))
            .unwrap_or_else(|| panic!("{text}"));
        assert_eq!(lines[row + 1], "      libjemalloc.so.2+0x1d2c80", "{text}");
        r.locks[0].name = Some("g_lock".into());
        assert!(!render(&r).contains("      g_lock\n"));
    }

    #[test]
    fn locks_section_names_the_lock_its_waiters_releasers_and_owners() {
        let mut r = sample_report();
        assert!(render(&r).contains("Locks: no thread waited for a lock"));
        r.locks = report_with_locks().locks;
        let text = render(&r);
        let section: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("Locks"))
            .collect();
        assert!(section[2].contains("g_hot_lock") && section[2].contains("43,683"));
        assert!(section[2].contains("1.81 s"), "{}", section[2]);
        assert!(section[3].contains("waited in contend_hot locks.c:166"));
        assert!(section[4].contains("released by release_hot locks.c:169"));
        assert!(section[5].contains("24692"));
        assert!(text.lines().all(|l| l.chars().count() <= WIDTH));
    }
}
