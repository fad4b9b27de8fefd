//! The `memprof-ebpf` command: parse arguments, run, map errors to exit
//! codes. Everything else is in the library.

use std::{io::IsTerminal, process::ExitCode};

use clap::Parser;
use memprof::{cli::Cli, error::exit_code, process::launch, tui::LogRing};

fn main() -> ExitCode {
    // Our own binary doubles as the gate that holds a launched command
    // until the probes are attached (see `process::launch`).
    if let Ok(fd) = std::env::var(launch::GATE_ENV) {
        launch::run_gate(&fd);
    }
    // And as the helper that times the target's allocator untraced.
    if std::env::var_os(memprof::features::alloc::untraced::LOOP_ENV).is_some() {
        memprof::features::alloc::timed_loop::run_loop();
    }

    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                Cli::USAGE_EXIT as u8
            } else {
                exit_code::OK as u8
            });
        }
    };
    // Parsers of the target's files may panic on malformed input; those
    // panics are caught and must stay silent.
    memprof::object::symbolize::install_quiet_panic_hook();
    let live = cli.duration.is_none() && !cli.no_tui && std::io::stdout().is_terminal();
    let log = match init_logging(&cli, live) {
        Ok(log) => log,
        Err(e) => {
            eprintln!("memprof-ebpf: {e:#}");
            return ExitCode::from(e.exit_code() as u8);
        }
    };

    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("memprof-ebpf: cannot start the runtime: {e}");
            return ExitCode::from(exit_code::INTERNAL as u8);
        }
    };
    let result = runtime.block_on(memprof::run(cli, live, log.clone()));
    // Whatever path the session took, no log line stays in memory.
    if let Some(log) = &log {
        log.release_to_stderr();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("memprof-ebpf: {e:#}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}

/// Logs go to `--log-file` when given; else to stderr, or, while the
/// dashboard owns the terminal, to memory (returned, to be shown after it).
fn init_logging(cli: &Cli, live: bool) -> memprof::Result<Option<LogRing>> {
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("MEMPROF_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("memprof={level},warn")));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    if let Some(path) = &cli.log_file {
        let file = memprof::output::create(path, memprof::output::LOG_MODE, "the log")?;
        builder
            .with_ansi(false)
            .with_writer(std::sync::Mutex::new(file))
            .init();
        Ok(None)
    } else if live {
        let ring = LogRing::new();
        builder.with_ansi(false).with_writer(ring.clone()).init();
        Ok(Some(ring))
    } else {
        builder
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .init();
        Ok(None)
    }
}
