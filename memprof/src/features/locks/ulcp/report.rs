//! Each contended lock's `unnecessary` entry: the verdict of its
//! hand-offs, the evidence per critical-section site, named, and the
//! advice for the class found.

use super::analysis::{
    Class, LockUse, Participant, UlcpProfile, Verdict, LINE_BYTES, LOCKS_MAX, WAITED_SITE,
};
use crate::{
    cli::LockMode,
    features::{
        locks::{
            analysis::LockProfile,
            report::{data_name, DataKind},
        },
        FastMap, FastSet,
    },
    heap::{BlockLookup, Heap},
    process::maps::ProcMaps,
    report::{
        format::format_ns,
        model::{
            source_label, ClassShare, ContentionClass, LockAddress, LockEntry, LockKind,
            SectionEvidence, Unnecessary,
        },
        names::Names,
    },
};

/// How the sections of a lock's holders seen only from the futex waits
/// are named when no release of the lock was named either.
const HOLDERS_SECTIONS: &str = "the holders' sections";

/// Shared words named per section.
const WORDS_NAMED: usize = 8;
/// Sections listed as evidence.
const EVIDENCE_MAX: usize = 8;
/// Below this confidence a claim is called weak in its basis.
const WEAK: f64 = 0.5;

/// What names the code and data of the evidence.
pub struct Inputs<'a> {
    pub profile: &'a UlcpProfile,
    /// The lock uprobes' call-site places.
    pub sites: &'a LockProfile,
    pub maps: &'a ProcMaps,
    pub heap: Option<&'a dyn Heap>,
}

/// Fills `unnecessary` in the entries of the pthread locks whose traced
/// sections waited behind others.
pub fn annotate(entries: &mut [LockEntry], inputs: &Inputs<'_>, names: &mut dyn Names) {
    let index = inputs.heap.map(Heap::index);
    for entry in entries {
        if !matches!(entry.kind, LockKind::Mutex | LockKind::Rwlock) {
            continue;
        }
        let LockAddress::At(lock) = entry.address else {
            continue;
        };
        let (Some(l), Some(v)) = (inputs.profile.lock(lock), inputs.profile.verdict(lock)) else {
            continue;
        };
        let mut naming = Naming {
            inputs,
            index: index.as_deref(),
            names: &mut *names,
            released_at: entry
                .holders
                .first()
                .map(|h| code_label(&h.function, h.file.as_deref(), h.line, &h.module)),
        };
        let profile = inputs.profile;
        let shared = |addr| profile.shared(addr);
        let evidence = evidence(l, &shared, &mut naming);
        entry.unnecessary = Some(unnecessary(&v, entry.wait_total_ns, evidence));
    }
}

/// Says why contended locks got no verdict: no sampled access fell in
/// their traced sections (the lock calls are traced only in windows in
/// the sampled mode).
pub fn notes(entries: &[LockEntry], profile: &UlcpProfile, mode: LockMode) -> Vec<String> {
    let mut notes: Vec<String> = note(entries, profile, mode).into_iter().collect();
    if profile.sections_of_other_locks > 0 {
        notes.push(format!(
            "{} critical sections of locks beyond the first {LOCKS_MAX} seen were not \
             analyzed for unnecessary contention",
            profile.sections_of_other_locks
        ));
    }
    if profile.joined_early > 0 {
        notes.push(format!(
            "{} critical sections were classified before the samples of their time arrived \
             (the loader fell behind): their sampled accesses are missing from the \
             unnecessary-contention evidence",
            profile.joined_early
        ));
    }
    notes
}

fn note(entries: &[LockEntry], profile: &UlcpProfile, mode: LockMode) -> Option<String> {
    let unclassified = entries
        .iter()
        .filter(|e| matches!(e.kind, LockKind::Mutex | LockKind::Rwlock))
        .filter(|e| e.contentions > 0 && e.unnecessary.is_none())
        .count();
    if unclassified == 0 {
        return None;
    }
    let how = if mode == LockMode::Sampled {
        "the lock calls are traced only in windows in the default mode, and a futex wait \
         shows its holder's section only when the holder woke it: --lock-mode full (or a \
         longer run) classifies them"
    } else {
        "a higher --sample-freq or a longer run may classify them"
    };
    Some(format!(
        "{unclassified} contended pthread locks have no unnecessary-contention verdict: too \
         few sampled accesses fell in their traced critical sections ({} sampled accesses in \
         traced sections in all, {} more at their instructions outside them, {} futex waits \
         showing their holder's section); {how}",
        profile.joined, profile.inferred, profile.waits
    ))
}

fn class_of(c: Class) -> ContentionClass {
    match c {
        Class::Null => ContentionClass::Null,
        Class::ReadRead => ContentionClass::ReadRead,
        Class::DisjointWrite => ContentionClass::DisjointWrite,
        Class::Benign => ContentionClass::Benign,
        Class::True => ContentionClass::True,
    }
}

fn unnecessary(v: &Verdict, wait_total_ns: u64, evidence: Vec<SectionEvidence>) -> Unnecessary {
    let share = v.unnecessary_share();
    let wasted = (wait_total_ns as f64 * share).round() as u64;
    let traced = v.wait_ns + v.unsampled.wait_ns;
    let pairs = v.by_class.iter().find(|(c, _)| *c == v.class);
    let basis = if v.class == Class::True {
        "a sampled access of one section conflicts with the other's: the wait was needed".into()
    } else {
        let weak = if v.confidence < WEAK { "weak: " } else { "" };
        let inferred = if v.inferred > 0 {
            format!(
                "; and up to {} more sampled outside the traced sections at instructions seen \
                 only inside them, which add to the class but not to the confidence",
                v.inferred
            )
        } else {
            String::new()
        };
        format!(
            "{weak}{} sampled accesses on the less sampled side of these pairs: a conflicting \
             access making 5% of them would have been seen with probability {:.2}{inferred}",
            v.min_accesses, v.confidence
        )
    };
    Unnecessary {
        class: class_of(v.class),
        pairs: pairs.map_or(0, |(_, t)| t.pairs),
        wasted_wait_ns: wasted,
        wasted_share: share,
        unsampled_share: v.unsampled.wait_ns as f64 / traced.max(1) as f64,
        confidence: v.confidence,
        confidence_basis: basis,
        classes: v
            .by_class
            .iter()
            .map(|(c, t)| ClassShare {
                class: class_of(*c),
                pairs: t.pairs,
                wait_share: t.wait_ns as f64 / v.wait_ns.max(1) as f64,
            })
            .collect(),
        advice: advice(v.class, &evidence, wasted),
        evidence,
    }
}

fn advice(class: Class, evidence: &[SectionEvidence], wasted_ns: u64) -> String {
    // For a null lock, the section that touched nothing shared.
    let site = evidence
        .iter()
        .find(|e| class != Class::Null || e.reads + e.writes == 0)
        .or(evidence.first())
        .map(|e| e.section.as_str());
    let words: Vec<&str> = evidence
        .iter()
        .flat_map(|e| e.shared_words.iter().map(String::as_str))
        .take(3)
        .collect();
    let words = if words.is_empty() {
        "shared data".to_string()
    } else {
        words.join(", ")
    };
    let gain = format!("up to {} of waiting", format_ns(wasted_ns));
    // A section named by where it starts, or the holders' sections seen
    // from the futex waits (named by the lock's release, when known).
    let sections = match site {
        Some(site) if site.starts_with(HOLDERS_SECTIONS) => site.to_string(),
        Some(site) => format!("the sections at {site}"),
        None => "the sections".to_string(),
    };
    match class {
        Class::Null => format!(
            "{sections} touch no shared memory while holding the lock: take it only in the \
             branch that needs it, or not at all ({gain})"
        ),
        Class::ReadRead => format!(
            "the sections only read shared data ({words}): a reader-writer lock or RCU lets \
             them run together ({gain})"
        ),
        Class::DisjointWrite => {
            let lines = evidence.iter().map(|e| e.shared_lines).max().unwrap_or(0);
            format!(
                "the sections write different shared words ({words}): a lock per word or slot \
                 (or atomics) lets them run together ({gain}); keep the words on separate cache \
                 lines ({lines} lines shared now)"
            )
        }
        Class::Benign => format!(
            "the sections only ever store the same constant to {words}: write it once \
             outside the lock, or test before writing ({gain})"
        ),
        Class::True => format!(
            "the sections conflict on {words}: the lock is needed; shorten the sections or \
             split the data so fewer of them meet"
        ),
    }
}

/// A place in the code as sections are named: "function (file:line)".
fn code_label(function: &str, file: Option<&str>, line: Option<u32>, module: &str) -> String {
    let at = source_label(file, line, module);
    if file.is_some() {
        format!("{function} ({at})")
    } else if function.starts_with(module) {
        function.to_string() // module+offset says it all
    } else {
        format!("{function} {at}")
    }
}

/// What names code sites and data words.
struct Naming<'a, 'b> {
    inputs: &'a Inputs<'a>,
    index: Option<&'a dyn BlockLookup>,
    names: &'b mut dyn Names,
    /// Where the lock's holders released it when that caused the most
    /// delay (its first holder site), named: what the holders' sections
    /// seen from the futex waits are named by (they are the lock's, all
    /// release sites together).
    released_at: Option<String>,
}

impl Naming<'_, '_> {
    fn section(&mut self, site: u64) -> String {
        if site == WAITED_SITE {
            const HOW: &str = "seen from the futex waits; their lock calls were not traced";
            return match &self.released_at {
                Some(at) => format!("{HOLDERS_SECTIONS} (the lock's top release: {at}; {HOW})"),
                None => format!("{HOLDERS_SECTIONS} while others slept on the lock ({HOW})"),
            };
        }
        match self.inputs.sites.site_place(site) {
            Some(place) => {
                let f = self.names.code_innermost(place);
                code_label(&f.function, f.file.as_deref(), f.line, &f.module)
            }
            None => format!("{site:#x}"),
        }
    }

    fn word(&mut self, addr: u64) -> String {
        let blocks = self.inputs.heap.zip(self.index);
        match data_name(self.inputs.maps, blocks, None, self.names, addr) {
            Some(d) if d.kind == DataKind::HeapBlock => format!("{} +{:#x}", d.name, d.offset),
            Some(d) if d.offset == 0 => d.name,
            Some(d) => format!("{}+{:#x}", d.name, d.offset),
            None => format!("{addr:#x}"),
        }
    }
}

/// A section site's participants (one per thread) merged.
#[derive(Default)]
struct SiteTotals {
    threads: usize,
    sections: u64,
    sampled: u64,
    reads: u64,
    writes: u64,
    private: u64,
    inferred: u64,
    words: FastMap<u64, u64>,
}

impl SiteTotals {
    fn add(&mut self, p: &Participant, shared: &dyn Fn(u64) -> bool) {
        self.threads += 1;
        self.sections += p.sections;
        self.sampled += p.sampled_sections;
        self.private += p.private;
        self.inferred += p.inferred;
        for (w, u) in &p.words {
            let n = u64::from(u.reads + u.writes);
            if shared(*w) {
                self.reads += u64::from(u.reads);
                self.writes += u64::from(u.writes);
                *self.words.entry(*w).or_default() += n;
            } else {
                self.private += n;
            }
        }
    }
}

fn evidence(
    l: &LockUse,
    shared: &dyn Fn(u64) -> bool,
    naming: &mut Naming,
) -> Vec<SectionEvidence> {
    let mut sites: FastMap<u64, SiteTotals> = FastMap::default();
    for ((site, _), p) in &l.participants {
        sites.entry(*site).or_default().add(p, shared);
    }
    let mut sites: Vec<(u64, SiteTotals)> = sites.into_iter().collect();
    sites.sort_by(|a, b| {
        let n = |t: &SiteTotals| t.reads + t.writes + t.private;
        n(&b.1).cmp(&n(&a.1)).then(a.0.cmp(&b.0))
    });
    sites
        .into_iter()
        .take(EVIDENCE_MAX)
        .map(|(site, t)| {
            let mut words: Vec<(u64, u64)> = t.words.iter().map(|(w, n)| (*w, *n)).collect();
            words.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let lines: FastSet<u64> = words.iter().map(|(w, _)| w & !(LINE_BYTES - 1)).collect();
            SectionEvidence {
                section: naming.section(site),
                threads: t.threads,
                sections: t.sections,
                sampled_sections: t.sampled,
                reads: t.reads,
                writes: t.writes,
                private: t.private,
                inferred: t.inferred,
                shared_words: words
                    .iter()
                    .take(WORDS_NAMED)
                    .map(|(w, _)| naming.word(*w))
                    .collect(),
                shared_word_count: words.len(),
                shared_lines: lines.len(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        features::locks::ulcp::analysis::{Access, Span},
        report::{
            fixtures::{code_at, program_maps, TableNames},
            model::HolderSite,
        },
    };

    /// A mutex and two globals of the program (see `program_maps`).
    const LOCK: u64 = 0x5555_5555_8040;
    const COUNTS: u64 = 0x5555_5555_8100;
    const SITE: u64 = 0x5555_5555_4123;

    /// Threads 1 and 2 take turns on the lock, each writing its own
    /// counter of `g_counts` (both seen on the page outside too).
    fn profile() -> UlcpProfile {
        profile_at(SITE)
    }

    /// As [`profile`], the sections at `site`.
    fn profile_at(site: u64) -> UlcpProfile {
        let mut p = UlcpProfile::default();
        let mut t = 1_000_000;
        for i in 0..100u64 {
            let tid = 1 + (i % 2) as u32;
            p.on_access(Access {
                time_ns: t + 100,
                tid,
                ip: 0,
                addr: COUNTS + 8 * u64::from(tid - 1),
                size: 8,
                write: true,
                private: false,
                value: None,
            });
            p.on_span(Span {
                lock: LOCK,
                tid,
                site,
                start_ns: t,
                end_ns: t + 4_000,
                wait_ns: if i == 0 { 0 } else { 4_000 },
                read: false,
            });
            t += 4_000;
        }
        p.finish();
        p
    }

    fn inputs<'a>(
        profile: &'a UlcpProfile,
        sites: &'a LockProfile,
        maps: &'a ProcMaps,
    ) -> Inputs<'a> {
        Inputs {
            profile,
            sites,
            maps,
            heap: None,
        }
    }

    fn entry(address: u64, kind: LockKind) -> LockEntry {
        LockEntry {
            address: LockAddress::At(address),
            kind,
            contentions: 50,
            wait_total_ns: 2_000_000,
            ..LockEntry::default()
        }
    }

    #[test]
    fn a_contended_mutex_gets_its_class_named_evidence_and_advice() {
        let profile = profile();
        let mut sites = LockProfile::new();
        sites.set_site_place(SITE, code_at(0x122));
        let maps = program_maps();
        let inputs = inputs(&profile, &sites, &maps);
        let mut names = TableNames::new()
            .function(0x122, "bump", 30)
            .global(COUNTS, 16, "g_counts");
        let mut entries = vec![
            entry(LOCK, LockKind::Mutex),
            entry(LOCK, LockKind::Condvar),
            entry(LOCK + 64, LockKind::Mutex),
        ];
        annotate(&mut entries, &inputs, &mut names);
        let u = entries[0].unnecessary.as_ref().expect("a verdict");
        assert_eq!(u.class, ContentionClass::DisjointWrite);
        assert_eq!(u.pairs, 99);
        assert_eq!(u.wasted_share, 1.0);
        assert_eq!(u.wasted_wait_ns, 2_000_000, "the lock's whole wait");
        assert!(u.confidence > 0.9, "{u:?}");
        let e = &u.evidence[0];
        assert_eq!(e.section, "bump (prog.c:30)");
        assert_eq!((e.threads, e.sections, e.writes), (2, 100, 100));
        assert_eq!(e.shared_words, ["g_counts", "g_counts+0x8"]);
        assert_eq!((e.shared_word_count, e.shared_lines), (2, 1));
        assert!(u.advice.contains("g_counts, g_counts+0x8"), "{}", u.advice);
        // Only pthread locks, and only those with hand-offs.
        assert_eq!(entries[1].unnecessary, None);
        assert_eq!(entries[2].unnecessary, None);
        let notes = notes(&entries, &profile, LockMode::Sampled);
        let n = &notes[0];
        assert!(n.starts_with("1 contended pthread locks have no"), "{n}");
        assert!(n.contains("--lock-mode full"), "{n}");
    }

    /// The holders' sections seen only from the futex waits are named by
    /// where the lock was released, and the advice reads with that name.
    #[test]
    fn sections_seen_from_the_waits_are_named_by_their_release() {
        let profile = profile_at(WAITED_SITE);
        let sites = LockProfile::new();
        let maps = program_maps();
        let inputs = inputs(&profile, &sites, &maps);
        let mut names = TableNames::new().global(COUNTS, 16, "g_counts");
        let released = HolderSite {
            function: "release".into(),
            file: Some("/src/prog.c".into()),
            line: Some(40),
            module: "prog".into(),
            count: 50,
            woken: 50,
            delay_caused_ns: 0,
        };
        let mut entries = vec![LockEntry {
            holders: vec![released],
            ..entry(LOCK, LockKind::Mutex)
        }];
        annotate(&mut entries, &inputs, &mut names);
        let u = entries[0].unnecessary.as_ref().expect("a verdict");
        let how = "seen from the futex waits; their lock calls were not traced";
        let section = &u.evidence[0].section;
        assert_eq!(
            section,
            &format!("the holders' sections (the lock's top release: release (prog.c:40); {how})")
        );
        let mut unnamed = vec![entry(LOCK, LockKind::Mutex)];
        annotate(&mut unnamed, &inputs, &mut names);
        let u = unnamed[0].unnecessary.as_ref().expect("a verdict");
        let section = &u.evidence[0].section;
        let want = format!("the holders' sections while others slept on the lock ({how})");
        assert_eq!(section, &want);
        let evidence = SectionEvidence {
            section: want.clone(),
            ..SectionEvidence::default()
        };
        let advice = advice(Class::Null, &[evidence], 1_000);
        assert!(
            advice.starts_with(&format!("{want} touch no shared memory")),
            "{advice}"
        );
    }

    #[test]
    fn weak_and_needed_verdicts_say_so() {
        let mut v = Verdict {
            class: Class::Null,
            by_class: Vec::new(),
            unsampled: Default::default(),
            wait_ns: 100,
            unnecessary_wait_ns: 100,
            confidence: 0.14,
            min_accesses: 3,
            inferred: 0,
        };
        let u = unnecessary(&v, 1_000, Vec::new());
        assert!(u.confidence_basis.starts_with("weak: 3 sampled"), "{u:?}");
        assert!(u.advice.contains("touch no shared memory"), "{}", u.advice);
        v.class = Class::True;
        v.unnecessary_wait_ns = 0;
        v.confidence = 1.0;
        let u = unnecessary(&v, 1_000, Vec::new());
        assert_eq!(u.wasted_wait_ns, 0);
        assert!(u.advice.contains("the lock is needed"), "{}", u.advice);
    }
}
