//! The pprof and flame-graph exports, checked with their real consumer:
//! the demo workload (one false-sharing line, one contended mutex, an
//! allocation leak) is traced once with `--pprof` and `--flamegraph`, and
//! `go tool pprof` reads every profile back. Each number it computes must
//! be the JSON report's, and each profile must name the code the JSON
//! names.

use std::{path::PathBuf, process::Command, sync::OnceLock};

use memprof::report::Report;
use memprof_tests::*;

/// The traced demo: the JSON report and the profile files' template.
struct Exported {
    report: Report,
    dir: PathBuf,
}

impl Exported {
    fn pprof(&self, kind: &str) -> PathBuf {
        self.dir.join(format!("demo-{kind}.pb.gz"))
    }

    fn svg(&self, kind: &str) -> PathBuf {
        self.dir.join(format!("demo.{kind}.svg"))
    }
}

fn exported() -> &'static Exported {
    static RUN: OnceLock<Exported> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = workload_dir().join("export");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let program = build_workload(DEMO_WORKLOAD, Variant::Debug).expect("building the demo");
        let pprof = dir.join("demo-{kind}.pb.gz");
        let flame = dir.join("demo");
        let seconds = DEMO_SECONDS.to_string();
        let mut args = vec![
            "--no-tui",
            "--pprof",
            pprof.to_str().unwrap(),
            "--flamegraph",
            flame.to_str().unwrap(),
        ];
        args.extend_from_slice(DEMO_TOOL_ARGS);
        args.extend(["--", program.to_str().unwrap(), &seconds]);
        let (_, report) = trace("export-demo", &args);
        assert_no_programs_left();
        Exported {
            report: typed(&report),
            dir,
        }
    })
}

/// Whether `go` is here (`cargo xtask setup` installs golang-go); a loud
/// skip (a failure in strict mode) when not.
fn require_go(test: &str) -> bool {
    if Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return true;
    }
    skip(
        test,
        "`go` is not installed (cargo xtask setup installs golang-go)",
    );
    false
}

/// `go tool pprof ARGS FILE`: its output, after checking that it succeeded
/// without a warning.
fn pprof(args: &[&str], file: &std::path::Path) -> String {
    let out = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        .env("PPROF_TMPDIR", workload_dir())
        .output()
        .expect("running go tool pprof");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "go tool pprof {args:?} {}: {stderr}",
        file.display()
    );
    assert!(
        !stderr.to_lowercase().contains("warning"),
        "go tool pprof warned about {}: {stderr}",
        file.display()
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    // pprof says so when the first mapping (the main binary) has no file.
    assert!(
        !stdout.contains("not available") && !stderr.contains("not available"),
        "go tool pprof lacks something in {}: {stdout}{stderr}",
        file.display()
    );
    stdout
}

/// The sum of each sample type's values, as `go tool pprof -raw` lists the
/// samples, by type name.
fn raw_totals(file: &std::path::Path) -> Vec<(String, i64)> {
    raw_totals_with(&[], file)
}

/// As [`raw_totals`], with more pprof options (e.g. a tag filter).
fn raw_totals_with(options: &[&str], file: &std::path::Path) -> Vec<(String, i64)> {
    let mut args = vec!["-raw"];
    args.extend_from_slice(options);
    let raw = pprof(&args, file);
    let mut lines = raw
        .lines()
        .skip_while(|l| !l.starts_with("Samples:"))
        .skip(1);
    let types: Vec<String> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(|t| t.split('/').next().unwrap_or(t).to_string())
        .collect();
    let mut totals = vec![0i64; types.len()];
    for line in lines.take_while(|l| !l.starts_with("Locations")) {
        let Some((values, _)) = line.split_once(':') else {
            continue;
        };
        let values: Vec<i64> = values
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        if values.len() == totals.len() {
            for (t, v) in totals.iter_mut().zip(values) {
                *t += v;
            }
        }
    }
    types.into_iter().zip(totals).collect()
}

/// `s` with the characters a regular expression treats specially escaped.
fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if r".+*?()|[]{}^$\".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn total(totals: &[(String, i64)], kind: &str) -> i64 {
    totals
        .iter()
        .find(|(t, _)| t == kind)
        .unwrap_or_else(|| panic!("no {kind} in {totals:?}"))
        .1
}

/// A report's count as pprof's signed values (None beyond their range).
fn signed(n: u64) -> Option<i64> {
    i64::try_from(n).ok()
}

fn sum<T>(items: &[T], value: impl Fn(&T) -> u64) -> i64 {
    items.iter().filter_map(|i| signed(value(i))).sum()
}

#[test]
fn cpu_profile_has_every_sample_and_the_hot_function() {
    if !require_root("cpu_profile_has_every_sample_and_the_hot_function")
        || !require_go("cpu_profile_has_every_sample_and_the_hot_function")
    {
        return;
    }
    let e = exported();
    let file = e.pprof("cpu");
    let totals = raw_totals(&file);
    let samples = signed(e.report.sampling.samples).unwrap();
    assert!(samples > 1000, "an 8 s demo at 999 Hz: {samples}");
    assert_eq!(total(&totals, "samples"), samples, "{totals:?}");
    let period = 1_000_000_000 / signed(e.report.sampling.frequency_hz).unwrap();
    assert_eq!(total(&totals, "cpu"), samples * period);
    let hot = e.report.hot_functions[0].function.as_str();
    let top = pprof(&["-top", "-sample_index=samples"], &file);
    assert!(top.contains(hot), "{hot} not in:\n{top}");
    // Stacks reach the worker's entry: main's thread start or the worker.
    let traces = pprof(&["-traces"], &file);
    assert!(traces.contains("worker"), "{traces}");
    let svg = std::fs::read_to_string(e.svg("cpu")).unwrap();
    assert!(
        svg.starts_with("<?xml") && svg.contains(hot),
        "flame graph lacks {hot}"
    );
}

#[test]
fn alloc_profile_matches_the_heap_profile() {
    if !require_root("alloc_profile_matches_the_heap_profile")
        || !require_go("alloc_profile_matches_the_heap_profile")
    {
        return;
    }
    let e = exported();
    let heap = e.report.allocator.heap_profile.as_ref();
    assert!(
        heap.is_some_and(|h| !h.sites.is_empty()),
        "the demo has a heap profile: {heap:#?}"
    );
    let sites = &heap.unwrap().sites;
    let file = e.pprof("alloc");
    // The profile has every sampled chain; each site the JSON lists is the
    // sum of its chains (labelled with the site).
    let totals = raw_totals(&file);
    for site in sites {
        let function = site.function.as_str();
        // The label the exporter gives a site: function (file:line).
        let source = site.file.as_deref().and_then(|f| f.rsplit('/').next());
        let label = match (source, site.line) {
            (Some(source), Some(line)) => format!("{function} ({source}:{line})"),
            _ => function.to_string(),
        };
        let focus = format!("-tagfocus=alloc_site=^{}$", regex_escape(&label));
        let of_site = raw_totals_with(&[&focus], &file);
        for (kind, value) in [
            ("alloc_space", site.alloc_space),
            ("alloc_objects", site.alloc_objects),
            ("inuse_space", site.inuse_space),
            ("inuse_objects", site.inuse_objects),
        ] {
            let want = value.and_then(signed).unwrap();
            assert_eq!(total(&of_site, kind), want, "{function} {kind}");
            assert!(total(&totals, kind) >= want);
        }
    }
    let top_site = sites[0].function.as_str();
    let top = pprof(&["-top", "-sample_index=alloc_space"], &file);
    assert!(top.contains(top_site), "{top_site} not in:\n{top}");
    let svg = std::fs::read_to_string(e.svg("alloc")).unwrap();
    assert!(svg.contains(top_site), "alloc flame graph lacks {top_site}");
}

#[test]
fn lock_profile_has_the_waits_at_the_waiter() {
    if !require_root("lock_profile_has_the_waits_at_the_waiter")
        || !require_go("lock_profile_has_the_waits_at_the_waiter")
    {
        return;
    }
    let e = exported();
    let locks = &e.report.locks;
    let (mut count, mut delay, mut caused) = (0, 0, 0);
    for l in locks {
        count += sum(&l.waiters, |w| w.count);
        delay += sum(&l.waiters, |w| w.wait_ns);
        caused += sum(&l.holders, |h| h.delay_caused_ns);
    }
    assert!(count > 0, "the demo's mutex is contended: {locks:#?}");
    let file = e.pprof("lock");
    let totals = raw_totals(&file);
    assert_eq!(total(&totals, "contentions"), count);
    assert_eq!(total(&totals, "delay"), delay);
    assert_eq!(total(&totals, "caused_delay"), caused);
    let waiter = locks[0].waiters[0].function.as_str();
    // Every node: the main thread's join waits the whole run, and pprof
    // drops by default what is under 0.5% of the total (the demo's lock
    // waits were 30 ms of 8 s in one CI run).
    let top = pprof(&["-top", "-nodefraction=0", "-sample_index=delay"], &file);
    assert!(top.contains(waiter), "{waiter} not in:\n{top}");
    // The lock's label is on its samples.
    let tags = pprof(&["-tags"], &file);
    assert!(tags.contains("lock") && tags.contains("waiter"), "{tags}");
}

#[test]
fn sharing_profile_has_the_writers_of_the_shared_line() {
    if !require_root("sharing_profile_has_the_writers_of_the_shared_line")
        || !require_go("sharing_profile_has_the_writers_of_the_shared_line")
    {
        return;
    }
    let e = exported();
    let entries = &e.report.false_sharing;
    assert!(!entries.is_empty(), "the demo has a falsely shared line");
    let accesses: i64 = entries
        .iter()
        .flat_map(|e| &e.code)
        .map(|c| signed(c.reads).unwrap() + signed(c.writes).unwrap())
        .sum();
    let file = e.pprof("sharing");
    let totals = raw_totals(&file);
    assert_eq!(total(&totals, "accesses"), accesses);
    assert_eq!(
        total(&totals, "invalidations"),
        sum(&e.report.false_sharing, |e| e.invalidations)
    );
    let top = pprof(&["-top", "-sample_index=invalidations"], &file);
    assert!(
        top.contains("count_requests"),
        "the writer is named:\n{top}"
    );
    let tags = pprof(&["-tags"], &file);
    assert!(tags.contains("cache_line"), "{tags}");
}

/// One request the test's ingest server received.
struct Received {
    target: String,
    content_type: String,
    body: Vec<u8>,
}

/// A minimal HTTP/1.1 server standing in for Pyroscope's ingest endpoint
/// (no Pyroscope server can be installed from the package registries these
/// machines reach): it keeps every request and answers 200.
fn ingest_server() -> (u16, std::sync::mpsc::Receiver<Received>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap_or(0);
            let target = line.split_whitespace().nth(1).unwrap_or("").to_string();
            let (mut length, mut content_type) = (0usize, String::new());
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
                let (k, v) = h.split_once(':').unwrap_or((&h, ""));
                match k.to_ascii_lowercase().as_str() {
                    "content-length" => length = v.trim().parse().unwrap_or(0),
                    "content-type" => content_type = v.trim().to_string(),
                    _ => {}
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            // Recorded before the answer: once the tool has its answer to
            // the last push (and exits), that push is in the channel.
            let _ = tx.send(Received {
                target,
                content_type,
                body,
            });
            let mut stream = stream;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    (port, rx)
}

/// The parts of a multipart/form-data body, by name.
fn parts(r: &Received) -> Vec<(String, Vec<u8>)> {
    let boundary = r
        .content_type
        .split("boundary=")
        .nth(1)
        .unwrap_or_else(|| panic!("no boundary in {}", r.content_type));
    let delimiter = format!("--{boundary}");
    let d = delimiter.as_bytes();
    let mut cuts = Vec::new();
    let mut i = 0;
    while i + d.len() <= r.body.len() {
        if &r.body[i..i + d.len()] == d {
            cuts.push(i);
            i += d.len();
        } else {
            i += 1;
        }
    }
    cuts.windows(2)
        .map(|w| {
            let part = &r.body[w[0] + d.len() + 2..w[1] - 2];
            let split = part.windows(4).position(|x| x == b"\r\n\r\n").unwrap();
            let headers = String::from_utf8_lossy(&part[..split]);
            let name = headers
                .split("name=\"")
                .nth(1)
                .and_then(|s| s.split('"').next())
                .unwrap()
                .to_string();
            (name, part[split + 4..].to_vec())
        })
        .collect()
}

/// `--push` (experimental) against a stand-in for Pyroscope's documented
/// ingest API: periodic pushes while tracing, each carrying the previous
/// profile of its concern, and a last one whose CPU profile `go tool pprof`
/// reads with the JSON's sample count.
#[test]
fn push_sends_pprof_to_an_ingest_endpoint() {
    if !require_root("push_sends_pprof_to_an_ingest_endpoint")
        || !require_go("push_sends_pprof_to_an_ingest_endpoint")
    {
        return;
    }
    let (port, rx) = ingest_server();
    let program = build_workload(DEMO_WORKLOAD, Variant::Debug).expect("building the demo");
    let url = format!("http://127.0.0.1:{port}");
    let (run, report) = trace(
        "export-push",
        &[
            "--no-tui",
            "--push",
            &url,
            "--push-every",
            "2s",
            "--app",
            "demo-app",
            "--",
            program.to_str().unwrap(),
            "6",
        ],
    );
    assert_no_programs_left();
    let got: Vec<Received> = rx.try_iter().collect();
    let cpu: Vec<&Received> = got
        .iter()
        .filter(|r| r.target.contains("demo-app.cpu"))
        .collect();
    assert!(
        cpu.len() >= 3,
        "periodic pushes and the last one: {} cpu requests; {}",
        cpu.len(),
        run.stderr
    );
    for r in &got {
        assert!(
            r.target.starts_with("/ingest?name=demo-app."),
            "{}",
            r.target
        );
        for key in ["&from=", "&until=", "&format=pprof"] {
            assert!(r.target.contains(key), "{key} missing: {}", r.target);
        }
    }
    // Each push carries the one before it for the same concern.
    for pair in cpu.windows(2) {
        let before = parts(pair[0]);
        let after = parts(pair[1]);
        let profile = &before.iter().find(|(n, _)| n == "profile").unwrap().1;
        let prev = &after
            .iter()
            .find(|(n, _)| n == "prev_profile")
            .expect("prev_profile")
            .1;
        assert_eq!(prev, profile, "prev_profile is the previous push's profile");
    }
    let last = parts(cpu[cpu.len() - 1]);
    let file = workload_dir().join("export-push-cpu.pb.gz");
    std::fs::write(&file, &last.iter().find(|(n, _)| n == "profile").unwrap().1).unwrap();
    let samples = signed(typed(&report).sampling.samples).unwrap();
    assert_eq!(
        total(&raw_totals(&file), "samples"),
        samples,
        "the last push is the whole session"
    );
    assert!(
        run.stderr.contains("pushed"),
        "the tool says what it pushed: {}",
        run.stderr
    );
}

/// No finding, no samples: two threads spinning on their own data share
/// no cache line, so the sharing profile has no sample (and is still
/// valid: pprof reads it and its declared types), while the CPU profile has
/// every sample and the lock profile the waits the JSON lists (the spinners
/// still wait for kernel locks, and main for their exit).
#[test]
fn a_concern_without_findings_exports_an_empty_profile() {
    if !require_root("a_concern_without_findings_exports_an_empty_profile")
        || !require_go("a_concern_without_findings_exports_an_empty_profile")
    {
        return;
    }
    let spin = build_workload("spin", Variant::Debug).unwrap();
    let dir = workload_dir().join("export-spin");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let template = dir.join("{kind}.pb.gz");
    let (_, report) = trace(
        "export-spin",
        &[
            "--no-tui",
            "--pprof",
            template.to_str().unwrap(),
            "--",
            spin.to_str().unwrap(),
            "time",
            "2",
            "2",
        ],
    );
    assert_no_programs_left();
    let report = typed(&report);
    assert!(report.false_sharing.is_empty());
    let totals = raw_totals(&dir.join("sharing.pb.gz"));
    assert_eq!(totals.len(), 2, "sample types are declared: {totals:?}");
    assert!(totals.iter().all(|(_, v)| *v == 0), "{totals:?}");
    let waits: i64 = report
        .locks
        .iter()
        .map(|l| sum(&l.waiters, |w| w.count))
        .sum();
    assert_eq!(
        total(&raw_totals(&dir.join("lock.pb.gz")), "contentions"),
        waits
    );
    let samples = signed(report.sampling.samples).unwrap();
    assert_eq!(
        total(&raw_totals(&dir.join("cpu.pb.gz")), "samples"),
        samples
    );
}
