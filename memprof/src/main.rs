//! The `memprof-ebpf` command: parse arguments, run, map errors to exit
//! codes. Everything else is in the library.

use std::{io::IsTerminal, process::ExitCode};

use clap::Parser;
use memprof::{cli::Cli, error::exit_code, session::launch};

fn main() -> ExitCode {
    // Our own binary doubles as the gate that holds a launched command
    // until the probes are attached (see `session::launch`).
    if let Ok(fd) = std::env::var(launch::GATE_ENV) {
        launch::run_gate(&fd);
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
    let live = cli.duration.is_none() && !cli.no_tui && std::io::stdout().is_terminal();
    init_logging(&cli, live);

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
    match runtime.block_on(memprof::run(cli, live)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("memprof-ebpf: {e:#}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}

/// Logs go to stderr, or to a file while the dashboard owns the terminal.
fn init_logging(cli: &Cli, live: bool) {
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
    if live {
        match std::fs::File::create(&cli.log_file) {
            Ok(file) => builder
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(file))
                .init(),
            // Without a log file, stay quiet rather than draw over the dashboard.
            Err(_) => builder.with_writer(std::io::sink).init(),
        }
    } else {
        builder
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .init();
    }
}
