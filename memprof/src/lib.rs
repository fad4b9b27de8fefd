//! memprof-ebpf: find memory-level performance bugs of multithreaded
//! programs (false sharing, slow or wasteful allocation, lock contention) in
//! a running process, with eBPF.
//!
//! The binary is a thin shell around [`run`]; tests drive the same code.
//!
//! Layout, in the order data flows (docs/architecture.md draws it):
//! - [`cli`] and [`options`]: the command line and the `MEMPROF_*`
//!   switches, parsed once into [`options::Options`];
//! - [`session`]: checks, target (attach or launch), the generic runner;
//! - [`kernel`]: the BPF loader, uprobe windows and their budget;
//! - [`process`]: the target's memory map and the places in it
//!   ([`process::maps::Place`]), shared by all the layers below;
//! - [`object`]: the target's object files: code, call-frame information,
//!   symbols, debug info;
//! - [`features`]: the analyses, one directory each behind the
//!   [`features::Feature`] seam (events → pure analysis → report section);
//! - [`heap`]: the heap as a session service ([`heap::Heap`]): the live
//!   blocks and allocation sites one feature keeps, which the others ask
//!   for to name memory without naming that feature;
//! - [`report`]: the model and its text and JSON forms, exports and pushes;
//! - [`tui`]: the live dashboard, rendering the same model;
//! - [`privilege`] and [`output`]: capabilities kept after attach, and the
//!   files the tool writes.

pub mod cli;
pub mod error;
pub mod features;
pub mod heap;
pub mod kernel;
pub mod object;
pub mod options;
pub mod output;
pub mod privilege;
pub mod process;
pub mod report;
pub mod session;
pub mod tui;

use std::io::IsTerminal;

pub use error::{Error, Result};

/// Where the results go, opened before tracing starts.
struct Outputs {
    json_to_stdout: bool,
    json_file: Option<(std::fs::File, std::path::PathBuf)>,
    /// `--pprof` and `--flamegraph` files.
    profiles: report::export::ProfileFiles,
    /// A launched command's output, held while the dashboard is up.
    captured: Option<process::launch::Captured>,
}

/// Runs the command line: a session, then the summary and JSON output.
/// `log` holds the log lines kept while the dashboard is on screen.
pub async fn run(cli: cli::Cli, live: bool, log: Option<tui::LogRing>) -> Result<()> {
    let (opts, outputs) = options(&cli, live)?;
    let mut dashboard = if live {
        let title = match &opts.target {
            process::handle::TargetSpec::Pid(pid) => format!("pid {pid}"),
            process::handle::TargetSpec::Command(cmd) => cmd.join(" "),
        };
        Some(
            tui::Dashboard::start(title, log.clone().unwrap_or_default())
                .map_err(|e| anyhow::anyhow!("starting the dashboard: {e}"))?,
        )
    } else {
        if std::io::stderr().is_terminal() {
            announce(&opts);
        }
        None
    };
    let result = session::run(opts, dashboard.as_mut()).await;
    drop(dashboard); // restore the terminal before printing anything
                     // What was held back while the dashboard was on screen; later lines
                     // (detaching, the end of the session) go straight to stderr.
    if let Some(log) = &log {
        log.release_to_stderr();
    }
    let captured = outputs.captured.as_ref();
    if let Some(text) = captured.and_then(|c| c.text(std::time::Duration::from_millis(500))) {
        eprintln!("memprof-ebpf: output of the command:");
        eprint!("{text}");
        if !text.ends_with('\n') {
            eprintln!();
        }
    }
    let (report, reason, detaching) = result?;
    tracing::info!("session ended: {reason:?}");
    write_report(&report, outputs)?;
    // No probe may outlive the tool: wait for the kernel to remove the last
    // ones (it takes about 0.2 s per allocator probe).
    if !detaching.is_empty() && std::io::stderr().is_terminal() {
        eprintln!(
            "memprof-ebpf: waiting for the kernel to remove {} probes…",
            detaching.len()
        );
    }
    detaching.wait();
    let left = kernel::detach::wait_unloaded(std::time::Duration::from_secs(2));
    if !left.is_empty() {
        tracing::warn!("programs {left:?} still loaded 2 s after detaching");
    }
    Ok(())
}

/// What is traced: the main target, the other pids, and the cgroup they
/// come from (`--cgroup`: its processes, the lowest pid the main one).
fn targets(
    cli: &cli::Cli,
) -> Result<(
    process::handle::TargetSpec,
    Vec<u32>,
    Option<process::cgroup::Cgroup>,
)> {
    let cgroup = cli
        .cgroup
        .as_deref()
        .map(process::cgroup::Cgroup::resolve)
        .transpose()?;
    let mut pids = match (&cli.pid, &cgroup) {
        (Some(pids), _) => pids.0.clone(),
        (None, Some(c)) => c.processes(),
        (None, None) => Vec::new(),
    };
    if let (Some(c), true) = (&cgroup, pids.is_empty()) {
        return Err(Error::Usage(format!(
            "--cgroup {}: no process in it to trace (cgroup {})",
            cli.cgroup.as_deref().unwrap_or_default(),
            c.dir.display()
        )));
    }
    let others = pids.split_off(pids.len().min(1));
    let target = match pids.first() {
        Some(&pid) => process::handle::TargetSpec::Pid(pid),
        None => process::handle::TargetSpec::Command(cli.command.clone()),
    };
    Ok((target, others, cgroup))
}

/// The session's options from the command line, and the output files,
/// opened now: a bad path fails before any tracing, and nothing needs the
/// privilege to create files once probes are attached.
fn options(cli: &cli::Cli, live: bool) -> Result<(options::Options, Outputs)> {
    let (target, extra_pids, cgroup) = targets(cli)?;
    let launching = matches!(target, process::handle::TargetSpec::Command(_));
    if !launching {
        for (given, flag) in [
            (cli.user.is_some(), "-u/--user"),
            (cli.command_output.is_some(), "--command-output"),
        ] {
            if given {
                return Err(Error::Usage(format!(
                    "{flag} is for a launched command (`-- CMD`), not with -p"
                )));
            }
        }
    }
    let run_as = match &cli.user {
        Some(user) => {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                return Err(Error::Privilege(
                    "-u/--user needs root to change the command's user".into(),
                ));
            }
            Some(process::launch::RunAs::lookup(user)?)
        }
        None => None,
    };
    let (json_to_stdout, json_file) = json_output(cli)?;
    let mut captured = None;
    let command_output = match &cli.command_output {
        Some(path) => process::launch::Output::File(output::create(
            path,
            output::REPORT_MODE,
            "the command's output",
        )?),
        // Under the dashboard a launched command's output would draw over it.
        None if live && launching => {
            let c = process::launch::Captured::new();
            captured = Some(c.clone());
            process::launch::Output::Capture(c)
        }
        None if json_to_stdout => process::launch::Output::StdoutToStderr,
        None => process::launch::Output::Inherit,
    };
    let experimental = options::Experimental::from_env().map_err(Error::Usage)?;
    let opts = options::Options {
        target,
        extra_pids,
        cgroup,
        follow_children: !cli.no_children,
        bpf_stats: !cli.no_bpf_stats,
        duration: cli.duration,
        frequency_hz: cli.sample_freq,
        sampler: cli.sampler,
        command_output,
        run_as,
        alloc: experimental.alloc(alloc_settings(cli)),
        lock_mode: cli.lock_mode,
        export_stacks: cli.pprof.is_some() || cli.flamegraph.is_some() || cli.push.is_some(),
        push: cli.push.clone().map(|url| report::push::PushSettings {
            url,
            app: cli.app.clone(),
            every: cli.push_every,
        }),
        experimental,
    };
    let outputs = Outputs {
        json_to_stdout,
        json_file,
        profiles: report::export::ProfileFiles::open(
            cli.pprof.as_deref(),
            cli.flamegraph.as_deref(),
        )?,
        captured,
    };
    Ok((opts, outputs))
}

/// The allocator settings on the command line.
fn alloc_settings(cli: &cli::Cli) -> options::AllocSettings {
    options::AllocSettings {
        mode: cli.alloc_mode,
        large_threshold: cli.alloc_large_threshold,
        budget: cli.budget / 100.0,
        ..options::AllocSettings::default()
    }
}

/// Whether the JSON report goes to stdout (`--json -`), else its file,
/// created now.
fn json_output(cli: &cli::Cli) -> Result<(bool, Option<(std::fs::File, std::path::PathBuf)>)> {
    let to_stdout = cli.json.as_deref().is_some_and(|p| p.as_os_str() == "-");
    let file = match &cli.json {
        Some(path) if !to_stdout => Some((
            output::create(path, output::REPORT_MODE, "the JSON report")?,
            path.clone(),
        )),
        _ => None,
    };
    Ok((to_stdout, file))
}

/// Prints the summary and writes the JSON report.
fn write_report(report: &report::Report, outputs: Outputs) -> Result<()> {
    if outputs.json_to_stdout {
        // stdout carries the JSON alone, so it can be piped to a parser.
        eprint!("{}", report::text::render(report));
        println!("{}", report.to_json());
    } else {
        print!("{}", report::text::render(report));
    }
    if let Some((mut file, path)) = outputs.json_file {
        use std::io::Write as _;
        writeln!(file, "{}", report.to_json()).map_err(|source| Error::Output {
            what: "the JSON report",
            path: path.clone(),
            source,
        })?;
        eprintln!("memprof-ebpf: report written to {}", path.display());
    }
    outputs.profiles.write(report)?;
    Ok(())
}

fn announce(opts: &options::Options) {
    let what = match &opts.target {
        process::handle::TargetSpec::Pid(pid) => format!("pid {pid}"),
        process::handle::TargetSpec::Command(cmd) => format!("`{}`", cmd.join(" ")),
    };
    match opts.duration {
        Some(d) => eprintln!(
            "memprof-ebpf: tracing {what} for {}; Ctrl-C stops early and still prints the summary",
            humantime::format_duration(d)
        ),
        None => eprintln!("memprof-ebpf: tracing {what}; Ctrl-C stops and prints the summary"),
    }
}
