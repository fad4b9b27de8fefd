//! `cargo xtask bench --only sharing`, corpus part: workloads with known
//! answers in the shapes real code has (issue #15, item 7).
//!
//! Each case is one program run under the tool with its default options
//! (`memprof-ebpf --json FILE -- PROGRAM ARGS`, or `-p` for a running
//! third-party program), judged against its expected answer: the kind of
//! sharing ("false" or "true", or no finding at all) and the object (a
//! global's name, the `file:line` of a heap block's allocation, found by a
//! marker comment in the source, or a shared mapping). Every distinct
//! finding of the report's `false_sharing` array (kind + object) is either
//! the expected one or a false positive; recall is the share of cases with
//! an expected finding that got it, precision the share of distinct
//! findings that were right.
//!
//! Where the case has a padded variant (the same work with each thread's
//! data on its own line), both run untraced in alternating rounds and the
//! measured speedup is the median of the per-round ratios; it is compared
//! with the tool's `predicted_gain` of the finding, when the report has it.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use workloads::Variant;

use crate::bench::{median, read_report, run_for_metric, run_tool, verdict};

const TARGET_RECALL: f64 = 0.9;
const TARGET_PRECISION: f64 = 1.0;
/// Predicted gain (the middle of its range) within this share of the
/// measured speedup.
const GAIN_TOLERANCE: f64 = 0.3;
/// How long the tool stays attached to stress-ng.
const ATTACH: &str = "3s";

/// What a finding is about.
#[derive(Clone, Copy, Debug)]
enum Object {
    /// A global variable, by name.
    Global(&'static str),
    /// A heap block allocated at the line of `file` carrying `marker`.
    Heap(&'static str, &'static str),
    /// A mapping shared by several processes (MAP_SHARED).
    Shared,
}

#[derive(Clone, Copy, Debug)]
enum Expect {
    /// No false_sharing entry at all.
    Nothing,
    /// One finding of this kind ("false" or "true") on this object.
    Finding(&'static str, Object),
}

#[derive(Clone, Copy, Debug)]
enum Program {
    /// A bundled workload, `tests/workloads/NAME.c`, built so.
    Bundled(&'static str, Variant),
    /// stress-ng's cacheline stressor (two processes writing neighbouring
    /// bytes of a shared line), attached with `-p`.
    StressNg,
}

struct Case {
    name: &'static str,
    /// The shape of real code it stands for.
    shape: &'static str,
    program: Program,
    args: &'static [&'static str],
    /// The same work with the fix, timed against `args` untraced.
    padded: Option<&'static [&'static str]>,
    expect: Expect,
}

use Expect::{Finding, Nothing};
use Object::{Global, Heap, Shared};
use Program::{Bundled, StressNg};
use Variant::{Debug as O1, Optimized as O2, Unoptimized as O0};

/// The corpus. Work is fixed, about a second untraced on the 2-vCPU
/// development machine.
const CASES: &[Case] = &[
    Case {
        name: "linreg",
        shape: "map-reduce kernel, calloc'd 64-byte structs",
        program: Bundled("linreg", O0),
        args: &["calloc", "2", "40000000"],
        padded: Some(&["padded", "2", "40000000"]),
        expect: Finding("false", Heap("linreg.c", "LINREG_CALLOC")),
    },
    Case {
        name: "linreg-rounds",
        shape: "thread pool re-creating workers, 64-byte heap structs",
        program: Bundled("linreg", O0),
        args: &["calloc", "2", "15000000", "3"],
        padded: Some(&["padded", "2", "15000000", "3"]),
        expect: Finding("false", Heap("linreg.c", "LINREG_CALLOC")),
    },
    Case {
        name: "linreg",
        shape: "same kernel optimised: sums stay in registers",
        program: Bundled("linreg", O2),
        args: &["calloc", "2", "40000000", "4"],
        padded: None,
        expect: Nothing,
    },
    Case {
        name: "linreg-padded",
        shape: "the kernel with its structs padded",
        program: Bundled("linreg", O0),
        args: &["padded", "2", "40000000"],
        padded: None,
        expect: Nothing,
    },
    Case {
        name: "stats24",
        shape: "pointer chasing, calloc'd 24-byte stats",
        program: Bundled("fscorpus", O0),
        args: &["stats24", "packed", "2", "150000000"],
        padded: Some(&["stats24", "padded", "2", "150000000"]),
        expect: Finding("false", Heap("fscorpus.c", "FS_STATS24_ALLOC")),
    },
    Case {
        name: "stats24",
        shape: "pointer chasing, calloc'd 24-byte stats",
        program: Bundled("fscorpus", O2),
        args: &["stats24", "packed", "2", "400000000"],
        padded: Some(&["stats24", "padded", "2", "400000000"]),
        expect: Finding("false", Heap("fscorpus.c", "FS_STATS24_ALLOC")),
    },
    Case {
        name: "pool40",
        shape: "thread pool re-creating workers, malloc'd 40-byte jobs",
        program: Bundled("fscorpus", O1),
        args: &["pool40", "packed", "2", "200000000", "4"],
        padded: Some(&["pool40", "padded", "2", "200000000", "4"]),
        expect: Finding("false", Heap("fscorpus.c", "FS_POOL40_ALLOC")),
    },
    Case {
        name: "slots64",
        shape: "global table of 64-byte slots after a header",
        program: Bundled("fscorpus", O2),
        args: &["slots64", "packed", "2", "300000000"],
        padded: Some(&["slots64", "padded", "2", "300000000"]),
        expect: Finding("false", Global("g_slots")),
    },
    Case {
        name: "slots64-padded",
        shape: "the slots aligned to lines",
        program: Bundled("fscorpus", O2),
        args: &["slots64", "padded", "2", "300000000"],
        padded: None,
        expect: Nothing,
    },
    Case {
        name: "rec72",
        shape: "global array of 72-byte records",
        program: Bundled("fscorpus", O0),
        args: &["rec72", "packed", "2", "200000000"],
        padded: Some(&["rec72", "padded", "2", "200000000"]),
        expect: Finding("false", Global("g_recs")),
    },
    Case {
        name: "rec72-padded",
        shape: "the records aligned to 128 bytes",
        program: Bundled("fscorpus", O0),
        args: &["rec72", "padded", "2", "200000000"],
        padded: None,
        expect: Nothing,
    },
    Case {
        name: "accum",
        shape: "one global struct of accumulators",
        program: Bundled("fscorpus", O0),
        args: &["accum", "packed", "2", "200000000"],
        padded: Some(&["accum", "padded", "2", "200000000"]),
        expect: Finding("false", Global("g_totals")),
    },
    Case {
        name: "accum",
        shape: "one global struct of accumulators",
        program: Bundled("fscorpus", O2),
        args: &["accum", "packed", "2", "200000000"],
        padded: Some(&["accum", "padded", "2", "200000000"]),
        expect: Finding("false", Global("g_totals")),
    },
    Case {
        name: "lookup",
        shape: "read-mostly shared lookup table",
        program: Bundled("fscorpus", O2),
        args: &["lookup", "packed", "2", "1000000000"],
        padded: None,
        expect: Nothing,
    },
    Case {
        name: "readmostly",
        shape: "read-mostly table, one writer every ms",
        program: Bundled("sharing", O1),
        args: &["readmostly", "2", "1"],
        padded: None,
        expect: Nothing,
    },
    Case {
        name: "refcount",
        shape: "atomic reference count of a heap object",
        program: Bundled("fscorpus", O2),
        args: &["refcount", "packed", "2", "30000000"],
        padded: None,
        expect: Finding("true", Heap("fscorpus.c", "FS_REFCOUNT_ALLOC")),
    },
    Case {
        name: "atomic",
        shape: "one global atomic counter",
        program: Bundled("sharing", O0),
        args: &["atomic", "2", "0", "30000000"],
        padded: None,
        expect: Finding("true", Global("g_shared_counter")),
    },
    Case {
        name: "forkshare",
        shape: "forked processes, neighbouring longs of a MAP_SHARED mapping",
        program: Bundled("fscorpus", O1),
        args: &["forkshare", "packed", "2", "400000000"],
        padded: Some(&["forkshare", "padded", "2", "400000000"]),
        expect: Finding("false", Shared),
    },
    Case {
        name: "stress-ng cacheline",
        shape: "Debian's stress-ng: two processes, neighbouring bytes of a shared line",
        program: StressNg,
        args: &[
            "--cacheline",
            "1",
            "--cacheline-method",
            "inc",
            "--timeout",
            "12s",
            "--quiet",
        ],
        padded: None,
        expect: Finding("false", Shared),
    },
];

/// How a case came out.
#[derive(Default)]
struct Outcome {
    /// Distinct findings, "KIND OBJECT".
    got: Vec<String>,
    /// How many of them were the expected one (0 or 1), and the others.
    correct: usize,
    wrong: usize,
    /// The expected finding was there.
    found: bool,
    /// The `predicted_gain` of the expected finding: low, high, basis.
    predicted: Option<(f64, f64, String)>,
    note: Option<String>,
    /// Heap findings (entries), those whose object names a type, and
    /// those named by an allocation line.
    heap: Naming,
}

/// How the corpus's heap findings are named (issue #34's share).
#[derive(Debug, Default, Clone, Copy)]
struct Naming {
    findings: usize,
    typed: usize,
    sited: usize,
}

impl Naming {
    fn add(&mut self, other: Naming) {
        self.findings += other.findings;
        self.typed += other.typed;
        self.sited += other.sited;
    }
}

/// Runs the corpus; prints its table and returns its numbers.
pub fn run(rounds: usize, tool: &Path, json_path: &Path) -> Result<Value> {
    let rounds = rounds.clamp(3, 5);
    println!("  corpus: {} cases, each traced once; padded/unpadded timed untraced, median of {rounds} alternating rounds", CASES.len());
    println!(
        "  {:<20} {:<5} {:<26} {:<34} {:<13} {:>8}  predicted",
        "case", "build", "expected", "got", "verdict", "speedup"
    );
    let mut cases = Vec::new();
    let (mut positives, mut found, mut correct, mut wrong) = (0, 0, 0, 0);
    let (mut gain_cases, mut gain_within, mut gain_present) = (0, 0, 0);
    let mut heap = Naming::default();
    for case in CASES {
        let (outcome, speedup) = match run_case(case, rounds, tool, json_path) {
            Ok(Some(r)) => r,
            Ok(None) => {
                println!("  {:<20} skipped: stress-ng is not installed", case.name);
                cases.push(json!({"case": case.name, "skipped": true}));
                continue;
            }
            Err(e) => (
                Outcome {
                    note: Some(format!("run failed: {e:#}")),
                    ..Outcome::default()
                },
                None,
            ),
        };
        let positive = matches!(case.expect, Finding(..));
        positives += usize::from(positive);
        found += usize::from(outcome.found);
        correct += outcome.correct;
        wrong += outcome.wrong;
        heap.add(outcome.heap);
        let within = gain_check(&outcome, speedup);
        if positive && speedup.is_some() {
            gain_cases += 1;
            gain_present += usize::from(outcome.predicted.is_some());
            gain_within += usize::from(within == Some(true));
        }
        print_row(case, &outcome, speedup, within);
        cases.push(case_json(case, &outcome, speedup, within));
    }
    let recall = found as f64 / positives.max(1) as f64;
    let precision = if correct + wrong == 0 {
        f64::NAN
    } else {
        correct as f64 / (correct + wrong) as f64
    };
    println!(
        "  corpus recall {found}/{positives} = {:.0}%  target ≥ {:.0}%  {}",
        recall * 100.0,
        TARGET_RECALL * 100.0,
        verdict("sharing corpus recall", recall >= TARGET_RECALL)
    );
    println!(
        "  corpus precision {correct}/{} distinct findings = {}  target {:.0}%  {}",
        correct + wrong,
        if precision.is_nan() {
            "n/a".to_string()
        } else {
            format!("{:.0}%", precision * 100.0)
        },
        TARGET_PRECISION * 100.0,
        verdict(
            "sharing corpus precision",
            precision.is_nan() || precision >= TARGET_PRECISION
        )
    );
    println!(
        "  predicted gain within ±{:.0}% of the measured speedup: {gain_within}/{gain_cases} cases ({gain_present} had a prediction)  {}",
        GAIN_TOLERANCE * 100.0,
        verdict(
            "sharing corpus predicted gain",
            gain_cases > 0 && gain_within == gain_cases
        )
    );
    println!(
        "  heap findings naming a type: {}/{}; naming their allocation line: {}/{}  {}",
        heap.typed,
        heap.findings,
        heap.sited,
        heap.findings,
        verdict(
            "sharing corpus heap findings typed",
            heap.typed == heap.findings
        )
    );
    Ok(json!({
        "heap_findings": heap.findings,
        "heap_findings_typed": heap.typed,
        "heap_findings_sited": heap.sited,
        "cases": cases,
        "positives": positives,
        "found": found,
        "recall": recall,
        "findings_correct": correct,
        "findings_wrong": wrong,
        "precision": (!precision.is_nan()).then_some(precision),
        "gain_cases": gain_cases,
        "gain_predicted": gain_present,
        "gain_within_tolerance": gain_within,
    }))
}

/// Traces one case and, where it has a padded variant, times the pair.
/// None: its program is not installed.
fn run_case(
    case: &Case,
    rounds: usize,
    tool: &Path,
    json_path: &Path,
) -> Result<Option<(Outcome, Option<f64>)>> {
    let _ = std::fs::remove_file(json_path);
    let report = match case.program {
        Bundled(name, variant) => {
            let exe = workloads::build_workload(name, variant)?;
            launched(tool, &exe, case.args, json_path)?
        }
        StressNg => match stress_ng(tool, case.args, json_path)? {
            Some(r) => r,
            None => return Ok(None),
        },
    };
    let outcome = judge(&report, case.expect)?;
    let speedup = match (case.program, case.padded) {
        (Bundled(name, variant), Some(padded)) => {
            let exe = workloads::build_workload(name, variant)?;
            Some(speedup(&exe, case.args, padded, rounds)?)
        }
        _ => None,
    };
    Ok(Some((outcome, speedup)))
}

/// Runs `exe args` under the tool with its default options; its report.
fn launched(tool: &Path, exe: &Path, args: &[&str], json_path: &Path) -> Result<Value> {
    run_tool(
        Command::new(tool)
            .arg("--json")
            .arg(json_path)
            .arg("--no-tui")
            .arg("--")
            .arg(exe)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    )?;
    read_report(json_path)
}

/// Median over `rounds` of unpadded time / padded time, run alternately
/// (drift in the machine's speed cancels within a round).
fn speedup(exe: &Path, packed: &[&str], padded: &[&str], rounds: usize) -> Result<f64> {
    let mut ratios = Vec::new();
    for _ in 0..rounds {
        let u = run_for_metric(Command::new(exe).args(packed), "unpadded", "elapsed_ns ")?;
        let p = run_for_metric(Command::new(exe).args(padded), "padded", "elapsed_ns ")?;
        ratios.push(u / p);
    }
    Ok(median(&mut ratios))
}

/// Compares a report's findings with the expected answer.
fn judge(report: &Value, expect: Expect) -> Result<Outcome> {
    let expected = match expect {
        Nothing => None,
        Finding(kind, object) => Some((kind, resolve(object)?)),
    };
    let mut outcome = Outcome::default();
    let mut right = Vec::new();
    for e in report["false_sharing"].as_array().into_iter().flatten() {
        if e["object"]["kind"] == "heap" {
            outcome.heap.findings += 1;
            outcome.heap.typed += usize::from(e["object"]["type"].is_string());
            outcome.heap.sited += usize::from(e["object"]["alloc_site"].is_object());
        }
        let label = format!("{} {}", e["kind"].as_str().unwrap_or("?"), object_label(e));
        let ok = expected
            .as_ref()
            .is_some_and(|(kind, object)| e["kind"] == *kind && object.matches(e));
        if ok && outcome.predicted.is_none() {
            outcome.predicted = predicted_gain(e);
        }
        if !outcome.got.contains(&label) {
            outcome.got.push(label.clone());
            if ok {
                right.push(label);
            }
        }
    }
    outcome.found = !right.is_empty();
    outcome.correct = right.len();
    outcome.wrong = outcome.got.len() - right.len();
    Ok(outcome)
}

/// An expected object with its marker resolved to a line.
enum Resolved {
    Global(&'static str),
    Heap(&'static str, u32),
    Shared,
}

fn resolve(object: Object) -> Result<Resolved> {
    Ok(match object {
        Global(name) => Resolved::Global(name),
        Shared => Resolved::Shared,
        Heap(file, marker) => Resolved::Heap(file, marked_line(file, marker)?),
    })
}

impl Resolved {
    fn matches(&self, e: &Value) -> bool {
        let o = &e["object"];
        match self {
            Resolved::Global(name) => o["kind"] == "global" && o["name"] == *name,
            Resolved::Heap(file, line) => {
                let site = &o["alloc_site"];
                o["kind"] == "heap"
                    && site["file"].as_str().is_some_and(|f| f.ends_with(file))
                    && site["line"].as_u64() == Some(u64::from(*line))
            }
            Resolved::Shared => o["kind"] == "shared",
        }
    }

    fn label(&self) -> String {
        match self {
            Resolved::Global(name) => name.to_string(),
            Resolved::Heap(file, line) => format!("heap {file}:{line}"),
            Resolved::Shared => "shared mapping".into(),
        }
    }
}

/// The 1-based line of `tests/workloads/FILE` that ends with the comment
/// `/* MARKER */` (a header comment may mention the marker too).
fn marked_line(file: &str, marker: &str) -> Result<u32> {
    let stem = file.trim_end_matches(".c");
    let path = workloads::workload_source(stem);
    let text = std::fs::read_to_string(&path)?;
    let comment = format!("/* {marker} */");
    let at = text
        .lines()
        .position(|l| l.trim_end().ends_with(&comment))
        .with_context(|| format!("no line marked {marker} in {}", path.display()))?;
    Ok(at as u32 + 1)
}

/// How a finding's object reads in the table: a global's name, a heap
/// block's allocation site, a mapping's name.
fn object_label(e: &Value) -> String {
    let o = &e["object"];
    let kind = o["kind"].as_str().unwrap_or("?");
    let name = o["name"].as_str().unwrap_or("?");
    match kind {
        "global" => name.to_string(),
        "heap" => {
            let site = &o["alloc_site"];
            match (site["file"].as_str(), site["line"].as_u64()) {
                (Some(f), Some(l)) => {
                    let base = Path::new(f)
                        .file_name()
                        .and_then(|b| b.to_str())
                        .unwrap_or(f);
                    format!("heap {base}:{l}")
                }
                _ => "heap (site unknown)".into(),
            }
        }
        _ => format!("{kind} {name}"),
    }
}

fn predicted_gain(e: &Value) -> Option<(f64, f64, String)> {
    let g = &e["predicted_gain"];
    Some((
        g["low"].as_f64()?,
        g["high"].as_f64()?,
        g["basis"].as_str().unwrap_or("").to_string(),
    ))
}

/// Whether the middle of the predicted range is within the tolerance of
/// the measured speedup (None: nothing to compare).
fn gain_check(outcome: &Outcome, speedup: Option<f64>) -> Option<bool> {
    let (low, high, _) = outcome.predicted.as_ref()?;
    let measured = speedup?;
    // A speedup range is multiplicative: its middle is the geometric mean.
    let mid = (low * high).sqrt();
    Some((mid - measured).abs() <= GAIN_TOLERANCE * measured)
}

fn build_name(program: Program) -> &'static str {
    match program {
        Bundled(_, O0) => "-O0",
        Bundled(_, O2) => "-O2",
        Bundled(..) => "-O1",
        StressNg => "deb",
    }
}

fn expected_label(expect: Expect) -> String {
    match expect {
        Nothing => "nothing".into(),
        Finding(kind, object) => match resolve(object) {
            Ok(r) => format!("{kind} {}", r.label()),
            Err(_) => format!("{kind} {object:?}"),
        },
    }
}

fn verdict_of(case: &Case, o: &Outcome) -> String {
    if o.note
        .as_deref()
        .is_some_and(|n| n.starts_with("run failed"))
    {
        return "run failed".into();
    }
    let fp = if o.wrong > 0 { " + FP" } else { "" };
    match case.expect {
        Nothing if o.wrong == 0 => "ok (none)".into(),
        Nothing => "false pos.".into(),
        Finding(..) if o.found => format!("found{fp}"),
        Finding(..) => format!("MISSED{fp}"),
    }
}

fn print_row(case: &Case, o: &Outcome, speedup: Option<f64>, within: Option<bool>) {
    let got = if o.got.is_empty() {
        "nothing".to_string()
    } else {
        o.got.join(", ")
    };
    let measured = speedup.map_or("-".to_string(), |s| format!("{s:.2}x"));
    let predicted = match (&o.predicted, within) {
        (Some((lo, hi, _)), Some(w)) => {
            format!("{lo:.2}..{hi:.2}x {}", if w { "ok" } else { "off" })
        }
        (Some((lo, hi, _)), None) => format!("{lo:.2}..{hi:.2}x"),
        (None, _) => "n/a".into(),
    };
    println!(
        "  {:<20} {:<5} {:<26} {:<34} {:<13} {:>8}  {predicted}",
        case.name,
        build_name(case.program),
        expected_label(case.expect),
        got,
        verdict_of(case, o),
        measured
    );
    if let Some(note) = &o.note {
        println!("  {:<20} note: {note}", "");
    }
}

fn case_json(case: &Case, o: &Outcome, speedup: Option<f64>, within: Option<bool>) -> Value {
    json!({
        "case": case.name,
        "shape": case.shape,
        "build": build_name(case.program),
        "args": case.args,
        "expected": expected_label(case.expect),
        "got": o.got,
        "verdict": verdict_of(case, o),
        "found": o.found,
        "findings_correct": o.correct,
        "findings_wrong": o.wrong,
        "measured_speedup": speedup,
        "predicted_gain": o.predicted.as_ref().map(|(low, high, basis)| json!({
            "low": low, "high": high, "basis": basis,
        })),
        "predicted_within_tolerance": within,
        "note": o.note,
    })
}

/// Runs stress-ng's cacheline stressor and attaches the tool to all its
/// worker processes for [`ATTACH`]. None: stress-ng is not installed.
fn stress_ng(tool: &Path, args: &[&str], json_path: &Path) -> Result<Option<Value>> {
    let Some(exe) = find_in_path("stress-ng") else {
        return Ok(None);
    };
    let mut stress = Command::new(exe)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting stress-ng")?;
    std::thread::sleep(Duration::from_millis(1500));
    let pids = descendants(stress.id());
    let result = attach_all(tool, &pids, json_path);
    // SAFETY: kill has no memory preconditions; the pid is our own child,
    // not yet waited for, so it cannot have been reused.
    unsafe { libc::kill(stress.id() as i32, libc::SIGTERM) };
    let _ = stress.wait();
    if pids.is_empty() {
        bail!("stress-ng started no workers");
    }
    result.map(Some)
}

/// Attaches with `-p PID,PID,...` for [`ATTACH`]; the report.
fn attach_all(tool: &Path, pids: &[u32], json_path: &Path) -> Result<Value> {
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    run_tool(
        Command::new(tool)
            .args([
                "-p",
                &list.join(","),
                "--duration",
                ATTACH,
                "--no-tui",
                "--json",
            ])
            .arg(json_path)
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    )?;
    read_report(json_path)
}

/// The processes descended from `root` (children, grandchildren...).
fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|d| {
            let pid: u32 = d.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(d.path().join("stat")).ok()?;
            // "pid (comm) state ppid ...": comm may hold spaces and parens.
            let ppid = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    found.remove(0);
    found
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: &str, object: Value) -> Value {
        json!({"kind": kind, "object": object})
    }

    fn global(name: &str) -> Value {
        json!({"kind": "global", "name": name, "alloc_site": null})
    }

    fn heap(file: &str, line: u32) -> Value {
        json!({"kind": "heap", "name": "block", "alloc_site": {"function": "main", "file": file, "line": line}})
    }

    #[test]
    fn markers_name_the_allocation_lines_not_the_header() {
        let line = marked_line("fscorpus.c", "FS_STATS24_ALLOC").unwrap();
        let text = std::fs::read_to_string(workloads::workload_source("fscorpus")).unwrap();
        let at = text.lines().nth(line as usize - 1).unwrap();
        assert!(at.contains("calloc("), "{at}");
        for case in CASES {
            if let Finding(_, object) = case.expect {
                resolve(object).unwrap();
            }
        }
    }

    /// Heap findings are counted with and without a type and a site;
    /// globals are not heap findings.
    #[test]
    fn heap_findings_are_counted_by_how_they_are_named() {
        let mut typed = heap("fscorpus.c", 10);
        typed["type"] = json!("struct stats");
        let unseen = json!({"kind": "heap", "name": "block", "alloc_site": null, "type": null});
        let report = json!({"false_sharing": [
            entry("false", typed),
            entry("false", unseen),
            entry("false", global("g_slots")),
        ]});
        let o = judge(&report, Nothing).unwrap();
        assert_eq!((o.heap.findings, o.heap.typed, o.heap.sited), (2, 1, 1));
    }

    #[test]
    fn the_expected_finding_on_several_lines_counts_once() {
        let report = json!({"false_sharing": [
            entry("false", global("g_slots")),
            entry("false", global("g_slots")),
        ]});
        let o = judge(&report, Finding("false", Global("g_slots"))).unwrap();
        assert!(o.found);
        assert_eq!((o.correct, o.wrong), (1, 0));
    }

    #[test]
    fn a_wrong_kind_is_a_miss_and_a_false_positive() {
        let line = marked_line("linreg.c", "LINREG_CALLOC").unwrap();
        let report = json!({"false_sharing": [entry("true", heap("/src/linreg.c", line))]});
        let o = judge(&report, Finding("false", Heap("linreg.c", "LINREG_CALLOC"))).unwrap();
        assert!(!o.found);
        assert_eq!((o.correct, o.wrong), (0, 1));
        assert_eq!(o.got, vec![format!("true heap linreg.c:{line}")]);
    }

    #[test]
    fn a_heap_finding_needs_the_allocation_line() {
        let line = marked_line("linreg.c", "LINREG_CALLOC").unwrap();
        let expect = Finding("false", Heap("linreg.c", "LINREG_CALLOC"));
        let right =
            json!({"false_sharing": [entry("false", heap("/w/tests/workloads/linreg.c", line))]});
        assert!(judge(&right, expect).unwrap().found);
        let wrong = json!({"false_sharing": [entry("false", heap("/w/tests/workloads/linreg.c", line + 1))]});
        assert!(!judge(&wrong, expect).unwrap().found);
    }

    #[test]
    fn any_finding_where_none_is_expected_is_a_false_positive() {
        let report = json!({"false_sharing": [entry("false", global("g_lookup"))]});
        let o = judge(&report, Nothing).unwrap();
        assert_eq!((o.correct, o.wrong), (0, 1));
        let empty = judge(&json!({"false_sharing": []}), Nothing).unwrap();
        assert_eq!((empty.correct, empty.wrong), (0, 0));
    }

    #[test]
    fn the_predicted_gain_is_read_and_compared_by_its_middle() {
        let mut e = entry("false", global("g_recs"));
        e["predicted_gain"] = json!({"low": 1.6, "high": 2.0, "basis": "stall share"});
        let o = judge(
            &json!({"false_sharing": [e]}),
            Finding("false", Global("g_recs")),
        )
        .unwrap();
        assert_eq!(o.predicted, Some((1.6, 2.0, "stall share".into())));
        assert_eq!(gain_check(&o, Some(2.0)), Some(true));
        assert_eq!(gain_check(&o, Some(3.0)), Some(false));
        assert_eq!(gain_check(&o, None), None);
    }
}
