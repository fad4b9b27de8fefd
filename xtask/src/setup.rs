//! Installs what the project needs on a bare Debian 12 machine, and checks
//! it quickly when it is already there.
//!
//! The eBPF crate needs `-Z build-std=core`, so a compiler with its library
//! source: Debian's `rustc-web` + `rust-web-src`, linked as the rustup
//! toolchain `memprof-bpf` that `memprof/build.rs` asks aya-build for. The
//! linker is `bpf-linker` built against Debian's LLVM 22.

use std::{path::Path, process::Command, time::Instant};

use anyhow::{bail, Context, Result};

/// Debian packages: the eBPF toolchain, and what the tests use.
const PACKAGES: &[&str] = &[
    "rustc-web",          // rustc 1.96 with LLVM 22, sysroot /usr
    "cargo-web",          // its cargo, so the linked toolchain is whole
    "rust-web-src",       // its library source, for -Z build-std=core
    "rust-web-clippy",    // clippy for that compiler, to lint the eBPF crate
    "llvm-22-dev",        // for bpf-linker
    "bpftool",            // tests check that no program is left loaded
    "bpftrace",           // the peer the benchmarks compare against
    "gcc",                // builds the C workloads
    "libc6-dev",          // including libc.a for the static-binary test
    "binutils",           // strip, for the stripped-binary test
    "tmux",               // drives the dashboard in its test
    "pbzip2",             // a real multithreaded program for the lock tests
    "sysbench",           // its mutex test: a third-party contended program
    "memcached",          // the lock benchmark attaches to it under load
    "libmemcached-tools", // memcaslap, the load for it
    "stress-ng",          // its cacheline stressor: third-party false sharing
    "redis-server",       // a third-party jemalloc program, with its own
    "redis-tools",        // count of its memory (INFO memory)
    "util-linux",         // setpriv, for the unprivileged-run test
    "libjemalloc2",       // allocators the allocator tests preload
    "libtcmalloc-minimal4",
    "libmimalloc2.0",
    "debuginfod", // a local debuginfod server for the debug-file test
    "golang-go",  // `go tool pprof`, the consumer the pprof export is tested with
];
const BPF_LINKER_VERSION: &str = "0.13.0";
const TOOLCHAIN: &str = "memprof-bpf";
const TOOLCHAIN_DIR: &str = "/usr/local/lib/memprof-ebpf/bpf-toolchain";
const LLVM_BIN: &str = "/usr/lib/llvm-22/bin";
/// Debian's binaries (from rustc-web, cargo-web and rust-web-clippy) that
/// make up the linked toolchain. With all four linked, rustup never falls
/// back to another toolchain's cargo for `rustup run memprof-bpf cargo`.
const TOOLS: [&str; 4] = ["rustc", "cargo", "cargo-clippy", "clippy-driver"];

/// What one set-up step found.
enum Step {
    /// Already in place: nothing was done.
    Present(String),
    /// Installed or repaired now.
    Done(String),
}

/// One set-up step: checks, and installs what is missing.
type StepFn = fn() -> Result<Step>;

/// Installs what is missing, printing one line per step (done or skipped)
/// and the total time, so a first run on a bare machine shows its progress.
pub fn ensure() -> Result<()> {
    let start = Instant::now();
    let steps: [(&str, StepFn); 3] = [
        ("Debian packages", ensure_packages),
        ("bpf-linker", ensure_bpf_linker),
        ("eBPF toolchain", ensure_toolchain),
    ];
    let mut did = 0;
    for (name, step) in steps {
        let t = Instant::now();
        match step().with_context(|| format!("setup step `{name}`"))? {
            Step::Present(what) => eprintln!("setup: {name}: present ({what}), skipped"),
            Step::Done(what) => {
                did += 1;
                eprintln!(
                    "setup: {name}: {what} in {:.1} s",
                    t.elapsed().as_secs_f64()
                );
            }
        }
    }
    eprintln!(
        "setup: {did} step(s) done, {} skipped, {:.1} s in all",
        steps.len() - did,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

fn missing_packages() -> Vec<&'static str> {
    PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            let out = Command::new("dpkg-query").args(["-W", "-f=${Status}", p]).output();
            !matches!(out, Ok(o) if String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect()
}

fn ensure_packages() -> Result<Step> {
    let missing = missing_packages();
    if missing.is_empty() {
        return Ok(Step::Present(format!("{} packages", PACKAGES.len())));
    }
    eprintln!("setup: installing Debian packages: {}", missing.join(" "));
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "these packages are missing and installing them needs root: {}",
            missing.join(" ")
        );
    }
    const UNREACHABLE: &str = "apt-get failed; check that Debian's package registry is \
                               reachable (`apt-get update`) and run the command again";
    run(Command::new("apt-get").args(["update", "-qq"])).context(UNREACHABLE)?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
    .context(UNREACHABLE)?;
    Ok(Step::Done(format!("installed {}", missing.join(" "))))
}

fn ensure_bpf_linker() -> Result<Step> {
    let have = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION))
        .unwrap_or(false);
    if have {
        return Ok(Step::Present(format!("version {BPF_LINKER_VERSION}")));
    }
    eprintln!("setup: building bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (about a minute)");
    let path = format!("{LLVM_BIN}:{}", std::env::var("PATH").unwrap_or_default());
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(cargo)
        .args([
            "install",
            "bpf-linker",
            "--locked",
            "--version",
            BPF_LINKER_VERSION,
        ])
        .args(["--no-default-features", "--features", "llvm-22"])
        .env("PATH", path))?;
    Ok(Step::Done(format!(
        "built version {BPF_LINKER_VERSION} against LLVM 22"
    )))
}

fn ensure_toolchain() -> Result<Step> {
    // rustup's toolchain link is per user, the links are files; either may
    // be missing (e.g. set up by root, then built by another user).
    let works = Command::new("rustup")
        .args(["run", TOOLCHAIN, "rustc", "--print", "sysroot"])
        .output()
        .map(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "/usr")
        .unwrap_or(false);
    let dir = Path::new(TOOLCHAIN_DIR);
    let complete = TOOLS.iter().all(|t| dir.join("bin").join(t).exists());
    if works && complete {
        return Ok(Step::Present(format!("rustup toolchain `{TOOLCHAIN}`")));
    }
    let mut did = Vec::new();
    if !complete {
        std::fs::create_dir_all(dir.join("bin")).context("creating the toolchain directory")?;
        std::fs::create_dir_all(dir.join("lib"))?;
        for tool in TOOLS {
            let target = Path::new("/usr/bin").join(tool);
            if !target.exists() {
                bail!(
                    "{} is missing although its Debian package is installed",
                    target.display()
                );
            }
            let link = dir.join("bin").join(tool);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&target, &link)
                .with_context(|| format!("linking {}", link.display()))?;
        }
        did.push(format!(
            "linked Debian's rustc-web tools into {TOOLCHAIN_DIR}"
        ));
    }
    if !works {
        run(Command::new("rustup").args(["toolchain", "link", TOOLCHAIN, TOOLCHAIN_DIR]))?;
        did.push(format!("registered it as rustup toolchain `{TOOLCHAIN}`"));
    }
    Ok(Step::Done(did.join("; ")))
}

/// A command run with the eBPF toolchain (for linting the eBPF crate the
/// way `memprof/build.rs` builds it).
pub fn bpf_cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", TOOLCHAIN, "cargo"])
        .args(args)
        .args([
            "--release",
            "-Z",
            "build-std=core",
            "--target",
            "bpfel-unknown-none",
        ])
        .env("RUSTC_BOOTSTRAP", "1")
        .env(
            "PATH",
            format!("{LLVM_BIN}:{}", std::env::var("PATH").unwrap_or_default()),
        )
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER");
    cmd
}

pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}
