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
    "rustc-web",       // rustc 1.96 with LLVM 22, sysroot /usr
    "rust-web-src",    // its library source, for -Z build-std=core
    "rust-web-clippy", // clippy for that compiler, to lint the eBPF crate
    "llvm-22-dev",     // for bpf-linker
    "bpftool",         // tests check that no program is left loaded
    "bpftrace",        // the peer the benchmarks compare against
    "gcc",             // builds the C workloads
    "libc6-dev",       // including libc.a for the static-binary test
    "binutils",        // strip, for the stripped-binary test
    "tmux",            // drives the dashboard in its test
    "pbzip2",          // a real multithreaded program for the lock tests
    "util-linux",      // setpriv, for the unprivileged-run test
    "libjemalloc2",    // allocators the allocator tests preload
    "libtcmalloc-minimal4",
    "libmimalloc2.0",
];
const BPF_LINKER_VERSION: &str = "0.13.0";
const TOOLCHAIN: &str = "memprof-bpf";
const TOOLCHAIN_DIR: &str = "/usr/local/lib/memprof-ebpf/bpf-toolchain";
const LLVM_BIN: &str = "/usr/lib/llvm-22/bin";
/// Debian's binaries that make up the linked toolchain.
const TOOLS: [&str; 4] = ["rustc", "cargo", "cargo-clippy", "clippy-driver"];

/// What one set-up step found.
enum Step {
    /// Already in place: nothing was done.
    Present(String),
    /// Installed or repaired now.
    Done(String),
}

/// Installs what is missing, printing one line per step (done or skipped)
/// and the total time, so a first run on a bare machine shows its progress.
pub fn ensure() -> Result<()> {
    let start = Instant::now();
    let steps: [(&str, fn() -> Result<Step>); 3] = [
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
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
    .context(
        "apt-get could not install the packages; check that Debian's package \
         registry is reachable (`apt-get update`) and retry",
    )?;
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
    eprintln!("setup: linking Debian's rustc-web as the rustup toolchain `{TOOLCHAIN}`");
    std::fs::create_dir_all(dir.join("bin")).context("creating the toolchain directory")?;
    std::fs::create_dir_all(dir.join("lib"))?;
    for tool in TOOLS {
        let link = dir.join("bin").join(tool);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(format!("/usr/bin/{tool}"), &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    run(Command::new("rustup").args(["toolchain", "link", TOOLCHAIN, TOOLCHAIN_DIR]))?;
    Ok(Step::Done(format!(
        "linked Debian's rustc-web as rustup toolchain `{TOOLCHAIN}`"
    )))
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
