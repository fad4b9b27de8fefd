//! memprof-ebpf: find memory-level performance bugs of multithreaded
//! programs (false sharing, slow or wasteful allocation, lock contention) in
//! a running process, with eBPF.
//!
//! The binary is a thin shell around [`run`]; tests drive the same code.
//!
//! Layout, in the order data flows:
//! - [`session`]: checks, target (attach or launch), probes, event loop;
//! - [`collect`]: kernel records → plain events (addresses resolved against
//!   the target's memory map);
//! - [`analysis`]: pure computations over those events;
//! - [`symbolize`]: addresses → functions, source lines, variables;
//! - [`report`]: the model and its text and JSON forms;
//! - [`tui`]: the live dashboard, rendering the same model.

pub mod analysis;
pub mod cli;
pub mod collect;
pub mod error;
pub mod report;
pub mod session;
pub mod symbolize;
pub mod tui;

use std::io::IsTerminal;

pub use error::{Error, Result};

/// Runs the command line: a session, then the summary and JSON output.
pub async fn run(cli: cli::Cli, live: bool) -> Result<()> {
    let target = match cli.pid {
        Some(pid) => session::TargetSpec::Pid(pid),
        None => session::TargetSpec::Command(cli.command.clone()),
    };
    let json_to_stdout = cli.json.as_deref().is_some_and(|p| p.as_os_str() == "-");
    let command_output = if live {
        // Under the dashboard a launched command's output would draw over it.
        let mut path = cli.log_file.clone().into_os_string();
        path.push(".command");
        session::launch::Output::File(path.into())
    } else if json_to_stdout {
        session::launch::Output::StdoutToStderr
    } else {
        session::launch::Output::Inherit
    };
    let opts = session::Options {
        target,
        duration: cli.duration,
        frequency_hz: cli.sample_freq,
        command_output,
        alloc: session::alloc::AllocSettings {
            mode: cli.alloc_mode,
            large_threshold: cli.alloc_large_threshold,
            budget: cli.budget / 100.0,
        },
        lock_mode: cli.lock_mode,
    };

    let mut dashboard = if live {
        let title = match &opts.target {
            session::TargetSpec::Pid(pid) => format!("pid {pid}"),
            session::TargetSpec::Command(cmd) => cmd.join(" "),
        };
        Some(
            tui::Dashboard::start(title)
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
    let (report, reason, detaching) = result?;
    tracing::info!("session ended: {reason:?}");

    if json_to_stdout {
        // stdout carries the JSON alone, so it can be piped to a parser.
        eprint!("{}", report::text::render(&report));
    } else {
        print!("{}", report::text::render(&report));
    }
    if let Some(path) = &cli.json {
        let json = report.to_json();
        if json_to_stdout {
            println!("{json}");
        } else {
            std::fs::write(path, json + "\n").map_err(|source| Error::Output {
                path: path.clone(),
                source,
            })?;
            eprintln!("memprof-ebpf: report written to {}", path.display());
        }
    }
    // No probe may outlive the tool: wait for the kernel to remove the last
    // ones (it takes about 0.2 s per allocator probe).
    if !detaching.is_empty() && std::io::stderr().is_terminal() {
        eprintln!(
            "memprof-ebpf: waiting for the kernel to remove {} probes…",
            detaching.len()
        );
    }
    detaching.wait();
    Ok(())
}

fn announce(opts: &session::Options) {
    let what = match &opts.target {
        session::TargetSpec::Pid(pid) => format!("pid {pid}"),
        session::TargetSpec::Command(cmd) => format!("`{}`", cmd.join(" ")),
    };
    match opts.duration {
        Some(d) => eprintln!(
            "memprof-ebpf: tracing {what} for {}; Ctrl-C stops early and still prints the summary",
            humantime::format_duration(d)
        ),
        None => eprintln!("memprof-ebpf: tracing {what}; Ctrl-C stops and prints the summary"),
    }
}
