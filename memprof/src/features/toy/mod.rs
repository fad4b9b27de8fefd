//! A toy analysis, built only with the unit tests: it shows what adding
//! an analysis takes (this directory and its line in [`super::SLICES`])
//! and proves it in its test. It takes the session's CPU samples (its
//! event source, no kernel code of its own) and reports each thread's
//! share of samples in the kernel, as a report section with JSON, text
//! and a dashboard tab ([`section`]).

pub mod section;

use std::collections::BTreeMap;

use memprof_common::{SampleEvent, SAMPLE_FLAG_KERNEL};

use super::{Feature, Plan, ReportContext, Slice, Target};
use crate::{
    error::Result, kernel::loader::Probes, options::Options, process::state::Process,
    report::Report,
};
use section::{KernelShare, ThreadShare};

/// The toy's registration.
pub const SLICE: Slice = Slice {
    name: "toy",
    plan,
    sections: &[section::KIND],
};

fn plan(_opts: &Options, _target: &Target<'_>, _notes: &mut Vec<String>) -> Box<dyn Plan> {
    Box::new(ToyPlan)
}

struct ToyPlan;

impl Plan for ToyPlan {
    fn start(
        self: Box<Self>,
        _probes: &mut Probes,
        _process: &mut Process,
    ) -> Result<Box<dyn Feature>> {
        Ok(Box::new(Toy::default()))
    }
}

/// Samples and kernel samples per thread.
#[derive(Default)]
pub struct Toy {
    threads: BTreeMap<u32, (u64, u64)>,
}

impl Feature for Toy {
    fn on_sample(&mut self, ev: &SampleEvent, _process: &mut Process) {
        let t = self.threads.entry(ev.tid).or_default();
        t.0 += 1;
        t.1 += u64::from(ev.flags & SAMPLE_FLAG_KERNEL != 0);
    }

    fn report(&mut self, _ctx: &mut ReportContext<'_>, report: &mut Report) {
        let mut threads: Vec<ThreadShare> = (self.threads.iter())
            .map(|(&tid, &(samples, kernel))| ThreadShare {
                tid,
                samples,
                kernel,
            })
            .collect();
        threads.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.tid.cmp(&b.tid)));
        report.sections.put(Box::new(KernelShare { threads }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        features::SLICES,
        kernel::Kernel,
        object::symbolize::Symbolizer,
        session::pipeline::{test_report, Pipeline},
        tui::{screen_at, Action, App},
    };

    /// The report of a session whose samples are `(tid, in the kernel)`.
    fn report_of(samples: &[(u32, bool)]) -> Report {
        let me = std::process::id();
        let (process, existing) = Process::new(me);
        let features: Vec<Box<dyn Feature>> = vec![Box::new(Toy::default())];
        let mut p = Pipeline::new(process, existing, features);
        for (i, &(tid, kernel)) in samples.iter().enumerate() {
            p.on_sample(&SampleEvent {
                time_ns: i as u64 + 1,
                tid,
                stack_id: -1,
                flags: if kernel { SAMPLE_FLAG_KERNEL } else { 0 },
                ..Default::default()
            });
        }
        let mut report = test_report(me, "toy", 2);
        let (kernel, mut symbolizer, mut notes) = (Kernel::default(), Symbolizer::new(), vec![]);
        p.report(&mut report, &kernel, &mut symbolizer, &mut notes, false);
        report
    }

    const SAMPLES: [(u32, bool); 5] = [(7, true), (7, false), (7, true), (9, false), (7, false)];

    #[test]
    fn the_toy_is_registered_with_its_section() {
        let toy = SLICES.iter().find(|s| s.name == "toy").expect("listed");
        assert_eq!(toy.sections.len(), 1);
        assert_eq!(toy.sections[0].key, section::KEY);
    }

    #[test]
    fn its_section_is_in_the_summary_and_the_json() {
        let report = report_of(&SAMPLES);
        let text = crate::report::text::render(&report);
        assert!(
            text.contains("Kernel share: each thread's samples in the kernel"),
            "{text}"
        );
        assert!(text.contains("  tid 7: 2 of 4 samples (50.0%)"), "{text}");
        assert!(text.contains("  tid 9: 0 of 1 samples (0.0%)"), "{text}");
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        let threads = &json[section::KEY]["threads"];
        assert_eq!(threads[0]["tid"], 7);
        assert_eq!(threads[0]["kernel"], 2);
        assert_eq!(threads[1]["samples"], 1);
    }

    #[test]
    fn its_section_reads_back_typed() {
        let report = report_of(&SAMPLES);
        let json = report.to_json();
        let back = Report::from_json(&json).expect("reads back");
        let share = back.sections.find::<KernelShare>().expect("typed");
        assert_eq!(Some(share), report.sections.find::<KernelShare>());
        assert!(back.to_json() == json, "unchanged: {}", back.to_json());
    }

    #[test]
    fn its_tab_follows_the_built_in_ones() {
        let mut app = App::new("pid 42".into());
        app.set_report(report_of(&SAMPLES));
        let tabs = app.tabs().len();
        let screen = screen_at(&app, 100, 20);
        assert!(screen.contains(&format!("{tabs} Kernel share")), "{screen}");
        assert!(screen.contains(&format!("1-{tabs} switch tab")), "{screen}");
        app.handle(Action::Tab(tabs - 1));
        app.handle(Action::Down);
        let selection = app.selection_of(section::KEY);
        assert_eq!(selection.selected(2), Some(1), "↑/↓ select its rows");
        let screen = screen_at(&app, 100, 20);
        assert!(screen.contains("in kernel"), "{screen}");
        let row = screen
            .lines()
            .find(|l| l.starts_with("│9 "))
            .expect("tid 9");
        assert!(row.contains(" 1 ") && row.contains(" 0.0%"), "{row}");
        app.handle(Action::NextTab);
        assert_eq!(app.current_tab(), crate::tui::Tab::Overview, "wraps");
    }
}
