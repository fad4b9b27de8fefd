//! The report's heap profile: the byte-sampled chains grouped by site
//! (their first frame outside the allocation wrappers), scaled to the
//! session and ranked.

use super::heap::{site_index, ChainStats, HeapFrame, HeapProfile};
use crate::{
    features::FastMap,
    object::symbolize::Inlined,
    process::maps::Place,
    report::{
        model::{CallerRef, HeapProfileReport, HeapSite},
        names::callers,
        profiles::{site_label, AllocChain, StackFrame},
    },
};

/// Sites kept per ranking.
const SITES_PER_RANKING: usize = 10;

/// What turns the weighted samples into session estimates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeapScale {
    /// Chains sent by the programs, and held back by their per-second cap.
    pub sent: u64,
    pub capped: u64,
    /// Estimated ÷ traced allocations (1 in full mode; None when the
    /// estimate is unknown).
    pub windows: Option<f64>,
    /// Every free was traced (full mode): what is in use is known.
    pub all_frees: bool,
}

impl HeapScale {
    /// The samples held back by the cap that no sample sent stands for
    /// (`attributed` are those that one does), made up by all those sent.
    fn cap(&self, attributed: u64) -> f64 {
        if self.sent == 0 {
            1.0
        } else {
            (self.sent + self.capped) as f64 / (self.sent + attributed.min(self.capped)) as f64
        }
    }

    /// The factors of the allocated and the in-use estimates (None:
    /// unknown).
    fn factors(&self, attributed: u64) -> (Option<f64>, Option<f64>) {
        let cap = self.cap(attributed);
        (self.windows.map(|w| w * cap), self.all_frees.then_some(cap))
    }

    fn basis(&self, mean: u64, attributed: u64) -> String {
        let mut basis = format!(
            "one allocation sampled per {} KiB allocated by a thread, on average, each \
             standing for 1/(1 - e^(-size/{} KiB)) allocations",
            mean >> 10,
            mean >> 10
        );
        if self.capped > 0 {
            let attributed = attributed.min(self.capped);
            basis += &format!(
                "; {} samples held back by the per-second cap, each counted by the next \
                 sample sent",
                self.capped
            );
            if attributed < self.capped {
                basis += &format!(
                    " (x{:.2} for the {} after the last)",
                    self.cap(attributed),
                    self.capped - attributed
                );
            }
        }
        match self.windows {
            Some(w) if w > 1.0 => {
                basis += &format!(
                    "; x{w:.2} for the allocations made while the probes were detached \
                     (estimated like malloc's count)"
                )
            }
            Some(_) => {}
            None => {
                basis += "; the session's allocation count is unknown, so allocated totals are null"
            }
        }
        if !self.all_frees {
            basis += "; in-use figures are null: frees were not all traced (full mode traces them)";
        }
        basis
    }
}

/// One site's chains summed.
#[derive(Default)]
struct SiteSum<'a> {
    stats: ChainStats,
    /// Its chains' own figures: scaled and rounded one by one, so that a
    /// site's totals are the sums of its exported chains'.
    members: Vec<&'a ChainStats>,
    /// The heaviest chain and its bytes, with the site's index in it.
    chain: Option<(&'a [HeapFrame], f64, usize)>,
}

/// Builds the heap profile section.
pub fn report(
    heap: &HeapProfile,
    scale: HeapScale,
    symbolize: &mut impl FnMut(&Place) -> Inlined,
) -> HeapProfileReport {
    let all = by_site(heap, symbolize);
    let total: f64 = all.iter().map(|s| s.stats.alloc_space).sum();
    let mut chosen: Vec<usize> = Vec::new();
    let rankings: [&dyn Fn(&ChainStats) -> f64; 2] = [&|s| s.alloc_space, &|s| s.inuse_space];
    for key in rankings.iter().take(if scale.all_frees { 2 } else { 1 }) {
        let mut order: Vec<usize> = (0..all.len())
            .filter(|&i| key(&all[i].stats) > 0.0)
            .collect();
        order.sort_by(|&a, &b| key(&all[b].stats).total_cmp(&key(&all[a].stats)));
        for i in order.into_iter().take(SITES_PER_RANKING) {
            if !chosen.contains(&i) {
                chosen.push(i);
            }
        }
    }
    let (samples, _) = heap.samples();
    let factors = scale.factors(heap.held_back());
    HeapProfileReport {
        sample_mean_bytes: heap.mean_bytes(),
        samples,
        capped: scale.capped,
        basis: scale.basis(heap.mean_bytes(), heap.held_back()),
        sites: chosen
            .into_iter()
            .filter_map(|i| site_entry(&all[i], factors, total, symbolize))
            .collect(),
    }
}

/// The chains summed per site.
fn by_site<'a>(
    heap: &'a HeapProfile,
    symbolize: &mut impl FnMut(&Place) -> Inlined,
) -> Vec<SiteSum<'a>> {
    let mut sites: FastMap<Place, SiteSum<'_>> = FastMap::default();
    for (chain, stats) in heap.chains() {
        let at = site_index(chain, |p| symbolize(p).outermost().function.clone());
        let sum = sites.entry(chain[at].place.clone()).or_default();
        sum.stats.samples += stats.samples;
        sum.stats.alloc_objects += stats.alloc_objects;
        sum.stats.alloc_space += stats.alloc_space;
        sum.stats.inuse_objects += stats.inuse_objects;
        sum.stats.inuse_space += stats.inuse_space;
        sum.members.push(stats);
        if sum.chain.is_none_or(|(_, b, _)| stats.alloc_space > b) {
            sum.chain = Some((chain, stats.alloc_space, at));
        }
    }
    sites.into_values().collect()
}

/// One site of the report, its estimates scaled by the factors of the
/// allocated and in-use figures; `total` is the bytes of all sites.
fn site_entry(
    sum: &SiteSum<'_>,
    (alloc, inuse): (Option<f64>, Option<f64>),
    total: f64,
    symbolize: &mut impl FnMut(&Place) -> Inlined,
) -> Option<HeapSite> {
    let times = |f: Option<f64>, get: fn(&ChainStats) -> f64| {
        f.map(|f| sum.members.iter().map(|s| scaled(get(s), f)).sum())
    };
    let (chain, _, at) = sum.chain?;
    let named = symbolize(&chain[at].place);
    let frame = named.frame.clone();
    let wrappers = chain[..at]
        .iter()
        .map(|f| symbolize(&f.place).outermost().function.clone())
        .collect();
    let chain = chain
        .iter()
        .map(|f| {
            let c = symbolize(&f.place).outermost().clone();
            CallerRef {
                function: c.function,
                file: c.file,
                line: c.line,
            }
        })
        .collect();
    Some(HeapSite {
        function: frame.function,
        file: frame.file,
        line: frame.line,
        module: frame.module,
        inlined_into: callers(&named),
        wrappers,
        chain,
        samples: sum.stats.samples,
        alloc_share: if total > 0.0 {
            sum.stats.alloc_space / total
        } else {
            0.0
        },
        alloc_space: times(alloc, |s| s.alloc_space),
        alloc_objects: times(alloc, |s| s.alloc_objects),
        inuse_space: times(inuse, |s| s.inuse_space),
        inuse_objects: times(inuse, |s| s.inuse_objects),
    })
}

/// An estimate `x` times the factor `f`, rounded.
fn scaled(x: f64, f: f64) -> u64 {
    (x * f).round() as u64
}

/// Every sampled chain, scaled like the report's sites (whose figures are
/// the sums of their chains'), for the profile exporters: the report
/// lists the top sites only.
pub fn export_chains(
    heap: &HeapProfile,
    scale: HeapScale,
    symbolize: &mut impl FnMut(&Place) -> Inlined,
) -> Vec<AllocChain> {
    let (alloc, inuse) = scale.factors(heap.held_back());
    heap.chains()
        .map(|(chain, stats)| {
            let at = site_index(chain, |p| symbolize(p).outermost().function.clone());
            let frames = chain
                .iter()
                .map(|f| {
                    let c = symbolize(&f.place).outermost().clone();
                    StackFrame {
                        function: c.function,
                        file: c.file,
                        line: c.line,
                        module: Some(c.module),
                        object: match &f.place {
                            Place::File { path, .. } => Some(path.to_string()),
                            _ => None,
                        },
                    }
                })
                .collect::<Vec<_>>();
            let v = |f: Option<f64>, x: f64| f.map(|f| scaled(x, f));
            let site = &frames[at];
            AllocChain {
                site: site_label(&site.function, site.file.as_deref(), site.line),
                frames,
                alloc_objects: v(alloc, stats.alloc_objects),
                alloc_space: v(alloc, stats.alloc_space),
                inuse_objects: v(inuse, stats.inuse_objects),
                inuse_space: v(inuse, stats.inuse_space),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::symbolize::Frame;

    use crate::process::maps::prog_place as place;

    fn frame(offset: u64) -> HeapFrame {
        HeapFrame {
            place: place(offset),
            returns_result: false,
        }
    }

    /// 1: xmalloc, 2 and 3: two callers of it, 4: main.
    fn names(p: &Place) -> Inlined {
        let Place::File { file_offset, .. } = p else {
            unreachable!()
        };
        let function = ["", "xmalloc", "parse", "load", "main"][*file_offset as usize];
        Inlined::alone(Frame {
            function: function.into(),
            module: "prog".into(),
            file: Some("prog.c".into()),
            line: Some(*file_offset as u32 * 10),
        })
    }

    fn profile() -> HeapProfile {
        let mut h = HeapProfile::new(1);
        // parse allocates 3 blocks through xmalloc, two kept; load one,
        // through two different chains of callers.
        for (i, chain) in [[1, 2, 4], [1, 2, 4], [1, 2, 3]].iter().enumerate() {
            h.add_sample(
                chain.iter().map(|&o| frame(o)).collect(),
                0x100 + i as u64,
                1000,
                1,
            );
        }
        h.add_sample(vec![frame(1), frame(3), frame(4)], 0x200, 500, 1);
        h.on_free(0x100);
        h
    }

    #[test]
    fn sites_are_past_the_wrappers_and_ranked_by_bytes() {
        let scale = HeapScale {
            sent: 4,
            capped: 4,
            windows: Some(1.0),
            all_frees: true,
        };
        let r = report(&profile(), scale, &mut names);
        assert_eq!(r.samples, 4);
        let got: Vec<_> = r.sites.iter().map(|s| s.function.as_str()).collect();
        assert_eq!(got, ["parse", "load"]);
        let parse = &r.sites[0];
        assert_eq!(parse.wrappers, ["xmalloc"]);
        let chain: Vec<_> = parse.chain.iter().map(|c| c.function.as_str()).collect();
        assert_eq!(chain, ["xmalloc", "parse", "main"], "the heaviest chain");
        assert_eq!(parse.line, Some(20));
        // Weights of 1000-byte samples at a 1-byte mean are 1 block each,
        // doubled for the one held back before each.
        assert_eq!(parse.alloc_objects, Some(6));
        assert_eq!(parse.alloc_space, Some(6000));
        assert_eq!(parse.inuse_objects, Some(4));
        assert!((parse.alloc_share - 3000.0 / 3500.0).abs() < 1e-9);
        assert!(r.basis.contains("4 samples held back"), "{}", r.basis);
        assert!(!r.basis.contains("after the last"), "{}", r.basis);
        // Four more held back after the last sample sent: made up by all.
        let r = report(&profile(), HeapScale { capped: 8, ..scale }, &mut names);
        assert_eq!(r.sites[0].alloc_objects, Some(9));
        assert!(
            r.basis.contains("x1.50 for the 4 after the last"),
            "{}",
            r.basis
        );
    }

    /// The exporters get every chain, each labelled with its site, and
    /// a site's figures are exactly the sums of its chains' (each scaled
    /// and rounded on its own), with a factor that is not whole.
    #[test]
    fn exported_chains_add_up_to_the_sites() {
        let scale = HeapScale {
            sent: 3,
            capped: 1,
            windows: Some(1.7),
            all_frees: true,
        };
        let r = report(&profile(), scale, &mut names);
        let chains = export_chains(&profile(), scale, &mut names);
        assert_eq!(chains.len(), 3, "parse-main, parse-load, load-main");
        for site in &r.sites {
            let label = site_label(&site.function, site.file.as_deref(), site.line);
            let of_site: Vec<_> = chains.iter().filter(|c| c.site == label).collect();
            let total = |get: fn(&AllocChain) -> Option<u64>| -> Option<u64> {
                of_site.iter().map(|c| get(c)).sum()
            };
            assert_eq!(
                total(|c| c.alloc_space),
                site.alloc_space,
                "{}",
                site.function
            );
            assert_eq!(total(|c| c.alloc_objects), site.alloc_objects);
            assert_eq!(total(|c| c.inuse_space), site.inuse_space);
            assert_eq!(total(|c| c.inuse_objects), site.inuse_objects);
        }
        let parse = chains
            .iter()
            .find(|c| c.site == "parse (prog.c:20)")
            .unwrap();
        let functions: Vec<_> = parse.frames.iter().map(|f| f.function.as_str()).collect();
        assert_eq!(functions[..2], ["xmalloc", "parse"], "innermost first");
    }

    #[test]
    fn unknown_scales_give_null_estimates_and_say_why() {
        let scale = HeapScale {
            sent: 4,
            capped: 0,
            windows: None,
            all_frees: false,
        };
        let r = report(&profile(), scale, &mut names);
        assert!(r
            .sites
            .iter()
            .all(|s| s.alloc_space.is_none() && s.inuse_space.is_none()));
        assert_eq!(r.sites[0].samples, 3);
        assert!(
            r.basis.contains("count is unknown") && r.basis.contains("in-use figures are null")
        );
    }
}
