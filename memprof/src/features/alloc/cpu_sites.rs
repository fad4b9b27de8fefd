//! The allocator's CPU time by allocation site: which calls of the
//! program the time spent in the allocator's code is spent for.
//!
//! A CPU sample in the allocator's code comes with the thread's registers
//! and the top of its stack ([`memprof_common::AllocCpuEvent`]); the
//! collector unwinds it with the objects' call-frame information (the
//! allocator keeps no frame pointer, so the sample's own frame-pointer
//! stack skips or garbles the caller), passes the allocator's own frames
//! and the program's allocation wrappers, and counts the sample for the
//! call it reached ([`CpuSites::add`]). No probe is involved: the shares
//! come in every mode, also while the allocator's probes are detached.
//!
//! Samples are kept by instruction, and only those whose instruction is
//! allocator code count when the report is made (glibc's range also
//! holds `memcpy` and the rest of libc).
//!
//! Pure: over the places the collector found.

use crate::{
    features::FastMap,
    process::maps::Place,
    report::{
        model::{AllocatorCpu, AllocatorSiteCpu},
        names::Names,
    },
};

use super::{allocator::AllocatorKind, cpu_share::is_allocator_code};
use crate::heap::site_name::name_at;

/// Distinct (instruction, site) pairs kept; samples beyond are counted
/// as unknown.
const MAX_ENTRIES: usize = 100_000;
/// Sites listed in the report.
const MAX_SITES: usize = 20;

/// Where one sample's allocator call was made: the site's call and, when
/// a wrapper was passed, the call inside it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CallSite {
    pub site: Place,
    pub via: Option<Place>,
}

/// The allocator's samples by instruction and by the call they were
/// unwound to (None: the stack did not lead out of the allocator).
#[derive(Debug, Default)]
pub struct CpuSites {
    tally: FastMap<(Place, Option<CallSite>), u64>,
    /// Samples not kept (the table was full).
    dropped: u64,
}

/// The sites' shares as reported.
#[derive(Debug, Default, PartialEq)]
pub struct SiteShares {
    pub sites: Vec<AllocatorSiteCpu>,
    /// The allocator's samples that came with a stack.
    pub samples: u64,
    /// Those that could not be unwound to a call.
    pub unknown: u64,
}

impl CpuSites {
    /// A sample at instruction `ip`, spent for the call at `site`.
    pub fn add(&mut self, ip: Place, site: Option<CallSite>) {
        let key = (ip, site);
        if let Some(n) = self.tally.get_mut(&key) {
            *n += 1;
        } else if self.tally.len() < MAX_ENTRIES {
            self.tally.insert(key, 1);
        } else {
            self.dropped += 1;
        }
    }

    /// The shares of the sites among the samples whose instruction is
    /// allocator code (`is_allocator`), sites named as allocation sites
    /// are (past inlined helpers, with the wrapper passed).
    pub fn shares(
        &self,
        mut is_allocator: impl FnMut(&Place, &mut dyn Names) -> bool,
        names: &mut dyn Names,
    ) -> SiteShares {
        let mut allocator_ip: FastMap<&Place, bool> = FastMap::default();
        let mut by_site: FastMap<&CallSite, u64> = FastMap::default();
        let mut out = SiteShares {
            unknown: self.dropped,
            samples: self.dropped,
            ..SiteShares::default()
        };
        for ((ip, site), &n) in &self.tally {
            let ours = *allocator_ip
                .entry(ip)
                .or_insert_with(|| is_allocator(ip, names));
            if !ours {
                continue;
            }
            out.samples += n;
            match site {
                Some(s) => *by_site.entry(s).or_default() += n,
                None => out.unknown += n,
            }
        }
        // Calls at different addresses may share a line: one row each.
        let mut rows: Vec<AllocatorSiteCpu> = Vec::new();
        for (s, n) in by_site {
            let site = name_at(&s.site, s.via.as_ref(), names).code_ref();
            match rows.iter_mut().find(|r| r.site == site) {
                Some(r) => r.samples += n,
                None => rows.push(AllocatorSiteCpu {
                    site,
                    samples: n,
                    share: 0.0,
                }),
            }
        }
        rows.sort_by(|a, b| {
            b.samples
                .cmp(&a.samples)
                .then_with(|| a.site.line.cmp(&b.site.line))
        });
        rows.truncate(MAX_SITES);
        for r in &mut rows {
            r.share = r.samples as f64 / out.samples.max(1) as f64;
        }
        out.sites = rows;
        out
    }
}

/// Adds the sites' shares to the allocator's CPU report, for an
/// allocator of `kind`.
pub fn fill(cpu: &mut AllocatorCpu, sites: &CpuSites, kind: AllocatorKind, names: &mut dyn Names) {
    let is_allocator = |ip: &Place, names: &mut dyn Names| {
        let code = names.code_inlined(ip);
        let file = code.frame.file.as_deref();
        is_allocator_code(&code.outermost().function, file, kind)
    };
    let s = sites.shares(is_allocator, names);
    cpu.sites = s.sites;
    cpu.site_samples = s.samples;
    cpu.sites_unknown = s.unknown;
}

/// The allocator's samples counted from every sample in its code, not
/// only from the hottest functions (`cpu_share`): the report lists the
/// program's 50 hottest, and an allocator's time may be spread over many
/// functions below them (redis under load: 28% of jemalloc's samples).
/// Each count misses some (the functions' count the tail, the stack copies'
/// those lost with a full ring), so the larger is taken. `samples` is
/// all the target's samples.
pub fn count_all(cpu: &mut AllocatorCpu, samples: u64) {
    if cpu.site_samples > cpu.samples && samples > 0 {
        cpu.samples = cpu.site_samples;
        cpu.share = cpu.samples as f64 / samples as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::{code_at, TableNames};

    fn libc(offset: u64) -> Place {
        Place::File {
            path: "/lib/libc.so.6".into(),
            file_offset: offset,
        }
    }

    #[test]
    fn samples_count_for_their_site_and_only_in_allocator_code() {
        let mut names = TableNames::new()
            .function(0x100, "split_a", 10)
            .function(0x104, "split_a", 10)
            .function(0x200, "split_b", 20);
        let (malloc, memcpy) = (libc(0x9000), libc(0x5000));
        let site = |o| CallSite {
            site: code_at(o),
            via: None,
        };
        let mut t = CpuSites::default();
        for (ip, s, n) in [
            (&malloc, Some(site(0x100)), 30),
            (&malloc, Some(site(0x104)), 30), // the free on that line
            (&malloc, Some(site(0x200)), 20),
            (&malloc, None, 20),
            (&memcpy, Some(site(0x200)), 500), // not allocator code
        ] {
            for _ in 0..n {
                t.add(ip.clone(), s.clone());
            }
        }
        let s = t.shares(|p, _| *p == malloc, &mut names);
        assert_eq!((s.samples, s.unknown), (100, 20));
        let rows: Vec<_> = s
            .sites
            .iter()
            .map(|r| (r.site.line, r.samples, (r.share * 100.0).round()))
            .collect();
        assert_eq!(rows, [(Some(10), 60, 60.0), (Some(20), 20, 20.0)]);
    }

    #[test]
    fn a_site_through_a_wrapper_is_named_with_it() {
        let mut names = TableNames::new()
            .function(0x100, "build_index", 10)
            .function(0x300, "xmalloc", 3);
        let mut t = CpuSites::default();
        t.add(
            libc(0x9000),
            Some(CallSite {
                site: code_at(0x100),
                via: Some(code_at(0x300)),
            }),
        );
        let s = t.shares(|_, _| true, &mut names);
        assert_eq!(s.sites[0].site.via.as_deref(), Some("xmalloc"));
        assert_eq!(s.sites[0].site.function, "build_index");
    }

    #[test]
    fn a_full_table_counts_the_rest_as_unknown() {
        let mut t = CpuSites::default();
        let n = MAX_ENTRIES as u64 + 5;
        for i in 0..n {
            t.add(libc(i), None);
        }
        let s = t.shares(|_, _| true, &mut TableNames::new());
        assert_eq!((s.samples, s.unknown), (n, n));
        assert!(s.sites.is_empty());
    }

    #[test]
    fn every_sample_in_the_allocator_counts_not_only_the_hottest_functions() {
        let mut cpu = AllocatorCpu {
            samples: 283,
            share: 283.0 / 6969.0,
            site_samples: 392,
            ..AllocatorCpu::default()
        };
        count_all(&mut cpu, 6969);
        assert_eq!(cpu.samples, 392);
        assert!((cpu.share - 392.0 / 6969.0).abs() < 1e-12);
        // Stack copies lost: the functions' count stays.
        cpu.site_samples = 100;
        count_all(&mut cpu, 6969);
        assert_eq!(cpu.samples, 392);
    }
}
